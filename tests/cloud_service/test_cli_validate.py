"""`cloud-service validate-config`: exit codes, the OK line, one error line per problem."""

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


def test_valid_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate-config", str(CPU)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{CPU}: OK (model yolov5x:1 on onnxruntime, decoder cpu")
    assert err == ""


def test_invalid_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    assert main(["validate-config", str(bad)]) == 1
    assert capsys.readouterr().err == (
        f"{bad}:6: decoder.type: Input should be 'cpu' or 'nvjpeg' (got 'gpu')\n"
    )


def test_unreadable_file(tmp_path: Path) -> None:
    assert main(["validate-config", str(tmp_path)]) == 2  # a directory cannot be read


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
        f"{bad}:6: decoder.type: Input should be 'cpu' or 'nvjpeg' (got 'gpu')"
    ]
