"""The edge agent as a service, end to end: real RTSP server, real Mosquitto, real models.

The camera serves the generated `events` scene (it loops); the agent runs as `edge-agent run` in
a subprocess; a separate MQTT client records everything the agent publishes. The alerts must be
exactly the scripted events (rule kind, class, zone/line, direction, order), also across a
broker outage and a camera server that dies and comes back.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.alert_check import (
    SCENE_CAMERA,
    SceneEvent,
    load_expected,
    match_first_loop,
    observed_from_payloads,
    scene_agent_config,
)
from testbed.scenes.writer import SceneFolder
from tests.fixtures.mqtt import MosquittoBroker, MosquittoBrokerFactory, MqttRecorder, Received
from tests.fixtures.rtsp import RtspServerFactory
from tests.fixtures.scenes import scene_video

REPO_ROOT = Path(__file__).resolve().parents[2]
EDGE_MODEL = REPO_ROOT / "models" / "edge" / "edge-yolov5n-320-int8.tflite"
CLASS_NAMES = ["person", "car", "truck", "forklift"]
PREFIX = "e2e"
AGENT = "e2e-agent"
SCENE_S = 14.4  # 360 frames at 25 fps

pytestmark = pytest.mark.timeout(240)


class AgentProcess:
    """`edge-agent run` in a subprocess, its log in a file."""

    def __init__(self, config: Path, log: Path) -> None:
        self.log = log
        self._log_file = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "edge_agent", "run", "--config", str(config)],
            cwd=REPO_ROOT,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then wait; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        finally:
            self._log_file.close()

    def tail(self, lines: int = 60) -> str:
        """The end of the agent's log."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _write_config(tmp_path: Path, scene: SceneFolder, url: str, broker: MosquittoBroker) -> Path:
    document = scene_agent_config(
        scene.root,
        camera_url=url,
        model_path=EDGE_MODEL,
        class_names=CLASS_NAMES,
        mqtt_port=broker.port,
        outbox_path=tmp_path / "outbox.sqlite3",
        agent_id=AGENT,
    )
    document["mqtt"]["topic_prefix"] = PREFIX
    document["mqtt"]["status_interval_s"] = 2.0
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _events(messages: list[Received]) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in messages if "/events/" in m.topic]


def _statuses(messages: list[Received]) -> list[str]:
    states = []
    for message in messages:
        if "/status/" in message.topic:
            state = json.loads(message.payload)["state"]
            if not states or states[-1] != state:
                states.append(state)
    return states


def _scene_events(payloads: list[dict[str, Any]]) -> list[SceneEvent]:
    return observed_from_payloads(payloads, CLASS_NAMES, start_time_s=0.0)


def _wait_streaming(recorder: MqttRecorder, agent: AgentProcess, after: int = 0) -> None:
    def streaming(messages: list[Received]) -> bool:
        return agent.process.poll() is not None or "streaming" in _statuses(messages[after:])

    recorder.wait_for(streaming, timeout_s=60)
    assert agent.process.poll() is None, agent.tail()


@pytest.fixture
def recorder(mosquitto_broker: MosquittoBroker) -> Iterator[MqttRecorder]:
    rec = MqttRecorder(mosquitto_broker, f"{PREFIX}/#")
    yield rec
    rec.close()


def test_agent_raises_exactly_the_scripted_alerts(
    events_scene: SceneFolder,
    rtsp_server_factory: RtspServerFactory,
    mosquitto_broker: MosquittoBroker,
    recorder: MqttRecorder,
    tmp_path: Path,
) -> None:
    server = rtsp_server_factory(clip=scene_video(events_scene))
    agent = AgentProcess(
        _write_config(tmp_path, events_scene, server.url, mosquitto_broker), tmp_path / "agent.log"
    )
    try:
        _wait_streaming(recorder, agent)
        time.sleep(SCENE_S + 2.0)
    finally:
        code = agent.stop()
    assert code == 0, agent.tail()

    expected = load_expected(events_scene.root / "events.json")
    observed = _scene_events(_events(recorder.messages))
    _, match = match_first_loop(expected, observed, duration_s=SCENE_S)
    assert match.ok, f"{match.report()}\n--- agent log ---\n{agent.tail()}"

    availability = [m.payload for m in recorder.messages if m.topic.endswith("/availability")]
    assert availability[0] == b"online" and availability[-1] == b"offline"
    assert _statuses(recorder.payloads(f"{PREFIX}/{AGENT}/status/{SCENE_CAMERA}"))[-1] == "stopped"


def test_agent_loses_no_alert_across_broker_and_camera_restarts(
    events_scene: SceneFolder,
    rtsp_server_factory: RtspServerFactory,
    mosquitto_broker_factory: MosquittoBrokerFactory,
    tmp_path: Path,
) -> None:
    store = tmp_path / "broker-store"
    store.mkdir()
    broker = mosquitto_broker_factory(
        extra_config=("persistence true", f"persistence_location {store}/")
    )
    # A persistent session: the broker queues what arrives while this client reconnects.
    recorder = MqttRecorder(broker, f"{PREFIX}/#", client_id="e2e-recorder", clean_session=False)
    server = rtsp_server_factory(clip=scene_video(events_scene))
    agent = AgentProcess(
        _write_config(tmp_path, events_scene, server.url, broker), tmp_path / "agent.log"
    )
    try:
        _wait_streaming(recorder, agent)
        time.sleep(3.0)
        broker.stop()  # the outbox holds what the rules raise meanwhile
        time.sleep(4.0)
        broker.start()
        time.sleep(SCENE_S - 7.0 + 2.0)
        server.kill()  # the camera dies mid-stream ...
        killed_at = len(recorder.messages)
        time.sleep(4.0)
        server.start()  # ... and comes back; its new session starts the scene again
        _wait_streaming(recorder, agent, after=killed_at)
        restarted_at = time.time()
        time.sleep(SCENE_S + 2.0)
    finally:
        code = agent.stop()
        recorder.close()
    assert code == 0, agent.tail()

    expected = load_expected(events_scene.root / "events.json")
    payloads = _events(recorder.messages)
    observed = _scene_events(payloads)
    _, first = match_first_loop(expected, observed, duration_s=SCENE_S)
    assert first.ok, f"first pass (broker outage):\n{first.report()}\n{agent.tail()}"
    after_restart = [e for e in observed if e.time_s >= restarted_at - 1.0]
    _, second = match_first_loop(expected, after_restart, duration_s=SCENE_S)
    assert second.ok, f"after the camera restart:\n{second.report()}\n{agent.tail()}"

    # The outbox delivers in order: event times never go backwards on the camera's topics.
    times = [e.time_s for e in observed]
    assert times == sorted(times)
    states = _statuses(recorder.payloads(f"{PREFIX}/{AGENT}/status/{SCENE_CAMERA}"))
    restart = states.index("stalled")
    assert "reconnecting" in states[restart:] and "streaming" in states[restart:], states
    # At least once, but nothing was sent twice here (a loiter's start and end share an id).
    sent = [(p["event_id"], p["phase"]) for p in payloads]
    assert len(sent) == len(set(sent))
