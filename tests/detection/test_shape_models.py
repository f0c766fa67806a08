"""`detector.shape_models`: frames run on the fixed-shape export that matches their shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from detection.config import DetectorConfig
from detection.detector import Detector
from detection.errors import ModelConfigError
from detection.runtimes.config import LiteRTConfig, OnnxRuntimeConfig

EDGE = Path(__file__).resolve().parents[2] / "models" / "edge"
SQUARE = EDGE / "edge-yolov5n-320-int8.tflite"
WIDE = EDGE / "edge-yolov5n-320x192-int8.tflite"


def _frame(height: int, width: int, seed: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


def _config(**fields: Any) -> DetectorConfig:
    return DetectorConfig(runtime=LiteRTConfig(model_path=SQUARE), **fields)


def test_frames_of_a_shape_model_run_on_it_and_the_others_on_the_main_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wide_frame, tall_frame = _frame(360, 640, 1), _frame(480, 360, 2)
    with Detector.from_config(_config(shape_models=[LiteRTConfig(model_path=WIDE)])) as detector:
        shapes = detector.input_shapes_for([wide_frame, tall_frame], [True, True])
        assert shapes == [(192, 320), (320, 320)]  # 4:3 portrait: no model of its shape
        calls: list[tuple[int, ...]] = []
        original = detector._infer

        def spy(batch: Any, shape: Any = None) -> Any:
            calls.append(tuple(batch.shape))
            return original(batch, shape)

        monkeypatch.setattr(detector, "_infer", spy)
        found = detector.detect([wide_frame, tall_frame, wide_frame])
    assert calls == [(2, 3, 192, 320), (1, 3, 320, 320)]  # one run per shape
    with Detector.from_config(DetectorConfig(runtime=LiteRTConfig(model_path=WIDE))) as alone:
        (expected,) = alone.detect([wide_frame])
    np.testing.assert_allclose(found[0].xyxy, expected.xyxy, atol=1e-3)
    np.testing.assert_array_equal(found[0].class_id, expected.class_id)


def test_letterbox_fixed_keeps_every_frame_on_the_main_model() -> None:
    config = _config(shape_models=[LiteRTConfig(model_path=WIDE)], letterbox="fixed")
    with Detector.from_config(config) as detector:
        assert detector.input_shapes_for([_frame(360, 640, 3)], [True]) == [(320, 320)]


def test_shape_models_must_be_fixed_and_distinct() -> None:
    dynamic = OnnxRuntimeConfig(model_path=EDGE / "edge-yolov5n-320.onnx")
    with pytest.raises(ModelConfigError, match="fixed input size"):
        Detector.from_config(_config(shape_models=[dynamic]))
    twice = [LiteRTConfig(model_path=WIDE), LiteRTConfig(model_path=WIDE)]
    with pytest.raises(ModelConfigError, match="two shape_models take 320x192"):
        Detector.from_config(_config(shape_models=twice))
