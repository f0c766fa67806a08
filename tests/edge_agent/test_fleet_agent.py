"""The edge side of fleet updates without processes: the `fleet:` config, the state file, the
evidence rule on tables of windows, and the boot choice on real files."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from detection.config import DetectorConfig
from edge_agent.config import EdgeAgentConfig
from edge_agent.config.fleet import EvidenceConfig, FleetConfig
from edge_agent.fleet.boot import boot_config, detector_for
from edge_agent.fleet.evidence import (
    CameraTotals,
    EvidenceLog,
    Sample,
    WindowStats,
    judge,
    window_between,
)
from edge_agent.fleet.state import (
    STATE_FILE,
    FleetState,
    ModelRecord,
    Trial,
    file_sha256,
    load_state,
    save_state,
)

KEY = base64.b64encode(bytes(range(32))).decode()
REPO_ROOT = Path(__file__).resolve().parents[2]


# ---- config -----------------------------------------------------------------------------------


def test_fleet_is_off_by_default_and_needs_a_store_and_a_key_when_on() -> None:
    assert FleetConfig().enabled is False
    on = FleetConfig(enabled=True, store_url="https://models.example.net/", trusted_keys=[KEY])
    assert on.groups == ["default"]
    with pytest.raises(ValidationError, match="store_url"):
        FleetConfig(enabled=True, trusted_keys=[KEY])
    with pytest.raises(ValidationError, match="trusted public key"):
        FleetConfig(enabled=True, store_url="file:///srv/store")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"store_url": "ftp://host/x"}, "must start with"),
        ({"store_url": "https:///no-host"}, "names no host"),
        ({"trusted_keys": ["not base64!"]}, "not an Ed25519 public key"),
        ({"trusted_keys": [base64.b64encode(b"short").decode()]}, "not an Ed25519 public key"),
        ({"groups": ["a/b"]}, "goes into a topic"),
        ({"groups": ["a", "a"]}, "listed twice"),
        ({"groups": []}, "at least 1"),
        ({"disk_budget_mb": 0}, "greater than 0"),
        ({"evidence": {"window_s": 0.5}}, "greater than or equal to 1"),
        ({"evidence": {"max_detection_drop": 1.5}}, "less than or equal to 1"),
        ({"unknown": 1}, "Extra inputs"),
    ],
)
def test_bad_fleet_settings_are_refused_with_a_clear_message(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        FleetConfig.model_validate(fields)


def test_every_fleet_field_has_a_description() -> None:
    for model in (FleetConfig, EvidenceConfig):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name}"


# ---- state ------------------------------------------------------------------------------------


def _record(tmp_path: Path, name: str = "edge", data: bytes = b"model bytes") -> ModelRecord:
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(data)
    return ModelRecord(
        name=name, version="2", sha256=file_sha256(path), path=path, runtime="onnxruntime"
    )


def test_state_round_trips_and_keeps_what_is_in_use(tmp_path: Path) -> None:
    assert load_state(tmp_path) == FleetState()
    current, trial = _record(tmp_path, "a"), _record(tmp_path, "b", b"other")
    state = FleetState(
        current=current,
        trial=Trial(model=trial, rollout_id="r1"),
        rejected=("f" * 64,),
        attempts={trial.sha256: 1},
    )
    save_state(tmp_path / "fleet", state)
    assert load_state(tmp_path / "fleet") == state
    assert state.keep() == {current.sha256, trial.sha256}
    assert [p.name for p in (tmp_path / "fleet").iterdir()] == [STATE_FILE]  # no temp left


@pytest.mark.parametrize("content", [b"{not json", b'{"current": 3}', b"[]", b"x" * (2 << 20)])
def test_a_corrupt_state_file_is_set_aside_and_the_box_boots_on_its_config(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / STATE_FILE).write_bytes(content)
    assert load_state(tmp_path) == FleetState()
    assert (tmp_path / f"{STATE_FILE}.corrupt").read_bytes() == content
    assert "unreadable" in caplog.text


@pytest.mark.process
def test_a_kill_mid_write_leaves_the_old_state_whole(tmp_path: Path) -> None:
    """A child process writes states in a loop and is SIGKILLed; the file always parses."""
    old = FleetState(rejected=("a" * 64,))
    save_state(tmp_path, old)
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from edge_agent.fleet.state import FleetState, save_state\n"
        "print('ready', flush=True)\n"
        "i = 0\n"
        "while True:\n"
        "    i += 1\n"
        "    save_state(Path(sys.argv[1]), FleetState(rejected=(format(i, '064x'),)))\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        for _ in range(20):
            state = load_state(tmp_path)  # never torn, never set aside
            assert len(state.rejected) == 1
    finally:
        child.kill()
        child.wait()
    assert not (tmp_path / f"{STATE_FILE}.corrupt").exists()
    json.loads((tmp_path / STATE_FILE).read_bytes())


# ---- evidence ---------------------------------------------------------------------------------

SETTINGS = EvidenceConfig(
    window_s=60.0,
    min_frames=100,
    max_detection_drop=0.5,
    min_baseline_detections=0.2,
    max_agreement_drop=0.2,
    min_agreement_checks=20,
    max_escalation_rise=0.25,
    max_fps_drop=0.3,
)


def _window(
    frames: int = 600,
    detections: int = 1200,
    escalated: int = 60,
    checked: int = 100,
    seen: int = 90,
    seconds: float = 60.0,
) -> WindowStats:
    return WindowStats(seconds, frames, detections, escalated, checked, seen)


@pytest.mark.parametrize(
    ("live", "decision", "reason"),
    [
        (_window(), "keep", ""),
        (_window(detections=700), "keep", ""),  # 42 % fewer: inside the 50 % limit
        (_window(detections=12), "roll_back", "detections per frame fell 99%"),
        (_window(seen=60), "roll_back", "cloud agreement with sure tracks fell 0.30"),
        (_window(checked=10, seen=0), "keep", ""),  # too few checks to judge agreement
        (_window(escalated=300), "roll_back", "escalation rate rose 0.40"),
        (_window(frames=300, detections=600, escalated=30, seconds=60.0), "roll_back", "frame"),
        (_window(seconds=30.0, frames=300), "wait", ""),  # window not over yet
        (_window(frames=50), "wait", ""),  # too few frames yet
    ],
)
def test_judge_on_a_table_of_windows(live: WindowStats, decision: str, reason: str) -> None:
    verdict = judge(_window(), live, SETTINGS, waited_s=live.seconds)
    assert verdict.decision == decision, verdict.reasons
    assert reason in verdict.reason()
    assert verdict.evidence["live"] == live.document()


def test_judge_keeps_without_a_baseline_or_after_four_windows_of_too_few_frames() -> None:
    assert judge(None, _window(), SETTINGS, waited_s=60).decision == "keep"
    assert judge(_window(frames=10), _window(), SETTINGS, waited_s=60).decision == "keep"
    few = _window(frames=20, seconds=240.0)
    assert judge(_window(), few, SETTINGS, waited_s=200).decision == "wait"
    assert judge(_window(), few, SETTINGS, waited_s=240).decision == "keep"


def test_a_quiet_camera_does_not_judge_detections() -> None:
    quiet = _window(detections=60)  # 0.1 per frame < min_baseline_detections
    assert judge(quiet, _window(detections=0), SETTINGS, waited_s=60).decision == "keep"


def test_windows_are_differences_of_running_totals_and_survive_a_camera_restart() -> None:
    log = EvidenceLog(keep_s=30.0)
    for second in range(0, 21):
        a = CameraTotals(frames=10 * second, detections=20 * second)
        # camera b restarts at 10 s (a reload): its totals start from zero again
        b = CameraTotals(frames=5 * (second if second < 10 else second - 10))
        log.observe(Sample(float(second), {"a": a, "b": b}))
    window = log.window(5.0, 15.0)
    assert window is not None
    assert window.seconds == 10.0
    # a: 150 - 50; b: 25 -> 45 before its restart, then its new total 25 counts whole
    assert window.frames == 100 + 20 + 25
    assert window.detections_per_frame == pytest.approx(200 / 145)
    assert log.window(20.0, 20.0) is None
    with pytest.raises(ValueError, match="older"):
        log.observe(Sample(3.0, {}))
    first = Sample(0.0, {"a": CameraTotals(frames=5)})
    assert window_between(first, Sample(2.0, {"a": CameraTotals(frames=9)})).fps == 2.0


def test_the_log_forgets_what_is_older_than_it_keeps() -> None:
    log = EvidenceLog(keep_s=5.0)
    for second in range(100):
        log.observe(Sample(float(second), {}))
    oldest = log.at_or_before(0.0)
    assert oldest is not None and oldest.at_s >= 93.0


# ---- boot -------------------------------------------------------------------------------------


def _agent_config(tmp_path: Path, model: Path) -> EdgeAgentConfig:
    return EdgeAgentConfig.model_validate(
        {
            "agent": {"id": "box-1"},
            "cameras": [{"name": "cam", "url": "rtsp://127.0.0.1:8554/x"}],
            "detector": {
                "runtime": {"type": "onnxruntime", "model_path": str(model)},
                "shape_models": [{"type": "onnxruntime", "model_path": str(model)}],
            },
            "fleet": {
                "enabled": True,
                "store_url": "file:///srv/store",
                "trusted_keys": [KEY],
                "state_dir": str(tmp_path / "fleet"),
            },
        }
    )


def _model_path(detector: DetectorConfig) -> Path:
    path = getattr(detector.runtime, "model_path", None)
    assert isinstance(path, Path)
    return path


def test_boot_runs_the_kept_model_only_when_its_hash_still_matches(tmp_path: Path) -> None:
    own = tmp_path / "own.onnx"
    own.write_bytes(b"own")
    config = _agent_config(tmp_path, own)
    current, previous = _record(tmp_path, "new", b"new"), _record(tmp_path, "old", b"old")
    save_state(tmp_path / "fleet", FleetState(current=current, previous=previous))

    booted, state = boot_config(config)
    assert _model_path(booted.detector) == current.path
    assert booted.detector.shape_models == []  # the config's shape exports are its own model's
    assert state.current == current

    current.path.write_bytes(b"tampered")  # the file changed on disk: previous runs
    booted, state = boot_config(config)
    assert _model_path(booted.detector) == previous.path
    assert state.current == previous and load_state(tmp_path / "fleet").current == previous

    previous.path.unlink()  # and that one is gone too: the config's own model
    booted, state = boot_config(config)
    assert booted.detector == config.detector and state.current is None


def test_boot_after_a_power_cut_mid_trial_runs_the_model_before_it(tmp_path: Path) -> None:
    own = tmp_path / "own.onnx"
    own.write_bytes(b"own")
    config = _agent_config(tmp_path, own)
    current, trial = _record(tmp_path, "good", b"good"), _record(tmp_path, "trial", b"trial")
    save_state(
        tmp_path / "fleet",
        FleetState(current=current, trial=Trial(model=trial), attempts={trial.sha256: 1}),
    )
    booted, state = boot_config(config)
    assert _model_path(booted.detector) == current.path
    assert state.trial is None and state.attempts == {trial.sha256: 1}


def test_detector_for_keeps_the_config_settings(tmp_path: Path) -> None:
    own = tmp_path / "own.onnx"
    own.write_bytes(b"own")
    detector = _agent_config(tmp_path, own).detector
    record = _record(tmp_path)
    swapped = detector_for(detector, record)
    assert _model_path(swapped) == record.path
    assert swapped.confidence_threshold == detector.confidence_threshold
    assert detector_for(detector, None) is detector
    assert os.fspath(_model_path(detector)) == os.fspath(own)


# ---- the status page --------------------------------------------------------------------------


def test_the_status_page_shows_the_model_each_camera_runs() -> None:
    from edge_agent.web.page import render_page

    model = {"name": "edge", "version": "2", "runtime": "onnxruntime", "sha256": "a" * 64}
    report = {
        "agent": "box-1",
        "cameras": [
            {"name": "dock", "status": {"state": "streaming", "model": model}, "frame": None},
            {"name": "gate", "status": {"state": "streaming", "model": "junk"}, "frame": None},
        ],
        "events": [],
    }
    page = render_page(report)
    assert '<dt>model</dt><dd data-field="model">edge:2</dd>' in page
    assert '<dd data-field="model">\u2013</dd>' in page  # not a model document: a dash
