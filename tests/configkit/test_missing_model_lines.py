"""`edge-agent run` and `cloud-service serve` name the field and YAML line of a model file that
does not load, as `validate-config` does (before: only the file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud_service.cli import main as cloud_main
from configkit.cli import locate_problems
from configkit.yaml_loader import load_config
from detection.model_metadata import model_file_issues
from edge_agent.cli import main as edge_main
from edge_agent.config import EdgeAgentConfig

EDGE_CONFIG = """\
agent:
  id: dev-box
cameras:
  - name: front-door
    url: rtsp://127.0.0.1:9/front-door
metrics:
  enabled: false
detector:
  runtime:
    type: onnxruntime
    model_path: {model}
  class_names: [person]
"""

CLOUD_CONFIG = """\
server:
  listen_address: 127.0.0.1:0
metrics:
  enabled: false
engine:
  runtime:
    type: onnxruntime
    model_path: {model}
  input_size: [320, 320]
"""


def test_edge_run_names_the_field_and_line_of_a_missing_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(EDGE_CONFIG.format(model="/nowhere/edge.onnx"))

    assert edge_main(["run", "--config", str(config)]) == 1

    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"edge-agent run: cannot load the detector: {config}:11: "
        "detector.runtime.model_path: model file not found: /nowhere/edge.onnx"
    ]


def test_cloud_serve_names_the_field_and_line_of_a_missing_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "cloud.yaml"
    config.write_text(CLOUD_CONFIG.format(model="/nowhere/cloud.onnx"))

    assert cloud_main(["serve", "--config", str(config)]) == 1

    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"cloud-service serve: {config}:8: engine.runtime.model_path: "
        "model file not found: /nowhere/cloud.onnx"
    ]


def test_a_config_without_problems_locates_none(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(EDGE_CONFIG.format(model=tmp_path / "absent.onnx"))
    loaded = load_config(config, EdgeAgentConfig)

    found = locate_problems(config, loaded, model_file_issues)
    config.unlink()  # gone since it was loaded: nothing can be placed

    assert found is not None and [issue.line for issue in found.issues] == [11]
    assert locate_problems(config, loaded, model_file_issues) is None
    assert locate_problems(tmp_path / "x.yaml", loaded, []) is None
