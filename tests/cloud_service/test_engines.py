"""Engine selection from the detector config, batch sizes for the batcher, warm-up.

ONNX Runtime runs here on the CPU (real YOLOv5s and tiny hand-built models); the TensorRT tests
need TensorRT and a GPU and are skipped elsewhere.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import numpy as np
import pytest

from cloud_service.engines import GPU_PROVIDERS, available_onnx_providers, create_engine
from detection.config import DetectorConfig
from detection.errors import RuntimeUnavailableError
from detection.runtimes.config import OnnxRuntimeConfig, TensorRTConfig
from tests.fixtures.tiny_models import tiny_onnx

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
IMGSZ = 320


def _yolo_config(model: Path, providers: list[str] | None = None) -> DetectorConfig:
    runtime = OnnxRuntimeConfig(model_path=model, providers=providers or ["CPUExecutionProvider"])
    return DetectorConfig(runtime=runtime, input_size=(IMGSZ, IMGSZ))


def test_onnx_cpu_engine_has_a_dynamic_batch_up_to_the_batcher_max(yolov5s_onnx: Path) -> None:
    engine = create_engine(_yolo_config(yolov5s_onnx), max_batch_size=4)
    try:
        assert engine.runtime_name == "onnxruntime"
        assert engine.supported_batch_sizes() == [1, 2, 3, 4]
        found = engine.detect([np.zeros((120, 160, 3), np.uint8)] * 3)
        assert len(found) == 3
    finally:
        engine.close()


@pytest.mark.parametrize("batch", [1, 2])
def test_fixed_batch_onnx_engine_reports_its_one_size(tmp_path: Path, batch: int) -> None:
    model = tiny_onnx(tmp_path / "fixed.onnx", batch=batch, size=32)
    config = DetectorConfig(runtime=OnnxRuntimeConfig(model_path=model))

    engine = create_engine(config, max_batch_size=16)

    assert engine.supported_batch_sizes() == [batch]
    engine.close()


def test_dynamic_tiny_onnx_engine_is_capped_by_the_batcher(tmp_path: Path) -> None:
    model = tiny_onnx(tmp_path / "dynamic.onnx", size=32)

    engine = create_engine(
        DetectorConfig(runtime=OnnxRuntimeConfig(model_path=model)), max_batch_size=3
    )

    assert engine.supported_batch_sizes() == [1, 2, 3]
    engine.close()


@pytest.mark.skipif("CUDAExecutionProvider" in available_onnx_providers(), reason="CUDA EP present")
def test_missing_gpu_providers_fall_back_to_cpu_with_a_warning(
    yolov5s_onnx: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _yolo_config(yolov5s_onnx, providers=list(GPU_PROVIDERS))

    with caplog.at_level(logging.INFO):
        engine = create_engine(config, max_batch_size=2)
    engine.close()

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("none of the GPU providers" in r.getMessage() for r in warnings)
    assert "['CPUExecutionProvider']" in caplog.text  # what it runs on instead


@pytest.mark.gpu
@pytest.mark.skipif(
    "CUDAExecutionProvider" not in available_onnx_providers(), reason="no CUDA EP (no CUDA GPU)"
)
def test_cuda_provider_engine_runs_and_warms_up(
    yolov5s_onnx: Path,
) -> None:  # pragma: no cover - needs onnxruntime-gpu and a GPU
    engine = create_engine(_yolo_config(yolov5s_onnx, list(GPU_PROVIDERS[1:])), max_batch_size=4)
    try:
        assert sorted(engine.warm_up()) == [1, 4]
        assert len(engine.detect([np.zeros((480, 640, 3), np.uint8)] * 4)) == 4
    finally:
        engine.close()


def test_no_available_provider_is_an_error(yolov5s_onnx: Path) -> None:
    config = _yolo_config(yolov5s_onnx, providers=["NoSuchExecutionProvider"])

    with pytest.raises(RuntimeUnavailableError, match="none of the ONNX Runtime providers"):
        create_engine(config, max_batch_size=2)


def test_warm_up_runs_the_smallest_and_largest_batch(
    yolov5s_onnx: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_engine(_yolo_config(yolov5s_onnx), max_batch_size=3)
    try:
        with caplog.at_level(logging.INFO, logger="cloud_service.engines"):
            timings_ms = engine.warm_up()
        chosen_ms = engine.warm_up([2])
    finally:
        engine.close()

    assert sorted(timings_ms) == [1, 3] and all(ms > 0 for ms in timings_ms.values())
    assert list(chosen_ms) == [2]
    assert "warm-up on onnxruntime: batch 3" in caplog.text


def test_engine_rejects_a_bad_max_batch_size(tmp_path: Path) -> None:
    model = tiny_onnx(tmp_path / "dynamic.onnx", size=32)

    with pytest.raises(ValueError, match="max_batch_size must be >= 1, got 0"):
        create_engine(DetectorConfig(runtime=OnnxRuntimeConfig(model_path=model)), max_batch_size=0)


@pytest.mark.skipif(HAS_TENSORRT, reason="TensorRT is installed here")
def test_tensorrt_engine_says_clearly_when_tensorrt_is_absent(tmp_path: Path) -> None:
    config = DetectorConfig(runtime=TensorRTConfig(engine_path=tmp_path / "model.engine"))

    with pytest.raises(RuntimeUnavailableError, match="TensorRT is not installed"):
        create_engine(config, max_batch_size=4)


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TENSORRT, reason="TensorRT not installed")
def test_tensorrt_dynamic_profile_gives_batch_sizes_and_warms_up(
    tmp_path: Path, yolov5s_onnx: Path
) -> None:  # pragma: no cover - needs TensorRT and a GPU
    from detection.toolchain.tensorrt_build import EngineSettings, build_engine

    settings = EngineSettings(imgsz=IMGSZ, min_batch=1, opt_batch=2, max_batch=4)
    engine_path = build_engine(yolov5s_onnx, tmp_path / "yolov5s.engine", settings)
    runtime = TensorRTConfig(engine_path=engine_path, max_batch_size=4)
    engine = create_engine(DetectorConfig(runtime=runtime), max_batch_size=8)
    try:
        assert engine.supported_batch_sizes() == [1, 2, 3, 4]
        assert sorted(engine.warm_up()) == [1, 4]
    finally:
        engine.close()
