"""`cloud-service validate-config`: exit codes, OK lines, every error of each file with its line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloud_service.cli import main

ROOT = Path(__file__).resolve().parents[2]
CPU = ROOT / "configs" / "cloud-service.cpu.yaml"

BAD = """\
engine:
  runtime:
    type: onnxruntime
    model_path: models/cloud/yolov5x.onnx
decoder:
  type: gpu
"""


MISSING_MODEL = "model file not found: models/cloud/yolov5x.onnx (relative to the working directory"


def test_valid_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate-config", str(CPU)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{CPU}: OK (model ") and " on onnxruntime, decoder cpu" in out
    assert err == ""


def test_invalid_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    assert main(["validate-config", str(bad)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{bad}:4: engine.runtime.model_path: {MISSING_MODEL} {Path.cwd()})",
        f"{bad}:6: decoder.type: Input should be 'cpu' or 'nvjpeg' (got 'gpu')",
    ]
    assert main(["validate-config", "--skip-model-check", str(bad)]) == 1
    assert capsys.readouterr().err == (
        f"{bad}:6: decoder.type: Input should be 'cpu' or 'nvjpeg' (got 'gpu')\n"
    )


COCO = ROOT / "models" / "coco" / "nanodet-coco-fp32.onnx"
GOOD = f"engine:\n  runtime: {{type: onnxruntime, model_path: {COCO}}}\n  input_size: [480, 640]\n"
ENGINE = (
    "engine:\n  runtime:\n    type: tensorrt\n    engine_path: {path}\n    max_batch_size: 16\n"
)


def test_several_files_one_block_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(GOOD)
    bad.write_text(BAD)
    assert main(["validate-config", str(bad), str(good)]) == 1
    out, err = capsys.readouterr()
    assert out == (
        f"{good}: OK (model <metadata>:<metadata> on onnxruntime, decoder cpu, max batch 16, "
        "listening on 127.0.0.1:50051)\n"
    )
    assert [line.split(":")[1] for line in err.splitlines()] == ["4", "6"]
    assert main(["validate-config", str(good), str(good)]) == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("input_size", "class_names: [a, b]\n  input_size"),
         ":2: engine.runtime.model_path: class_names in the config names 2 classes (a, b) but "
         "the model nanodet-coco-fp32.onnx has 80"),
        (ENGINE.format(path="/nowhere/yolov5x.engine"),
         ":4: engine.runtime.engine_path: model file not found: /nowhere/yolov5x.engine"),
    ],
    ids=["class-count", "missing-engine"],
)  # fmt: skip
def test_model_file_problems_name_their_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    config = tmp_path / "cloud.yaml"
    config.write_text(text)
    assert main(["validate-config", str(config)]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{config}{expected}"), line
    assert main(["validate-config", "--skip-model-check", str(config)]) == 0


def test_unreadable_file(tmp_path: Path) -> None:
    assert main(["validate-config", str(tmp_path)]) == 2  # a directory cannot be read


@pytest.mark.process
def test_module_entry_point(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    result = subprocess.run(
        [sys.executable, "-m", "cloud_service", "validate-config", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"{bad}:4: engine.runtime.model_path: {MISSING_MODEL} {ROOT})",
        f"{bad}:6: decoder.type: Input should be 'cpu' or 'nvjpeg' (got 'gpu')",
    ]
