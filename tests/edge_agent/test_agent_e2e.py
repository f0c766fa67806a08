"""The edge agent as a service, end to end: real RTSP server, real Mosquitto, real models.

The camera serves the generated `events` scene (it loops); the agent runs as `edge-agent run` in
a subprocess; a separate MQTT client records everything the agent publishes. The alerts must be
exactly the scripted events (rule kind, class, zone/line, direction, order), also across a
broker outage and a camera server that dies and comes back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.alert_check import SCENE_CAMERA, load_expected, match_first_loop
from testbed.scenes.writer import SceneFolder
from tests.fixtures.agent_process import (
    PREFIX,
    SCENE_S,
    AgentProcess,
    event_payloads,
    scene_agent_document,
    scene_events,
    status_states,
    wait_streaming,
    write_agent_config,
)
from tests.fixtures.mqtt import MosquittoBroker, MosquittoBrokerFactory, MqttRecorder
from tests.fixtures.rtsp import RtspServerFactory
from tests.fixtures.scenes import scene_video

AGENT = "e2e-agent"

pytestmark = pytest.mark.timeout(240)


def _write_config(tmp_path: Path, scene: SceneFolder, url: str, broker: MosquittoBroker) -> Path:
    document = scene_agent_document(
        tmp_path, scene, camera_url=url, broker=broker, agent_id=AGENT, status_interval_s=2.0
    )
    return write_agent_config(tmp_path, document)


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
        wait_streaming(recorder, agent)
        time.sleep(SCENE_S + 2.0)
    finally:
        code = agent.stop()
    assert code == 0, agent.tail()

    expected = load_expected(events_scene.root / "events.json")
    observed = scene_events(event_payloads(recorder.messages))
    _, match = match_first_loop(expected, observed, duration_s=SCENE_S)
    assert match.ok, f"{match.report()}\n--- agent log ---\n{agent.tail()}"

    availability = [m.payload for m in recorder.messages if m.topic.endswith("/availability")]
    assert availability[0] == b"online" and availability[-1] == b"offline"
    assert (
        status_states(recorder.payloads(f"{PREFIX}/{AGENT}/status/{SCENE_CAMERA}"))[-1] == "stopped"
    )


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
        wait_streaming(recorder, agent)
        time.sleep(3.0)
        broker.stop()  # the outbox holds what the rules raise meanwhile
        time.sleep(4.0)
        broker.start()
        time.sleep(SCENE_S - 7.0 + 2.0)
        server.kill()  # the camera dies mid-stream ...
        killed_at = len(recorder.messages)
        time.sleep(4.0)
        server.start()  # ... and comes back; its new session starts the scene again
        wait_streaming(recorder, agent, after=killed_at)
        restarted_at = time.time()
        time.sleep(SCENE_S + 2.0)
    finally:
        code = agent.stop()
        recorder.close()
    assert code == 0, agent.tail()

    expected = load_expected(events_scene.root / "events.json")
    payloads = event_payloads(recorder.messages)
    observed = scene_events(payloads)
    _, first = match_first_loop(expected, observed, duration_s=SCENE_S)
    assert first.ok, f"first pass (broker outage):\n{first.report()}\n{agent.tail()}"
    after_restart = [e for e in observed if e.time_s >= restarted_at - 1.0]
    _, second = match_first_loop(expected, after_restart, duration_s=SCENE_S)
    assert second.ok, f"after the camera restart:\n{second.report()}\n{agent.tail()}"

    # The outbox delivers in order: event times never go backwards on the camera's topics.
    times = [e.time_s for e in observed]
    assert times == sorted(times)
    states = status_states(recorder.payloads(f"{PREFIX}/{AGENT}/status/{SCENE_CAMERA}"))
    restart = states.index("stalled")
    assert "reconnecting" in states[restart:] and "streaming" in states[restart:], states
    # At least once, but nothing was sent twice here (a loiter's start and end share an id).
    sent = [(p["event_id"], p["phase"]) for p in payloads]
    assert len(sent) == len(set(sent))
