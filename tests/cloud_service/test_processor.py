"""`DetectorFrameProcessor`: per-frame errors, deadlines, regions and scaling, detector failures."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import pytest

from cloud_service.convert import status_code_from_proto
from cloud_service.decoders import CpuDecoder, DecodeResult, JpegLimits
from cloud_service.processor import DetectorFrameProcessor, accepts_scale_up
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from detection.runtimes.base import InputSpec
from detection.runtimes.config import OnnxRuntimeConfig
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.timestamps import timestamp_from_seconds
from tests.fixtures.grpc_server import (
    FAKE_MODEL,
    FakeDetector,
    ServerFactory,
    make_jpeg,
    make_request,
)

GOOD = make_jpeg(160, 120)
BAD_PAYLOADS = {
    "corrupt": GOOD[:300] + bytes(range(256)) * 4 + GOOD[300 + 1024 :],
    "truncated": GOOD[: len(GOOD) // 2],
    "png": b"\x89PNG\r\n\x1a\n" + bytes(64),
    "text": b"hello, not an image",
}
RPC_TIMEOUT_S = 10.0


def _code(result: pb.FrameResult) -> grpc.StatusCode:
    return status_code_from_proto(result.status)


def test_bad_jpegs_fail_alone_in_a_batch() -> None:
    detector = FakeDetector()
    processor = DetectorFrameProcessor(detector, FAKE_MODEL)
    payloads = [GOOD, *BAD_PAYLOADS.values(), GOOD]
    requests = [make_request("cam", i, jpeg=p) for i, p in enumerate(payloads)]

    results = processor.process(requests)

    assert [r.frame_id for r in results] == list(range(len(payloads)))
    codes = [_code(r) for r in results]
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert codes == [grpc.StatusCode.OK, *[invalid] * len(BAD_PAYLOADS), grpc.StatusCode.OK]
    assert "truncated" in results[2].status.message
    assert "not a JPEG" in results[3].status.message
    assert all(not r.detections for r in results[1:-1])
    assert len(results[0].detections) == len(results[-1].detections) == 2
    assert detector.calls == [[(120, 160, 3), (120, 160, 3)]]


def test_bad_jpegs_through_the_stream(grpc_server_factory: ServerFactory) -> None:
    running = grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL))
    payloads = {"good-1": GOOD, **BAD_PAYLOADS, "good-2": GOOD}
    requests = [make_request(name, 1, jpeg=jpeg) for name, jpeg in payloads.items()]

    results = list(running.stub.StreamFrames(iter(requests), timeout=RPC_TIMEOUT_S))

    codes = {r.camera_id: _code(r) for r in results}
    assert len(results) == len(requests)
    assert codes == {
        name: grpc.StatusCode.OK if name.startswith("good") else grpc.StatusCode.INVALID_ARGUMENT
        for name in payloads
    }


def test_past_deadline_frames_skip_the_detector() -> None:
    now = 1_800_000_000.0
    detector = FakeDetector()
    processor = DetectorFrameProcessor(detector, FAKE_MODEL, clock=lambda: now)
    late = make_request("cam", 1, deadline=timestamp_from_seconds(now - 0.001))
    on_time = make_request("cam", 2, deadline=timestamp_from_seconds(now + 1.0))
    no_deadline = make_request("cam", 3)

    results = processor.process([late, on_time, no_deadline])

    assert [_code(r) for r in results] == [
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.OK,
        grpc.StatusCode.OK,
    ]
    assert not results[0].detections
    assert detector.images_seen == 2


def test_only_past_deadline_frames_never_call_the_detector(
    grpc_server_factory: ServerFactory,
) -> None:
    detector = FakeDetector()
    running = grpc_server_factory(DetectorFrameProcessor(detector, FAKE_MODEL))
    deadline = timestamp_from_seconds(time.time() - 5.0)
    requests = [make_request("cam", i, deadline=deadline) for i in range(5)]

    unary = running.stub.DetectFrame(make_request("cam", 99, deadline=deadline))
    streamed = list(running.stub.StreamFrames(iter(requests), timeout=RPC_TIMEOUT_S))

    assert {_code(r) for r in [unary, *streamed]} == {grpc.StatusCode.DEADLINE_EXCEEDED}
    assert len(streamed) == 5
    assert detector.calls == []


def test_regions_map_back_to_source_pixels() -> None:
    processor = DetectorFrameProcessor(FakeDetector(), FAKE_MODEL)
    # A 200x100 source region sent as a 100x50 crop: scale 2, offset (400, 300).
    region = pb.Region(x1=400, y1=300, x2=600, y2=400, jpeg=make_jpeg(100, 50))
    request = make_request(
        "cam", 1, jpeg=b"", original_width=1280, original_height=720, regions=[region]
    )

    (result,) = processor.process([request])

    assert _code(result) == grpc.StatusCode.OK, result.status.message
    first, second = result.detections
    assert (first.x1, first.y1, first.x2, first.y2) == (420.0, 340.0, 500.0, 460.0)
    assert (second.x1, second.y1, second.x2, second.y2) == (400.0, 300.0, 460.0, 360.0)
    assert first.region_index == 0 and second.HasField("region_index")


def test_boxes_are_clipped_to_the_source_frame() -> None:
    detector = FakeDetector(boxes=((-5.0, -5.0, 500.0, 500.0),), scores=(0.5,), class_ids=(7,))
    processor = DetectorFrameProcessor(detector, FAKE_MODEL)

    (result,) = processor.process([make_request(jpeg=make_jpeg(160, 120))])

    (box,) = result.detections
    assert (box.x1, box.y1, box.x2, box.y2) == (0.0, 0.0, 160.0, 120.0)
    assert box.class_id == 7 and box.class_name == ""


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"jpeg": b""}, "none of jpeg, video and regions"),
        ({"regions": [pb.Region(x1=10, y1=10, x2=5, y2=20, jpeg=GOOD)]}, "x2 > x1"),
        ({"regions": [pb.Region(x1=0, y1=0, x2=5, y2=5)]}, "regions[0]: jpeg is empty"),
        ({"regions": [pb.Region(x1=-1, y1=0, x2=5, y2=5, jpeg=GOOD)]}, "invalid"),
        ({"regions": [pb.Region(x1=0, y1=0, x2=5, y2=5, jpeg=b"x")]}, "regions[0].jpeg: not a"),
    ],
)
def test_invalid_requests(request_fields: dict[str, object], message: str) -> None:
    detector = FakeDetector()
    processor = DetectorFrameProcessor(detector, FAKE_MODEL)
    fields = {"jpeg": b"", **request_fields}

    (result,) = processor.process([make_request(**fields)])  # type: ignore[arg-type]

    assert _code(result) == grpc.StatusCode.INVALID_ARGUMENT
    assert message in result.status.message
    assert detector.calls == []


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (JpegLimits(max_jpeg_bytes=len(GOOD) - 1), "max_jpeg_bytes"),
        (JpegLimits(max_image_pixels=160 * 120 - 1), "max_image_pixels"),
    ],
)
def test_limits_reject_big_frames(limits: JpegLimits, message: str) -> None:
    processor = DetectorFrameProcessor(FakeDetector(), FAKE_MODEL, limits=limits)

    (result,) = processor.process([make_request(jpeg=GOOD)])

    assert _code(result) == grpc.StatusCode.INVALID_ARGUMENT
    assert message in result.status.message


class _BrokenDetector:
    def __init__(self, extra: bool) -> None:
        self.extra = extra

    def detect(self, images: Sequence[npt.NDArray[np.uint8]]) -> list[Detections]:
        if self.extra:
            return [Detections.empty()] * (len(images) + 1)
        raise RuntimeError("GPU fell off")


@pytest.mark.parametrize("extra", [False, True])
def test_detector_failure_is_internal_for_the_detected_frames(extra: bool) -> None:
    processor = DetectorFrameProcessor(_BrokenDetector(extra), FAKE_MODEL)

    results = processor.process([make_request(frame_id=1), make_request(frame_id=2, jpeg=b"x")])

    assert [_code(r) for r in results] == [
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.INVALID_ARGUMENT,
    ]


class CountingDecoder(CpuDecoder):
    """A two-thread CPU decoder that records the size of each batch it is given."""

    def __init__(self) -> None:
        super().__init__(threads=2)
        self.batches: list[int] = []

    def decode_batch(self, payloads: Sequence[bytes]) -> list[DecodeResult]:
        self.batches.append(len(payloads))
        return super().decode_batch(payloads)


def test_all_jpegs_of_a_batch_go_to_the_decoder_at_once() -> None:
    decoder = CountingDecoder()
    processor = DetectorFrameProcessor(FakeDetector(), FAKE_MODEL, decoder=decoder)
    region = pb.Region(x1=0, y1=0, x2=10, y2=10, jpeg=GOOD)
    bad_region = pb.Region(x1=0, y1=0, x2=10, y2=10, jpeg=b"junk")
    requests = [
        make_request("cam", 1, jpeg=GOOD),
        make_request("cam", 2, jpeg=GOOD, regions=[region, bad_region]),
        make_request("cam", 3, jpeg=b"", regions=[region]),
    ]

    results = processor.process(requests)
    decoder.close()

    assert decoder.batches == [5]
    ok, invalid = grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT
    assert [_code(r) for r in results] == [ok, invalid, ok]
    assert results[1].status.message.startswith("regions[1].jpeg: not a JPEG")
    assert results[0].timings.decode_time_ms == results[2].timings.decode_time_ms > 0


def test_prepare_decodes_without_the_detector_and_finish_detects() -> None:
    detector = FakeDetector()
    processor = DetectorFrameProcessor(detector, FAKE_MODEL)
    requests = [make_request("cam", 1, jpeg=GOOD), make_request("cam", 2, jpeg=b"junk")]

    batch = processor.prepare(requests)
    assert detector.calls == [] and sorted(batch.frames) == [0]
    results = processor.finish(batch)

    assert detector.calls == [[(120, 160, 3)]]
    assert [_code(r) for r in results] == [grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT]


# --- regions at native scale ------------------------------------------------------------------

MODEL_INPUT = 640
# The model answers one box at the input centre: x 300..340, y 310..330 in input pixels.
CENTRE_ROW = [320.0, 320.0, 40.0, 20.0, 0.9, 0.0]


class CentreBoxRuntime:
    """A 640x640 `Runtime` that finds one box at the input centre and records its batches."""

    name = "centre-box"

    def __init__(self) -> None:
        self.inputs: list[np.ndarray[Any, np.dtype[np.float32]]] = []

    @property
    def input_spec(self) -> InputSpec:
        return InputSpec(MODEL_INPUT, MODEL_INPUT, "NCHW", None)

    def infer(self, images: np.ndarray[Any, np.dtype[np.float32]]) -> Any:
        self.inputs.append(images.copy())
        rows = np.asarray([CENTRE_ROW], np.float32)
        return np.repeat(rows.T[None], images.shape[0], axis=0)  # (B, 4+C, N)

    def close(self) -> None:
        pass


class RecordingDetector:
    """A real `Detector` on `CentreBoxRuntime` that records the `scale_up` flags of each call."""

    def __init__(self) -> None:
        self.runtime = CentreBoxRuntime()
        config = DetectorConfig(
            runtime=OnnxRuntimeConfig(model_path=Path("unused.onnx")), class_names=["a", "b"]
        )
        self.detector = Detector(self.runtime, config)
        self.flags: list[list[bool]] = []

    def detect(
        self, images: Sequence[npt.NDArray[np.uint8]], *, scale_up: bool | Sequence[bool] = True
    ) -> list[Detections]:
        self.flags.append([scale_up] * len(images) if isinstance(scale_up, bool) else [*scale_up])
        return self.detector.detect(images, scale_up=scale_up)


class KeepingDecoder(CpuDecoder):
    """A CPU decoder that keeps what it decoded (to compare with what the model was given)."""

    def __init__(self) -> None:
        super().__init__()
        self.decoded: list[DecodeResult] = []

    def decode_batch(self, payloads: Sequence[bytes]) -> list[DecodeResult]:
        results = super().decode_batch(payloads)
        self.decoded.extend(results)
        return results


def _box(detection: pb.Detection) -> tuple[float, float, float, float]:
    return (detection.x1, detection.y1, detection.x2, detection.y2)


@pytest.mark.parametrize(
    ("region_xyxy", "expected_region_box"),
    [
        # a 100x50 crop of a 100x50 region: centred at scale 1 (pad 270, 295), box 30..70 x 15..35
        ((400, 300, 500, 350), (430.0, 315.0, 470.0, 335.0)),
        # the same crop standing for a 200x100 region (sent downscaled): x2 back to the source
        ((400, 300, 600, 400), (460.0, 330.0, 540.0, 370.0)),
    ],
    ids=["native-crop", "downscaled-crop"],
)
def test_regions_run_at_native_scale_and_whole_frames_as_before(
    region_xyxy: tuple[int, int, int, int], expected_region_box: tuple[float, ...]
) -> None:
    detector = RecordingDetector()
    decoder = KeepingDecoder()
    processor = DetectorFrameProcessor(detector, FAKE_MODEL, decoder=decoder)
    x1, y1, x2, y2 = region_xyxy
    region = pb.Region(x1=x1, y1=y1, x2=x2, y2=y2, jpeg=make_jpeg(100, 50, seed=3))
    # a 320x180 whole frame of a 1280x720 source, plus the region crop, in one request
    request = make_request(
        "cam",
        1,
        jpeg=make_jpeg(320, 180),
        original_width=1280,
        original_height=720,
        regions=[region],
    )

    (result,) = processor.process([request])
    decoder.close()

    assert _code(result) == grpc.StatusCode.OK, result.status.message
    assert detector.flags == [[True, False]]  # whole frame may be enlarged, the crop may not
    (batch,) = detector.runtime.inputs  # both images in one engine batch
    assert batch.shape == (2, 3, MODEL_INPUT, MODEL_INPUT)
    frame_image, crop_image = decoder.decoded
    assert isinstance(crop_image, np.ndarray) and isinstance(frame_image, np.ndarray)
    # the crop sits unscaled in the middle of the grey canvas
    placed = batch[1][:, 295:345, 270:370]
    expected = crop_image[:, :, ::-1].transpose(2, 0, 1) / np.float32(255)
    np.testing.assert_allclose(placed, expected, atol=1e-6)
    outside = np.ones((MODEL_INPUT, MODEL_INPUT), dtype=bool)
    outside[295:345, 270:370] = False
    np.testing.assert_allclose(batch[1][:, outside], 114 / 255, atol=1e-6)
    # the whole frame is letterboxed as before: enlarged x2 to 640x360, 140 px bars
    assert np.allclose(batch[0][:, :140], 114 / 255) and np.allclose(batch[0][:, 500:], 114 / 255)
    assert not np.allclose(batch[0][:, 140:500], 114 / 255)

    whole, in_region = result.detections
    assert not whole.HasField("region_index")
    # input 300..340 x 310..330 -> frame (/2, pad 140) 150..170 x 85..95 -> source (x4)
    assert _box(whole) == (600.0, 340.0, 680.0, 380.0)
    assert in_region.region_index == 0
    assert _box(in_region) == pytest.approx(expected_region_box)


def test_crops_larger_than_the_input_still_shrink() -> None:
    detector = RecordingDetector()
    processor = DetectorFrameProcessor(detector, FAKE_MODEL)
    # a 1280x640 crop of the region (0, 0)-(1280, 640): halved to fit, 160 px bars
    region = pb.Region(x1=0, y1=0, x2=1280, y2=640, jpeg=make_jpeg(1280, 640))
    request = make_request(jpeg=b"", original_width=1920, original_height=1080, regions=[region])

    (result,) = processor.process([request])

    assert detector.flags == [[False]]
    (box,) = result.detections
    # input 300..340 x 310..330 -> crop ((x) * 2, (y - 160) * 2)
    assert _box(box) == pytest.approx((600.0, 300.0, 680.0, 340.0))


def test_a_detector_without_scale_up_still_gets_regions_and_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="cloud_service.processor")
    detector = FakeDetector()
    processor = DetectorFrameProcessor(detector, FAKE_MODEL)
    region = pb.Region(x1=0, y1=0, x2=100, y2=50, jpeg=make_jpeg(100, 50))
    requests = [make_request("cam", i, regions=[region]) for i in range(2)]

    first = processor.process(requests[:1])
    second = processor.process(requests[1:])

    assert [_code(r) for r in first + second] == [grpc.StatusCode.OK] * 2
    assert detector.calls == [[(120, 160, 3), (50, 100, 3)]] * 2
    warnings = [r for r in caplog.records if "takes no scale_up" in r.getMessage()]
    assert len(warnings) == 1  # once per processor


def test_whole_frames_alone_never_warn(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="cloud_service.processor")
    processor = DetectorFrameProcessor(FakeDetector(), FAKE_MODEL)
    processor.process([make_request()])
    assert not caplog.records


class _KeywordOnly:
    def detect(
        self, images: Sequence[npt.NDArray[np.uint8]], *, scale_up: bool | Sequence[bool] = True
    ) -> list[Detections]:
        return []


class _AnyKeywords:
    def detect(self, images: Sequence[npt.NDArray[np.uint8]], **options: Any) -> list[Detections]:
        return []


@pytest.mark.parametrize(
    ("detector", "expected"),
    [
        (_KeywordOnly(), True),
        (_AnyKeywords(), True),
        (FakeDetector(), False),
        (_BrokenDetector(extra=False), False),
    ],
    ids=["keyword-only", "kwargs", "fake", "plain"],
)
def test_accepts_scale_up(detector: Any, expected: bool) -> None:
    assert accepts_scale_up(detector) is expected
