"""Build a TensorRT 10 engine from an ONNX file on the target GPU: FP16 or INT8.

INT8 uses implicit calibration (an `IInt8EntropyCalibrator2` fed letterboxed images from a
folder, with a calibration cache so rebuilds skip it). The engine gets one optimisation profile
over the batch axis (min / opt / max) at a fixed image size, and builds reuse a timing cache.

The module imports without TensorRT; `build_engine` raises `RuntimeUnavailableError` where it is
missing. The pure parts (settings, profile shapes, calibration batches) are tested everywhere.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np

from detection.errors import DetectionError, ExportError
from detection.letterbox import letterbox_batch
from detection.runtimes._io import FloatArray
from detection.runtimes.tensorrt import import_cudart
from detection.runtimes.tensorrt import import_tensorrt as runtime_import_tensorrt
from detection.toolchain.export import IMAGE_SUFFIXES

logger = logging.getLogger(__name__)

Precision = Literal["fp16", "int8"]
TENSORRT_MISSING = (
    "TensorRT is not installed on this machine; build the engine on the target GPU "
    "(install the `gpu` extra there)"
)


@dataclass(frozen=True)
class EngineSettings:
    """What to build: precision, batch profile, image size, workspace, cache files."""

    precision: Precision = "fp16"
    imgsz: int = 640
    min_batch: int = 1
    opt_batch: int = 1
    max_batch: int = 1
    workspace_mib: int = 4096
    calibration_dir: Path | None = None
    calibration_cache: Path | None = None
    calibration_batch: int = 8
    calibration_max_images: int = 512
    timing_cache: Path | None = None

    def __post_init__(self) -> None:
        if self.precision not in ("fp16", "int8"):
            raise ExportError(f"precision must be fp16 or int8, got {self.precision!r}")
        if not 1 <= self.min_batch <= self.opt_batch <= self.max_batch <= 1024:
            raise ExportError(
                "batch profile must satisfy 1 <= min <= opt <= max <= 1024, got "
                f"min={self.min_batch} opt={self.opt_batch} max={self.max_batch}"
            )
        if self.imgsz < 32 or self.imgsz % 32:
            raise ExportError(f"imgsz must be a multiple of 32, >= 32; got {self.imgsz}")
        if self.workspace_mib < 1:
            raise ExportError(f"workspace_mib must be >= 1, got {self.workspace_mib}")
        if self.calibration_batch < 1 or self.calibration_max_images < 1:
            raise ExportError("calibration_batch and calibration_max_images must be >= 1")
        cache_usable = self.calibration_cache is not None and self.calibration_cache.is_file()
        if self.precision == "int8" and self.calibration_dir is None and not cache_usable:
            raise ExportError("INT8 needs a calibration image folder (or an existing cache)")


Shape = tuple[int, int, int, int]


def profile_shapes(
    input_shape: tuple[int, ...], settings: EngineSettings
) -> tuple[Shape, Shape, Shape]:
    """(min, opt, max) NCHW shapes for the network input `input_shape` (-1 for dynamic axes)."""
    if len(input_shape) != 4 or input_shape[1] not in (3, -1):
        raise ExportError(f"network input must be NCHW with 3 channels, got {input_shape}")
    fixed_batch = input_shape[0]
    if fixed_batch > 0 and (settings.min_batch, settings.max_batch) != (fixed_batch, fixed_batch):
        raise ExportError(
            f"the ONNX model has a fixed batch of {fixed_batch}; re-export it with a dynamic "
            f"batch to build a {settings.min_batch}..{settings.max_batch} profile"
        )
    height = input_shape[2] if input_shape[2] > 0 else settings.imgsz
    width = input_shape[3] if input_shape[3] > 0 else settings.imgsz
    return (
        (settings.min_batch, 3, height, width),
        (settings.opt_batch, 3, height, width),
        (settings.max_batch, 3, height, width),
    )


def calibration_files(folder: Path, limit: int) -> list[Path]:
    """Up to `limit` image files from `folder`, sorted; clear errors for a missing/empty folder."""
    if not folder.is_dir():
        raise ExportError(f"calibration folder not found: {folder}")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ExportError(f"calibration folder {folder} holds no images ({sorted(IMAGE_SUFFIXES)})")
    return files[:limit]


def calibration_batches(
    files: list[Path], batch: int, shape: tuple[int, int]
) -> Iterator[FloatArray]:
    """Letterboxed float32 RGB `(batch, 3, h, w)` batches, as the detector feeds the engine;
    the last partial batch is dropped (the calibrator needs full ones)."""
    for start in range(0, len(files) - batch + 1, batch):
        images = []
        for path in files[start : start + batch]:
            image = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if image is None:
                raise ExportError(f"cannot read calibration image {path}")
            images.append(np.asarray(image, dtype=np.uint8))
        yield letterbox_batch(images, shape)[0]


def import_tensorrt() -> Any:
    """The `tensorrt` module, or `RuntimeUnavailableError` saying to build on the target GPU."""
    return runtime_import_tensorrt(TENSORRT_MISSING)


def _check_cuda(cudart: Any, what: str, result: tuple[Any, ...]) -> Any:
    if result[0] != cudart.cudaError_t.cudaSuccess:
        raise DetectionError(f"CUDA {what} failed: {result[0]}")
    return result[1] if len(result) > 1 else None


def make_calibrator(trt: Any, settings: EngineSettings, input_hw: tuple[int, int]) -> Any:
    """An `IInt8EntropyCalibrator2` over the settings' calibration folder and cache file."""
    cudart = import_cudart("INT8 calibration")
    files = (
        calibration_files(settings.calibration_dir, settings.calibration_max_images)
        if settings.calibration_dir is not None
        else []
    )
    batch = min(settings.calibration_batch, max(len(files), 1))

    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):  # type: ignore[misc]
        """Feeds calibration batches to TensorRT through one device buffer."""

        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self._batches = calibration_batches(files, batch, input_hw)
            nbytes = batch * 3 * input_hw[0] * input_hw[1] * 4
            self._device = int(_check_cuda(cudart, "cudaMalloc", cudart.cudaMalloc(nbytes)))
            self._fed = 0

        def get_batch_size(self) -> int:
            return batch

        def get_batch(self, names: list[str]) -> list[int] | None:
            data = next(self._batches, None)
            if data is None:
                logger.info("calibration done after %d images", self._fed)
                return None
            data = np.ascontiguousarray(data)
            kind = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
            result = cudart.cudaMemcpy(self._device, data.ctypes.data, data.nbytes, kind)
            _check_cuda(cudart, "cudaMemcpy", result)
            self._fed += data.shape[0]
            return [self._device]

        def read_calibration_cache(self) -> bytes | None:
            cache = settings.calibration_cache
            if cache is not None and cache.is_file():
                logger.info("using calibration cache %s", cache)
                return cache.read_bytes()
            return None

        def write_calibration_cache(self, cache: Any) -> None:
            if settings.calibration_cache is not None:
                settings.calibration_cache.parent.mkdir(parents=True, exist_ok=True)
                settings.calibration_cache.write_bytes(bytes(cache))
                logger.info("wrote calibration cache %s", settings.calibration_cache)

        def free(self) -> None:
            """Release the device buffer."""
            _check_cuda(cudart, "cudaFree", cudart.cudaFree(self._device))

    return EntropyCalibrator()


