"""`edge-agent validate-config`: exit codes, the OK line, one error line per problem."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "edge-agent.example.yaml"

BAD = """\
agent:
  id: box-1
cameras:
  - name: cam1
    url: rtsp://10.0.0.1/stream
    target_fps: 500
detector:
  runtime: {type: onnxruntime, model_path: m.onnx}
"""


def test_valid_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate-config", str(EXAMPLE)]) == 0
    out, err = capsys.readouterr()
    assert out == (
        f"{EXAMPLE}: OK (3 cameras (2 enabled), 6 rules, detector litert, escalation on)\n"
    )
    assert err == ""


def test_invalid_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    assert main(["validate-config", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"{bad}:6: cameras[0].target_fps: Input should be less than or equal to 120 (got 500)\n"
    )


def test_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate-config", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


SECRETS = BAD.replace("target_fps: 500", "username: viewer\n    password: {credential: cam-pw}") + (
    "mqtt:\n  username: agent\n  password: {env: MQTT_PASSWORD}\n"
)


def test_check_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(SECRETS)
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    monkeypatch.delenv("MQTT_PASSWORD", raising=False)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    assert main(["validate-config", str(config)]) == 0  # secrets are not read by default
    capsys.readouterr()
    assert main(["validate-config", "--check-secrets", str(config)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{config}:7: cameras[0].password: credential 'cam-pw' not found in {credentials}",
        f"{config}:12: mqtt.password: environment variable MQTT_PASSWORD is not set",
    ]
    monkeypatch.setenv("MQTT_PASSWORD", "secret")
    (credentials / "cam-pw").write_text("pw\n")
    assert main(["validate-config", "--check-secrets", str(config)]) == 0


def test_module_entry_point(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "edge_agent", "validate-config", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines == [
        f"{bad}:6: cameras[0].target_fps: Input should be less than or equal to 120 (got 500)"
    ]


def test_no_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main([])
    assert raised.value.code == 2
    assert "usage: edge-agent" in capsys.readouterr().err
