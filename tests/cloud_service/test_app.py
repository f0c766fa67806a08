"""Service wiring: the model's identity and class names come from the model file itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from cloud_service.app import model_info
from cloud_service.config import CloudServiceConfig
from cloud_service.processor import DetectorFrameProcessor
from detection.detector import Detector
from detection.runtimes.base import InputSpec
from tests.fixtures.grpc_server import make_request

ROOT = Path(__file__).resolve().parents[2]
COCO_FP32 = ROOT / "models" / "coco" / "nanodet-coco-fp32.onnx"
OLD_CLOUD = ROOT / "models" / "cloud" / "cloud-yolov5s-640-fp16w.onnx"


class MetadataRuntime:
    """A `Runtime` that finds nothing, with the metadata of a model file."""

    name = "metadata"

    def __init__(self, metadata: dict[str, str]) -> None:
        self.metadata = metadata

    @property
    def input_spec(self) -> InputSpec:
        return InputSpec(64, 64, "NCHW", None)

    def infer(self, images: Any) -> Any:
        return np.zeros((images.shape[0], 6, 8), np.float32)

    def close(self) -> None:
        pass


def _config(model_path: Path, **fields: Any) -> CloudServiceConfig:
    engine = {"runtime": {"type": "onnxruntime", "model_path": str(model_path)}}
    return CloudServiceConfig.model_validate({"engine": engine, **fields})


COCO_META = {
    "class_names": '["person", "bicycle"]',
    "model_name": "nanodet-coco",
    "model_version": "3.0.4",
}


@pytest.mark.parametrize(
    ("metadata", "fields", "expected"),
    [
        (COCO_META, {}, ("nanodet-coco", "3.0.4", ("person", "bicycle"))),
        (COCO_META, {"model_name": "mine", "model_version": "7"},
         ("mine", "7", ("person", "bicycle"))),
        ({"names": "{0: 'person', 1: 'car'}"}, {}, ("m", "1", ("person", "car"))),
        ({}, {"engine_class_names": ["a", "b"]}, ("m", "1", ("a", "b"))),
        ({}, {}, ("m", "1", ())),
    ],
    ids=["metadata", "config-wins", "ultralytics-names-and-file-stem", "config-names", "none"],
)  # fmt: skip
def test_model_info_from_config_else_model_metadata(
    metadata: dict[str, str], fields: dict[str, Any], expected: tuple[str, str, tuple[str, ...]]
) -> None:
    names = fields.pop("engine_class_names", None)
    config = _config(Path("models/m.onnx"), **fields)
    if names is not None:
        engine = config.engine.model_copy(update={"class_names": names})
        config = config.model_copy(update={"engine": engine})
    detector = Detector(MetadataRuntime(metadata), config.engine)
    info = model_info(config, detector)
    assert (info.name, info.version, info.class_names) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [(COCO_FP32, ("nanodet-coco", 80)), (OLD_CLOUD, ("cloud-yolov5s-640-fp16w", 4))],
    ids=["coco", "old-yolo"],
)
def test_real_models_name_themselves(path: Path, expected: tuple[str, int]) -> None:
    config = _config(path)
    engine = config.engine.model_copy(update={"input_size": (480, 640)})
    with Detector.from_config(engine) as detector:
        info = model_info(config, detector)
    assert (info.name, len(info.class_names)) == expected
    assert info.class_names[0] == "person"


def test_answers_name_classes_with_the_models_own_names() -> None:
    config = _config(COCO_FP32)
    engine = config.engine.model_copy(update={"input_size": (480, 640)})
    bus = cv2.imread(str(ROOT / ".cache" / "media" / "images" / "bus.jpg"))
    if bus is None:
        from tests.fixtures.models import asset_image

        bus = asset_image("bus.jpg")
    ok, jpeg = cv2.imencode(".jpg", bus)
    assert ok
    with Detector.from_config(engine) as detector:
        processor = DetectorFrameProcessor(detector, model_info(config, detector))
        [result] = processor.process([make_request("cam", 1, jpeg=jpeg.tobytes())])
        version = detector.metadata["model_version"]
    assert (result.model_name, result.model_version) == ("nanodet-coco", version)
    labels = [d.class_name for d in result.detections]
    assert labels.count("person") >= 3 and "bus" in labels, labels
