"""Model metadata: class names and identity from the model file, and validate-config's checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from detection.config import DetectorConfig
from detection.errors import ModelConfigError
from detection.model_metadata import (
    inspect_detector_model,
    metadata_class_names,
    model_file_issues,
    model_identity,
    resolve_class_filter,
)
from detection.runtimes.config import LiteRTConfig, OnnxRuntimeConfig, TensorRTConfig
from tests.fixtures.tiny_models import tiny_tflite

COCO = Path(__file__).resolve().parents[2] / "models" / "coco"
FP32 = COCO / "nanodet-coco-fp32.onnx"
INT8 = COCO / "nanodet-coco-int8.onnx"


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"class_names": '["a", "b"]'}, ("a", "b")),
        ({"class_names": "[]"}, ()),
        ({"names": "{0: 'a', 1: 'b'}"}, ("a", "b")),
        ({"names": "{'0': 'a', '1': 'b'}"}, ("a", "b")),  # JSON-style keys
        ({"names": "['a', 'b']"}, ("a", "b")),
        ({"names": "{1: 'b'}"}, None),  # does not start at 0
        ({"names": "__import__('os')"}, None),  # never evaluated
        ({}, None),
    ],
)
def test_metadata_class_names(metadata: dict[str, str], expected: tuple[str, ...] | None) -> None:
    assert metadata_class_names(metadata) == expected


@pytest.mark.parametrize(
    ("classes", "names", "expected"),
    [([], ["a"], None), (["b"], ["a", "b"], (1,)), (["b", "a", "b"], ["a", "b"], (0, 1))],
)
def test_class_filter_resolves_names_to_ids(
    classes: list[str], names: list[str], expected: tuple[int, ...] | None
) -> None:
    assert resolve_class_filter(classes, names) == expected


def test_class_filter_names_the_known_classes_of_an_unknown_one() -> None:
    with pytest.raises(ModelConfigError, match="unknown class 'dog'; the classes of m are: a, b"):
        resolve_class_filter(["dog"], ["a", "b"], "m")


@pytest.mark.parametrize(
    ("metadata", "configured", "expected"),
    [
        ({"model_name": "nanodet-coco", "model_version": "3.0.4"}, (None, None),
         ("nanodet-coco", "3.0.4")),
        ({"model_name": "nanodet-coco", "model_version": "3.0.4"}, ("mine", "7"), ("mine", "7")),
        ({"model_name": "nanodet-coco"}, (None, None), ("nanodet-coco", "1")),
        ({}, (None, None), ("cloud-yolov5s-640-fp16w", "1")),
    ],
    ids=["metadata", "config-wins", "no-version", "file-stem"],
)  # fmt: skip
def test_model_identity(
    metadata: dict[str, str],
    configured: tuple[str | None, str | None],
    expected: tuple[str, str],
) -> None:
    path = Path("models/cloud/cloud-yolov5s-640-fp16w.onnx")
    assert model_identity(metadata, path, *configured) == expected


def _onnx(path: Path, **fields: Any) -> DetectorConfig:
    return DetectorConfig(runtime=OnnxRuntimeConfig(model_path=path), **fields)


def _corrupt(path: Path) -> Path:
    path.write_bytes(b"not a model \x00\x01" * 8)
    return path


@pytest.mark.parametrize(
    ("make_config", "expected"),
    [
        (lambda p: _onnx(FP32), []),
        (lambda p: _onnx(INT8, classes=["person", "bicycle"]), []),
        (lambda p: DetectorConfig(runtime=TensorRTConfig(engine_path=p / "x.engine")),
         [(("runtime", "engine_path"), "model file not found: ")]),
        (lambda p: _onnx(p / "absent.onnx"),
         [(("runtime", "model_path"), "model file not found: ")]),
        (lambda p: _onnx(Path("absent.onnx")),
         [(("runtime", "model_path"), "model file not found: absent.onnx (relative to the "
                                      "working directory")]),
        (lambda p: _onnx(_corrupt(p / "bad.onnx")),
         [(("runtime", "model_path"), "cannot load ONNX model")]),
        (lambda p: _onnx(FP32, class_names=["person", "car", "truck", "forklift"]),
         [(("runtime", "model_path"), "class_names in the config names 4 classes (person, car, "
                                      "truck, forklift) but the model nanodet-coco-fp32.onnx has "
                                      "80 (person, bicycle, car, motorcycle, airplane, ...)")]),
        (lambda p: _onnx(FP32, classes=["person", "forklift"]),
         [(("classes", 1), "unknown class 'forklift'; the classes of model "
                           "nanodet-coco-fp32.onnx are: person, bicycle,")]),
        (lambda p: DetectorConfig(runtime=LiteRTConfig(model_path=tiny_tflite(p / "m.tflite")),
                                  classes=["person"]),
         [(("classes", 0), "class 'person' cannot be resolved: neither class_names nor the "
                           "metadata of m.tflite names the model's classes")]),
    ],
    ids=["coco-fp32", "coco-int8-filter", "engine-missing", "missing", "missing-relative",
         "corrupt", "class-count", "unknown-filter-class", "filter-without-names"],
)  # fmt: skip
def test_inspect_detector_model(
    tmp_path: Path, make_config: Any, expected: list[tuple[tuple[Any, ...], str]]
) -> None:
    inspection = inspect_detector_model(make_config(tmp_path))
    assert [where for where, _ in inspection.issues] == [where for where, _ in expected]
    for (_, message), (_, start) in zip(inspection.issues, expected, strict=True):
        assert message.startswith(start), message


def test_inspection_gives_the_model_class_names_and_metadata() -> None:
    inspection = inspect_detector_model(_onnx(INT8))
    assert inspection.class_names is not None and len(inspection.class_names) == 80
    assert inspection.metadata["model_name"] == "nanodet-coco"


def test_an_engine_file_is_only_checked_for_presence(tmp_path: Path) -> None:
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"serialized elsewhere")  # TensorRT keeps no metadata to read
    inspection = inspect_detector_model(DetectorConfig(runtime=TensorRTConfig(engine_path=engine)))
    assert inspection.issues == [] and inspection.class_names == ()


class _TwoDetectors(BaseModel):
    edge: DetectorConfig
    spares: list[DetectorConfig]


def test_model_file_issues_places_each_detector_at_its_path(tmp_path: Path) -> None:
    config = _TwoDetectors(edge=_onnx(FP32), spares=[_onnx(FP32), _onnx(tmp_path / "gone.onnx")])
    [(where, message)] = model_file_issues(config)
    assert where == ("spares", 1, "runtime", "model_path")
    assert message.startswith("model file not found:") and "gone.onnx" in message
