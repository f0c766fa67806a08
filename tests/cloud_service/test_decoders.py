"""Batched JPEG decoders: per-item errors, thread-pool overlap, config factory, GPU paths.

CPU decoders run everywhere. torchvision's decoder also runs on the CPU (`device="cpu"`), which
exercises its batch/one-by-one error handling here; the NVJPEG and GPU letterbox tests need a
CUDA GPU and are skipped without one.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from typing import Any

import numpy as np
import pytest

from cloud_service.config import DecoderConfig
from cloud_service.decoders import (
    BgrImage,
    CpuDecoder,
    DecodeError,
    ImageCodec,
    JpegLimits,
    OpenCvCodec,
    SimpleJpegCodec,
    create_codec,
    create_decoder,
)
from detection.errors import RuntimeUnavailableError
from tests.fixtures.grpc_server import make_jpeg

GOOD = make_jpeg(160, 120)
SMALL = make_jpeg(32, 24, seed=1)
_MIDDLE = len(GOOD) // 2
_SOF = GOOD.find(b"\xff\xc0")
# Passes the header checks, fails in the codec: garbage inside the scan data ...
CORRUPT_SCAN = GOOD[:_MIDDLE] + bytes(range(256)) + GOOD[_MIDDLE + 256 :]
# ... and an impossible chroma sampling factor in the start-of-frame segment.
BAD_SAMPLING = GOOD[: _SOF + 11] + b"\x00" + GOOD[_SOF + 12 :]
LIMITS = JpegLimits(max_jpeg_bytes=len(GOOD) + 1024, max_image_pixels=160 * 120)
OVERSIZED_BYTES = GOOD + bytes(2048)  # under the pixel limit, over the byte limit
OVERSIZED_PIXELS = make_jpeg(161, 120)

HAS_TURBOJPEG = importlib.util.find_spec("turbojpeg") is not None
HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None
HAS_NVIMGCODEC = importlib.util.find_spec("nvidia.nvimgcodec") is not None


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


HAS_CUDA = _cuda_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")

BATCH: list[tuple[str, bytes, str | None]] = [
    ("good", GOOD, None),
    ("corrupt-scan", CORRUPT_SCAN, "cannot decode JPEG"),
    ("bad-sampling", BAD_SAMPLING, "cannot decode JPEG"),
    ("truncated", GOOD[: len(GOOD) // 2], "truncated JPEG"),
    ("oversized-bytes", OVERSIZED_BYTES, "max_jpeg_bytes"),
    ("oversized-pixels", OVERSIZED_PIXELS, "max_image_pixels"),
    ("png", b"\x89PNG\r\n\x1a\n" + bytes(64), "not a JPEG"),
    ("empty", b"", "not a JPEG"),
    ("small", SMALL, None),
]


def _codecs() -> list[Any]:
    params: list[Any] = [pytest.param("simplejpeg", id="simplejpeg")]
    params.append(
        pytest.param(
            "turbojpeg",
            id="turbojpeg",
            marks=pytest.mark.skipif(not HAS_TURBOJPEG, reason="PyTurboJPEG not installed"),
        )
    )
    params.append(pytest.param("opencv", id="opencv"))
    return params


def _check_batch(results: list[BgrImage | DecodeError], lenient_scan: bool = False) -> None:
    """Each result as `BATCH` expects; `lenient_scan`: a corrupt scan may decode (concealed)."""
    assert len(results) == len(BATCH)
    for (name, payload, expected), result in zip(BATCH, results, strict=True):
        if lenient_scan and name == "corrupt-scan" and isinstance(result, np.ndarray):
            assert result.shape == (120, 160, 3), name
        elif expected is None:
            assert isinstance(result, np.ndarray), f"{name}: {result}"
            size = (120, 160, 3) if payload is not SMALL else (24, 32, 3)
            assert result.shape == size and result.dtype == np.uint8, name
        else:
            assert isinstance(result, DecodeError), f"{name}: decoded {type(result)}"
            assert expected in str(result), f"{name}: {result}"


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("codec_name", _codecs())
def test_cpu_decoder_gives_one_result_per_payload(codec_name: Any, threads: int) -> None:
    decoder = CpuDecoder(create_codec(codec_name), limits=LIMITS, threads=threads)
    try:
        results = decoder.decode_batch([payload for _, payload, _ in BATCH])
    finally:
        decoder.close()

    _check_batch(results, lenient_scan=codec_name == "opencv")  # imdecode conceals bad scans


def test_codecs_agree_on_good_images() -> None:
    reference = SimpleJpegCodec().decode(GOOD)
    names = ["opencv", *(["turbojpeg"] if HAS_TURBOJPEG else [])]
    for name in names:
        image = create_codec(name).decode(GOOD)  # type: ignore[arg-type]
        assert np.abs(image.astype(int) - reference.astype(int)).mean() < 2.0, name


def test_threads_give_the_same_images_as_one() -> None:
    payloads = [make_jpeg(96, 64, seed=seed) for seed in range(12)]
    serial = CpuDecoder(threads=1).decode_batch(payloads)
    pooled = CpuDecoder(threads=2)
    try:
        parallel = pooled.decode_batch(payloads)
    finally:
        pooled.close()

    for one, other in zip(serial, parallel, strict=True):
        assert isinstance(one, np.ndarray) and isinstance(other, np.ndarray)
        np.testing.assert_array_equal(one, other)


class SlowCodec:
    """Takes `delay_s` per image (sleeping, like a codec that releases the GIL)."""

    name = "slow"

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def decode(self, data: bytes) -> BgrImage:
        with self._lock:
            self.threads.add(threading.current_thread().name)
        time.sleep(self.delay_s)
        return SimpleJpegCodec().decode(data)


def test_pool_decodes_in_parallel_and_overlaps_the_caller() -> None:
    delay_s, images, threads = 0.05, 8, 4
    codec = SlowCodec(delay_s)
    decoder = CpuDecoder(codec, threads=threads)
    try:
        started = time.perf_counter()
        job = decoder.submit([SMALL] * images)
        submitted_s = time.perf_counter() - started
        time.sleep(delay_s * 2)  # the caller runs inference meanwhile
        results = job.result(timeout_s=5.0)
        elapsed_s = time.perf_counter() - started
    finally:
        decoder.close()

    serial_s = delay_s * images
    assert submitted_s < delay_s, "submit must not wait for the decoding"
    assert elapsed_s < serial_s * 0.75, f"{elapsed_s:.3f}s: no overlap (serial {serial_s:.3f}s)"
    assert len(codec.threads) == threads
    assert all(isinstance(r, np.ndarray) and r.shape == (24, 32, 3) for r in results)


def test_waiting_for_a_job_times_out() -> None:
    decoder = CpuDecoder(SlowCodec(0.3), threads=2)
    job = decoder.submit([SMALL, SMALL, SMALL])

    with pytest.raises(TimeoutError):
        job.result(timeout_s=0.05)
    assert len(job.result(timeout_s=5.0)) == 3
    decoder.close()


class FailingCodec:
    """Raises an unexpected error type on one payload."""

    name = "failing"

    def decode(self, data: bytes) -> BgrImage:
        if data == SMALL:
            raise RuntimeError("codec bug")
        return SimpleJpegCodec().decode(data)


def test_an_unexpected_codec_error_stays_with_its_payload(caplog: pytest.LogCaptureFixture) -> None:
    codec: ImageCodec = FailingCodec()
    with caplog.at_level(logging.WARNING):
        results = CpuDecoder(codec).decode_batch([GOOD, SMALL, GOOD])

    assert isinstance(results[0], np.ndarray) and isinstance(results[2], np.ndarray)
    assert isinstance(results[1], DecodeError) and "RuntimeError: codec bug" in str(results[1])
    assert "cpu/failing failed" in caplog.text


def test_cpu_decoder_validates_threads() -> None:
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        CpuDecoder(OpenCvCodec(), threads=0)


def test_create_decoder_cpu_from_config() -> None:
    config = DecoderConfig(threads=3, cpu_codec="opencv", max_jpeg_bytes=2048)
    decoder = create_decoder(config)
    try:
        assert isinstance(decoder, CpuDecoder)
        assert (decoder.name, decoder.threads) == ("cpu/opencv", 3)
        assert decoder.limits == JpegLimits(max_jpeg_bytes=2048)
    finally:
        decoder.close()


def test_default_config_decodes_with_simplejpeg() -> None:
    decoder = create_decoder(DecoderConfig())

    assert decoder.name == "cpu/simplejpeg"
    decoder.close()


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA GPU is present")
def test_nvjpeg_without_a_gpu_falls_back_to_cpu_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        decoder = create_decoder(DecoderConfig(type="nvjpeg"))

    assert decoder.name == "cpu/simplejpeg"
    assert "NVJPEG decoder unavailable" in caplog.text
    assert "decoding JPEG on the CPU" in caplog.text
    decoder.close()


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA GPU is present")
def test_nvjpeg_without_a_gpu_and_no_fallback_fails_clearly() -> None:
    with pytest.raises(RuntimeUnavailableError, match="no GPU JPEG decoder available"):
        create_decoder(DecoderConfig(type="nvjpeg", fallback_to_cpu=False))


@pytest.mark.skipif(not HAS_TORCHVISION, reason="torchvision not installed")
def test_torchvision_decoder_on_cpu_isolates_bad_payloads() -> None:
    from cloud_service.decoders.nvjpeg import TorchvisionNvjpegDecoder

    decoder = TorchvisionNvjpegDecoder(limits=LIMITS, device="cpu")
    try:
        results = decoder.decode_batch([payload for _, payload, _ in BATCH])
    finally:
        decoder.close()

    _check_batch(results, lenient_scan=True)  # libjpeg only warns about corrupt scan data
    reference = SimpleJpegCodec().decode(GOOD)
    first = results[0]
    assert isinstance(first, np.ndarray)
    assert np.abs(first.astype(int) - reference.astype(int)).mean() < 2.0


@pytest.mark.skipif(HAS_CUDA or not HAS_TORCHVISION, reason="needs torchvision and no GPU")
def test_torchvision_nvjpeg_says_no_cuda_gpu() -> None:
    from cloud_service.decoders.nvjpeg import TorchvisionNvjpegDecoder

    with pytest.raises(RuntimeUnavailableError, match="no CUDA GPU"):
        TorchvisionNvjpegDecoder()


@pytest.mark.skipif(not HAS_NVIMGCODEC, reason="nvImageCodec not installed")
def test_nvimgcodec_cpu_backend_isolates_bad_payloads() -> None:
    from cloud_service.decoders.nvimgcodec import NvImageCodecDecoder

    decoder = NvImageCodecDecoder(limits=LIMITS, backend_kinds=("CPU_ONLY",))
    try:
        results = decoder.decode_batch([payload for _, payload, _ in BATCH])
        as_tensors = decoder.decode_batch_device([GOOD, BAD_SAMPLING])
    finally:
        decoder.close()

    _check_batch(results, lenient_scan=True)
    reference = SimpleJpegCodec().decode(GOOD)
    first = results[0]
    assert isinstance(first, np.ndarray)
    assert np.abs(first.astype(int) - reference.astype(int)).mean() < 2.0
    assert tuple(as_tensors[0].shape) == (3, 120, 160)
    assert isinstance(as_tensors[1], DecodeError)


# --- GPU letterbox (torch ops; checked on CPU tensors here, on the GPU where there is one) ---

LETTERBOX_CASES = [((720, 1280), (640, 640)), ((1080, 810), (640, 640)), ((120, 160), (320, 256))]


def _smooth_bgr(height: int, width: int) -> BgrImage:
    """A smooth image: resampling filters differ least on it, so values can be compared."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    planes = [x / width * 255, y / height * 255, (x + y) / (width + height) * 255]
    return np.stack(planes, axis=-1).round().astype(np.uint8)