def _parse_onnx(trt: Any, builder: Any, onnx_path: Path, trt_logger: Any) -> Any:
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, trt_logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ExportError(f"TensorRT cannot parse {onnx_path}: {errors}")
    return network, parser


def build_engine(onnx_path: Path, engine_path: Path, settings: EngineSettings) -> Path:
    """Build and serialize an engine for `onnx_path`; returns `engine_path`."""
    trt = import_tensorrt()
    if not onnx_path.is_file():
        raise ExportError(f"ONNX file not found: {onnx_path}")
    start = time.perf_counter()
    trt_logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(trt_logger)
    network, _parser = _parse_onnx(trt, builder, onnx_path, trt_logger)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_mib << 20)
    model_input = network.get_input(0)
    shapes = profile_shapes(tuple(model_input.shape), settings)
    profile = builder.create_optimization_profile()
    profile.set_shape(model_input.name, *shapes)
    config.add_optimization_profile(profile)
    timing = settings.timing_cache
    cache = config.create_timing_cache(timing.read_bytes() if timing and timing.is_file() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    calibrator = None
    if settings.precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    else:
        config.set_flag(trt.BuilderFlag.INT8)
        config.set_flag(trt.BuilderFlag.FP16)  # layers INT8 cannot take fall back to FP16
        calibrator = make_calibrator(trt, settings, (shapes[0][2], shapes[0][3]))
        config.int8_calibrator = calibrator
        config.set_calibration_profile(profile)
    try:
        serialized = builder.build_serialized_network(network, config)
    finally:
        if calibrator is not None:
            calibrator.free()
    if serialized is None:
        raise ExportError(f"TensorRT failed to build an engine from {onnx_path} (see its log)")
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    engine_path.write_bytes(bytes(serialized))
    if timing is not None:
        timing.parent.mkdir(parents=True, exist_ok=True)
        timing.write_bytes(bytes(config.get_timing_cache().serialize()))
    logger.info(
        "built %s engine %s (batch %s..%s) in %.1f s",
        settings.precision,
        engine_path,
        settings.min_batch,
        settings.max_batch,
        time.perf_counter() - start,
    )
    return engine_path
