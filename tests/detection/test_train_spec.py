"""Training specs are validated before any slow work starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from detection.errors import ExportError
from detection.toolchain.train import TrainSpec, train_detector


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model_yaml": "yolov5n.pt"}, "must name a YOLO YAML"),
        ({"imgsz": 300}, "multiple of 32"),
        ({"imgsz": 32}, "multiple of 32 in 64..2048"),
        ({"epochs": 0}, "epochs and batch must be >= 1"),
        ({"batch": 0}, "epochs and batch must be >= 1"),
    ],
)
def test_bad_specs(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {
        "model_yaml": "yolov5n.yaml",
        "imgsz": 320,
        "epochs": 1,
        "batch": 8,
        "seed": 0,
    }
    with pytest.raises(ExportError, match=message):
        TrainSpec(**{**base, **kwargs})  # type: ignore[arg-type]


def test_missing_dataset_yaml(tmp_path: Path) -> None:
    spec = TrainSpec("yolov5n.yaml", 320, 1, 8, 0)
    with pytest.raises(ExportError, match="dataset YAML not found"):
        train_detector(spec, tmp_path / "data.yaml", tmp_path, "x")
