"""`edge-agent validate-config`: exit codes, OK lines, every error of each file with its line."""

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


def _missing_model(cwd: Path = Path.cwd()) -> str:  # noqa: B008 - the test's own directory
    return f"model file not found: m.onnx (relative to the working directory {cwd})"


def test_valid_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate-config", str(EXAMPLE)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{EXAMPLE}: OK (3 cameras (2 enabled), 6 rules, detector ")
    assert err == ""


def test_invalid_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    assert main(["validate-config", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{bad}:6: cameras[0].target_fps: Input should be less than or equal to 120 (got 500)",
        f"{bad}:8: detector.runtime.model_path: {_missing_model()}",
    ]
    assert main(["validate-config", "--skip-model-check", str(bad)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{bad}:6: cameras[0].target_fps: Input should be less than or equal to 120 (got 500)"
    ]


def test_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate-config", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


SECRETS = BAD.replace("target_fps: 500", "username: viewer\n    password: {credential: cam-pw}") + (
    "mqtt:\n  username: agent\n  password: {env: MQTT_PASSWORD}\n"
)
COCO_INT8 = ROOT / "models" / "coco" / "nanodet-coco-int8.onnx"


def test_check_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(SECRETS.replace("m.onnx", str(COCO_INT8)))
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


@pytest.mark.process
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
        f"{bad}:6: cameras[0].target_fps: Input should be less than or equal to 120 (got 500)",
        f"{bad}:8: detector.runtime.model_path: {_missing_model(ROOT)}",
    ]


def test_no_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main([])
    assert raised.value.code == 2
    assert "usage: edge-agent" in capsys.readouterr().err


# --- several files, every error of a file in one pass, the model files -----------------------

GOOD = f"""\
agent:
  id: box-1
cameras:
  - name: cam1
    url: rtsp://10.0.0.1/stream
    zones:
      - name: door
        points: [[0, 0], [1, 0], [1, 1]]
    rules:
      - name: enter
        kind: zone_enter
        zone: door
        classes: [person, bicycle]
detector:
  runtime: {{type: onnxruntime, model_path: {COCO_INT8}}}
"""


def test_several_files_one_block_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad, absent = tmp_path / "good.yaml", tmp_path / "bad.yaml", tmp_path / "absent.yaml"
    good.write_text(GOOD)
    bad.write_text(BAD)
    assert main(["validate-config", str(good), str(bad)]) == 1
    out, err = capsys.readouterr()
    assert (
        out == f"{good}: OK (1 camera (1 enabled), 1 rule, detector onnxruntime, escalation off)\n"
    )
    assert [line.split(":")[0] for line in err.splitlines()] == [str(bad)] * 2
    assert main(["validate-config", str(good), str(good)]) == 0
    assert capsys.readouterr().out.count(": OK (") == 2
    assert main(["validate-config", str(bad), str(absent), str(good)]) == 2
    out, err = capsys.readouterr()
    assert out.startswith(f"{good}: OK") and f"{absent}: cannot read" in err


ALL_AT_ONCE = """\
agent:
  id: box-1
cameras:
  - name: cam1
    url: rtsp://10.0.0.1/stream
    target_fps: 500
    zones:
      - name: door
        points: [[0, 0], [1, 0], [1, 1]]
      - name: door
        points: [[0, 0], [1, 0], [0, 1]]
    rules:
      - name: enter
        kind: zone_enter
        zone: dock
  - name: cam1
    url: /videos/a.mp4
    password: {env: CAM_PASSWORD}
detector:
  runtime:
    type: onnxruntime
    model_path: models/absent.onnx
  class_names: [person, car]
mqtt:
  qos: 3
"""


def test_every_error_of_a_file_in_one_pass_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Field errors, duplicate names, dangling references, cross-section checks and the model
    file, all at once rather than in rounds (the model file is checked once its own section,
    `detector`, is valid: its metadata is read against that section's class names)."""
    config = tmp_path / "all.yaml"
    config.write_text(ALL_AT_ONCE)
    assert main(["validate-config", str(config)]) == 1
    cwd = Path.cwd()
    assert capsys.readouterr().err.splitlines() == [
        f"{config}:6: cameras[0].target_fps: Input should be less than or equal to 120 (got 500)",
        f"{config}:10: cameras[0].zones[1].name: duplicate name 'door' on camera 'cam1'",
        f"{config}:15: cameras[0].rules[0].zone: rule 'enter' refers to zone 'dock', which is not "
        "defined on camera 'cam1' (zones defined: door)",
        f"{config}:16: cameras[1].name: duplicate camera name 'cam1'",
        f"{config}:18: cameras[1].password: a password needs a `username`",
        f"{config}:22: detector.runtime.model_path: model file not found: models/absent.onnx "
        f"(relative to the working directory {cwd})",
        f"{config}:25: mqtt.qos: Input should be less than or equal to 2 (got 3)",
    ]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("model_path: ", "model_path: /nowhere/"),
            [":15: detector.runtime.model_path: model file not found: /nowhere/"],
        ),
        (
            ("detector:\n", "detector:\n  class_names: [person, bicycle]\n"),
            [":16: detector.runtime.model_path: class_names in the config names 2 classes "
             "(person, bicycle) but the model nanodet-coco-int8.onnx has 80 (person, bicycle, car, "
             "motorcycle, airplane, ...); leave class_names empty to use the model's own"],
        ),
        (
            ("classes: [person, bicycle]", "classes: [person, forklift]"),
            [":13: cameras[0].rules[0].classes[1]: unknown class 'forklift'; the classes of the "
             "detector's model (rule 'enter') are: person, bicycle, car,"],
        ),
        (
            ("detector:\n", "detector:\n  classes: [bicycle, unicorn]\n"),
            [":15: detector.classes[1]: unknown class 'unicorn'; the classes of model "
             "nanodet-coco-int8.onnx are: person,"],
        ),
    ],
    ids=["missing-model", "class-count", "rule-class-not-in-model", "filter-class-not-in-model"],
)  # fmt: skip
def test_model_files_are_checked_with_the_line_that_names_them(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: tuple[str, str],
    expected: list[str],
) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(GOOD.replace(*change))
    assert main(["validate-config", str(config)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == len(expected)
    for line, start in zip(lines, expected, strict=True):
        assert line.startswith(f"{config}{start}"), line
    assert main(["validate-config", "--skip-model-check", str(config)]) == 0