def _letterbox_against_cpu(device: str, source: tuple[int, int], target: tuple[int, int]) -> None:
    import torch

    from cloud_service.gpu_preprocess import letterbox_batch_gpu, to_host
    from detection.letterbox import letterbox_batch

    image = _smooth_bgr(*source)
    tensor = torch.from_numpy(image[:, :, ::-1].copy()).permute(2, 0, 1).to(device)
    expected, expected_infos = letterbox_batch([image], target)

    batch, infos = letterbox_batch_gpu([tensor], target)

    assert infos == expected_infos
    assert batch.device.type == torch.device(device).type
    actual = to_host(batch)
    assert actual.shape == expected.shape == (1, 3, *target)
    assert np.abs(actual - expected).mean() < 1.5 / 255  # bilinear vs OpenCV's filters


@pytest.mark.skipif(not HAS_TORCHVISION, reason="torch not installed")
@pytest.mark.parametrize(("source", "target"), LETTERBOX_CASES)
def test_gpu_letterbox_matches_cpu_letterbox_on_cpu_tensors(
    source: tuple[int, int], target: tuple[int, int]
) -> None:
    _letterbox_against_cpu("cpu", source, target)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("source", "target"), LETTERBOX_CASES)
def test_gpu_letterbox_matches_cpu_letterbox_on_the_gpu(
    source: tuple[int, int], target: tuple[int, int]
) -> None:  # pragma: no cover - needs a CUDA GPU
    _letterbox_against_cpu("cuda", source, target)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backend", ["torchvision", "nvimgcodec"])
def test_nvjpeg_decoders_isolate_bad_payloads(backend: str) -> None:  # pragma: no cover - GPU
    if backend == "nvimgcodec" and importlib.util.find_spec("nvidia.nvimgcodec") is None:
        pytest.skip("nvImageCodec not installed")
    from cloud_service.decoders.factory import create_gpu_decoder

    decoder = create_gpu_decoder(backend, limits=LIMITS)  # type: ignore[arg-type]
    try:
        results = decoder.decode_batch([payload for _, payload, _ in BATCH])
        on_device = decoder.decode_batch_device([GOOD, b"not a jpeg"])
    finally:
        decoder.close()

    _check_batch(results, lenient_scan=True)
    assert on_device[0].is_cuda and tuple(on_device[0].shape) == (3, 120, 160)
    assert isinstance(on_device[1], DecodeError)
