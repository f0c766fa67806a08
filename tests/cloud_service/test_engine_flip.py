"""Flip test-time augmentation of the cloud engine (`tta.flip`): the mirror's boxes come back in
the frame's pixels and merge with the frame's own; the config rejects a bad merge IoU with its
line. The engine runs the committed COCO NanoDet FP32 on ONNX Runtime (CPU) on `bus.jpg`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cloud_service.app import _load_engine, _model_sections
from cloud_service.config import CloudServiceConfig, TtaConfig
from cloud_service.engines import create_engine, flip_merged
from configkit import ConfigError, parse_config
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.runtimes.config import OnnxRuntimeConfig

FP32_MODEL = Path(__file__).resolve().parents[2] / "models" / "coco" / "nanodet-coco-fp32.onnx"
Image = np.ndarray[Any, np.dtype[np.uint8]]


def _boxes(rows: list[tuple[float, float, float, float, float, int]]) -> Detections:
    array = np.asarray(rows, dtype=np.float32).reshape(-1, 6)
    return Detections(array[:, :4], array[:, 4], array[:, 5].astype(np.int64))


def _iou(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    x1, y1 = max(a[0], b[0]), max(a[1], b[1])
    x2, y2 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union)


def test_flip_merged_maps_the_mirror_back_and_keeps_the_more_confident_box() -> None:
    plain = _boxes([(10, 10, 30, 50, 0.6, 0)])
    # in the 100 px wide mirror: the same person (x 70..90) more confident, a car only it saw
    mirrored = _boxes([(70, 10, 90, 50, 0.8, 0), (0, 60, 40, 90, 0.5, 2)])

    merged = flip_merged(plain, mirrored, 100, 0.55)

    assert len(merged) == 2
    person = merged[merged.class_id == 0]
    np.testing.assert_allclose(person.xyxy, [[10, 10, 30, 50]])
    assert person.confidence.tolist() == pytest.approx([0.8])
    np.testing.assert_allclose(merged[merged.class_id == 2].xyxy, [[60, 60, 100, 90]])


def test_flip_merged_keeps_overlapping_boxes_of_other_classes() -> None:
    plain = _boxes([(10, 10, 30, 50, 0.6, 0)])
    mirrored = _boxes([(70, 10, 90, 50, 0.7, 1)])  # the same place, another class

    assert len(flip_merged(plain, mirrored, 100, 0.55)) == 2
    assert len(flip_merged(plain, _boxes([]), 100, 0.55)) == 1


def _engine_config() -> DetectorConfig:
    runtime = OnnxRuntimeConfig(model_path=FP32_MODEL, intra_op_threads=1)
    return DetectorConfig(runtime=runtime, input_size=(320, 416), confidence_threshold=0.3)


def test_engine_with_flip_finds_what_the_plain_engine_finds_in_frame_pixels(
    bus_image: Image,
) -> None:
    plain_engine = create_engine(_engine_config(), max_batch_size=2)
    flip_engine = create_engine(_engine_config(), max_batch_size=2, tta=TtaConfig(flip=True))
    try:
        (plain,) = plain_engine.detect([bus_image])
        flipped, again = flip_engine.detect([bus_image, bus_image])
    finally:
        plain_engine.close()
        flip_engine.close()

    height, width = bus_image.shape[:2]
    assert len(plain) > 0
    assert len(flipped) >= 1
    assert flipped.xyxy[:, [0, 2]].min() >= 0 and flipped.xyxy[:, [0, 2]].max() <= width
    assert flipped.xyxy[:, [1, 3]].min() >= 0 and flipped.xyxy[:, [1, 3]].max() <= height
    sure = plain.confidence >= 0.5
    for box, class_id in zip(plain.xyxy[sure], plain.class_id[sure], strict=True):
        same = flipped.xyxy[flipped.class_id == class_id]
        assert max(_iou(box, other) for other in same) > 0.5
    np.testing.assert_allclose(again.xyxy, flipped.xyxy)  # per frame, batch or not


def test_flip_is_off_by_default_and_set_in_the_tta_section() -> None:
    base = "engine:\n  runtime:\n    type: onnxruntime\n    model_path: m.onnx\n"
    assert parse_config(base, CloudServiceConfig).tta == TtaConfig(flip=False, merge_iou=0.55)
    config = parse_config(base + "tta:\n  flip: true\n", CloudServiceConfig)
    assert config.tta.flip


@pytest.mark.parametrize("value", ["0", "1.5", "high"])
def test_a_bad_merge_iou_is_a_config_error_with_its_line(value: str) -> None:
    document = (
        "engine:\n  runtime:\n    type: onnxruntime\n    model_path: m.onnx\n"
        f"tta:\n  flip: true\n  merge_iou: {value}\n"
    )
    with pytest.raises(ConfigError, match=r"^t.yaml:7: tta.merge_iou: "):
        parse_config(document, CloudServiceConfig, "t.yaml")


def test_the_service_builds_its_engine_with_the_configured_flip() -> None:
    document = (
        f"engine:\n  runtime:\n    type: onnxruntime\n    model_path: {FP32_MODEL}\n"
        "    intra_op_threads: 1\n  input_size: [320, 416]\n"
        "batching:\n  max_batch_size: 1\n"
        "tta:\n  flip: true\n  merge_iou: 0.6\n"
    )
    config = parse_config(document, CloudServiceConfig)
    engine = _load_engine(config, config.engine, "stable")
    try:
        assert engine.tta == TtaConfig(flip=True, merge_iou=0.6)
    finally:
        engine.close()


def test_a_reload_that_turns_the_flip_on_reloads_the_models() -> None:
    base = "engine:\n  runtime:\n    type: onnxruntime\n    model_path: m.onnx\n"
    off = parse_config(base, CloudServiceConfig)
    on = parse_config(base + "tta:\n  flip: true\n", CloudServiceConfig)
    assert _model_sections(off) != _model_sections(on)  # a model change, not a restart
