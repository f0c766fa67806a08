"""`cloud-service triton-repository`: ONNX detectors into a Triton model repository."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format

from cloud_service.cli import main
from protos.inference.v2 import inference_pb2 as pb
from tests.fixtures.triton import FP32_MODEL, INT8_MODEL

CLOUD_MODEL = FP32_MODEL.parents[1] / "cloud" / "cloud-yolov5s-640-fp16w.onnx"


def _add(repository: Path, model: Path, version: int, *extra: str) -> int:
    return main(
        [
            "triton-repository",
            "--onnx",
            str(model),
            "--repository",
            str(repository),
            "--name",
            "det",
            "--version",
            str(version),
            *extra,
        ]
    )


def _config(repository: Path) -> pb.ModelConfig:
    text = (repository / "det" / "config.pbtxt").read_text()
    return text_format.Parse(text, pb.ModelConfig(), allow_unknown_field=True)


def test_first_version_writes_the_config_with_the_models_metadata(tmp_path: Path) -> None:
    assert _add(tmp_path, FP32_MODEL, 1, "--max-batch-size", "8") == 0

    config = _config(tmp_path)
    assert (config.name, config.backend, config.max_batch_size) == ("det", "python", 8)
    assert [(t.name, list(t.dims)) for t in config.input] == [("images", [3, -1, -1])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("output0", [84, -1])]
    names = json.loads(config.parameters["class_names"].string_value)
    assert names[0] == "person" and len(names) == 80
    assert config.parameters["box_units"].string_value == "pixels"
    assert sorted(p.name for p in (tmp_path / "det" / "1").iterdir()) == ["model.onnx", "model.py"]
    text = (tmp_path / "det" / "config.pbtxt").read_text()
    assert "dynamic_batching { max_queue_delay_microseconds: 2000 }" in text
    assert "version_policy { latest { num_versions: 1 } }" in text


def test_later_versions_share_the_config_and_must_fit_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _add(tmp_path, FP32_MODEL, 1, "--backend", "onnxruntime") == 0
    before = (tmp_path / "det" / "config.pbtxt").read_text()

    assert _add(tmp_path, INT8_MODEL, 2) == 0  # same input and output: a new version
    assert _add(tmp_path, INT8_MODEL, 2) == 1  # versions are immutable
    assert "exists" in capsys.readouterr().err
    assert _add(tmp_path, CLOUD_MODEL, 3) == 1  # 8 output channels, not 84: refused
    assert "shares one config" in capsys.readouterr().err

    assert (tmp_path / "det" / "config.pbtxt").read_text() == before
    assert sorted(p.name for p in (tmp_path / "det").iterdir()) == ["1", "2", "config.pbtxt"]
    assert [p.name for p in (tmp_path / "det" / "2").iterdir()] == ["model.onnx"]


def test_a_missing_model_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _add(tmp_path, tmp_path / "nope.onnx", 1) == 1
    assert "not found" in capsys.readouterr().err
    assert not (tmp_path / "det").exists()
