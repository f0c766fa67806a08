"""Config reload: the plan (pure), and a running agent that adds, changes and removes a real RTSP
camera while the untouched camera's alerts keep flowing, exactly as without reloads."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from edge_agent.alerts.payload import event_payload, status_topic
from edge_agent.config import EdgeAgentConfig
from edge_agent.pipeline import EdgeAgent, FrameOutcome
from edge_agent.pipeline.reload import ReloadRefused, plan_reload
from edge_agent.run_command import reload_from_file
from testbed.alert_check import load_expected, match_events, observed_from_payloads
from testbed.scenes.writer import SceneFolder
from tests.edge_agent.test_run_command import CLASS_NAMES, _document
from tests.fixtures.mqtt import MosquittoBroker, MqttRecorder
from tests.fixtures.rtsp import RtspServer

BASE: dict[str, Any] = {
    "agent": {"id": "box-1"},
    "cameras": [
        {"name": "a", "url": "rtsp://10.0.0.1/a"},
        {"name": "b", "url": "rtsp://10.0.0.1/b"},
        {"name": "c", "url": "rtsp://10.0.0.1/c", "enabled": False},
    ],
    "detector": {"runtime": {"type": "onnxruntime", "model_path": "m.onnx"}},
}


def _config(change: dict[str, Any] | None = None, **cameras: dict[str, Any] | None) -> Any:
    document = yaml.safe_load(yaml.safe_dump(BASE))
    document.update(change or {})
    by_name = {camera["name"]: camera for camera in document["cameras"]}
    for name, fields in cameras.items():
        if fields is None:
            del by_name[name]
        else:
            by_name.setdefault(name, {"name": name}).update(fields)
    document["cameras"] = list(by_name.values())
    return EdgeAgentConfig.model_validate(document)


def test_plan_names_added_removed_restarted_and_untouched_cameras() -> None:
    old = _config()
    new = _config(
        a={"target_fps": 5.0},  # changed: restarts alone
        b=None,  # removed
        c={"enabled": True},  # enabled: added
        d={"url": "rtsp://10.0.0.1/d"},  # added
    )
    plan = plan_reload(old, new)
    assert (plan.added, plan.removed, plan.changed, plan.unchanged) == (
        ("c", "d"),
        ("b",),
        ("a",),
        (),
    )
    assert plan.summary() == "added c, d; removed b; restarted a; 0 camera(s) untouched"
    same = plan_reload(old, _config(b={"enabled": True}))
    assert same.empty and same.unchanged == ("a", "b")
    disabled = plan_reload(old, _config(b={"enabled": False}))
    assert disabled.removed == ("b",) and disabled.unchanged == ("a",)


def test_a_change_outside_cameras_is_refused_whole() -> None:
    new = _config({"tracker": {"n_init": 5}}, d={"url": "rtsp://10.0.0.1/d"})
    with pytest.raises(ReloadRefused, match="need a restart: tracker; nothing was applied"):
        plan_reload(_config(), new)


def _write(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _wait(condition: Any, what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def test_cameras_come_and_go_while_the_untouched_one_keeps_its_alerts(
    events_scene: SceneFolder,
    mosquitto_broker: MosquittoBroker,
    rtsp_server: RtspServer,
    tmp_path: Path,
) -> None:
    document = _document(events_scene, mosquitto_broker.port, tmp_path)
    document["mqtt"]["status_interval_s"] = 1.0
    good = document["cameras"][0]
    good["file_replay"] = "every_frame"  # its events are then exact: any reset would show
    path = _write(tmp_path / "agent.yaml", document)
    agent = EdgeAgent.from_config(EdgeAgentConfig.model_validate(document))
    outcomes: list[FrameOutcome] = []
    arrivals: list[tuple[str, float]] = []

    def hook(outcome: FrameOutcome) -> None:
        outcomes.append(outcome)
        arrivals.append((outcome.camera, time.monotonic()))

    agent.hooks.append(hook)
    untouched = agent.workers[0]
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    agent.start()
    runner.start()
    second = {
        "name": "street",
        "url": rtsp_server.url,
        "target_fps": 5.0,
        "zones": [{"name": "left", "points": [[0, 0], [0.5, 0], [0.5, 1], [0, 1]]}],
        "rules": [{"name": "in-left", "kind": "zone_enter", "zone": "left"}],
    }
    outcomes_of = lambda name: [o for o in outcomes if o.camera == name]  # noqa: E731
    try:
        _wait(lambda: len(outcomes) >= 25, "the first camera runs")
        document["cameras"].append(second)
        added = reload_from_file(agent, _write(path, document))
        assert added.ok and added.plan is not None and added.plan.added == ("street",), added
        _wait(lambda: len(outcomes_of("street")) >= 3, "the added RTSP camera is analysed")
        first_build = agent.workers[1]

        second["zones"][0]["points"] = [[0.5, 0], [1, 0], [1, 1], [0.5, 1]]
        changed = reload_from_file(agent, _write(path, document))
        assert changed.plan is not None and changed.plan.changed == ("street",), changed
        assert agent.workers[1] is not first_build and agent.workers[0] is untouched
        seen = len(outcomes_of("street"))
        _wait(lambda: len(outcomes_of("street")) >= seen + 3, "the restarted camera runs")

        path.write_text(path.read_text().replace("target_fps: 5.0", "target_fps: 500"))
        bad = reload_from_file(agent, path)
        assert not bad.ok and "target_fps" in str(bad.error) and "agent.yaml:" in str(bad.error)
        refused = {**document, "tracker": {**document["tracker"], "n_init": 3}}
        other = reload_from_file(agent, _write(path, refused))
        assert not other.ok and "tracker" in str(other.error)
        assert [w.name for w in agent.workers] == [good["name"], "street"]

        document["cameras"].remove(second)
        removed = reload_from_file(agent, _write(path, document))
        assert removed.plan is not None and removed.plan.removed == ("street",), removed
        assert [w.name for w in agent.workers] == [good["name"]] and "street" not in agent.status
        _wait(lambda: untouched.state == "stopped", "the first camera ends its clip", 40.0)
    finally:
        stop.set()
        runner.join(10)
        agent.close()

    # The untouched camera: every frame analysed, never held up by a reload, same alerts as
    # without any reload (its tracks were kept: a reset would lose or repeat events).
    mine = [o for o in outcomes if o.camera == good["name"]]
    assert [o.frame.index for o in mine] == list(range(len(mine)))
    times = [t for name, t in arrivals if name == good["name"]]
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) < 1.0
    payloads = [event_payload(e, "a", "id") for o in mine for e in o.events]
    observed = observed_from_payloads(payloads, CLASS_NAMES, mine[0].frame.capture_time_s)
    match = match_events(load_expected(events_scene.root / "events.json"), observed)
    assert match.ok, match.report()
    # The removed camera's retained status is gone from the broker.
    topic = status_topic(agent.config.mqtt.topic_prefix, agent.config.agent.id, "street")
    late = MqttRecorder(mosquitto_broker, topic)
    time.sleep(1.0)
    late.close()
    assert late.messages == []
