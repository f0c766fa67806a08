"""The hybrid loop end to end: RTSP camera, Mosquitto, the cloud service over gRPC, the agent.

Escalated frames must be answered and fused, the alerts must be the scripted ones, and killing
the cloud mid-run must neither stall the edge nor lose an alert; answers resume once it is back.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from testbed.alert_check import load_expected, match_first_loop
from testbed.scenes.writer import SceneFolder
from tests.fixtures.agent_process import (
    PREFIX,
    SCENE_S,
    AgentProcess,
    committed_cloud_document,
    event_payloads,
    scene_agent_document,
    scene_events,
    wait_streaming,
    write_agent_config,
)
from tests.fixtures.cloud_process import CloudProcess
from tests.fixtures.mqtt import MosquittoBroker, MqttRecorder, Received
from tests.fixtures.processes import free_tcp_port
from tests.fixtures.rtsp import RtspServerFactory
from tests.fixtures.scenes import scene_video

AGENT = "hybrid-agent"

pytestmark = pytest.mark.timeout(300)
FIRST_ANSWER_TIMEOUT_S = 60.0  # a 2-core box at load average 13 took over 4 s


def _metric(port: int, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()  # noqa: S310
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _cloud_states(messages: list[Received]) -> list[str]:
    states: list[str] = []
    for message in messages:
        if "/status/" in message.topic:
            state = str(json.loads(message.payload).get("cloud"))
            if not states or states[-1] != state:
                states.append(state)
    return states


def test_hybrid_loop_survives_the_cloud_going_away(
    events_scene: SceneFolder,
    rtsp_server_factory: RtspServerFactory,
    mosquitto_broker: MosquittoBroker,
    tmp_path: Path,
) -> None:
    cloud = CloudProcess(committed_cloud_document(free_tcp_port()), tmp_path)
    cloud.start()
    server = rtsp_server_factory(clip=scene_video(events_scene))
    recorder = MqttRecorder(mosquitto_broker, f"{PREFIX}/#")
    metrics_port = free_tcp_port()
    document = scene_agent_document(
        tmp_path,
        events_scene,
        camera_url=server.url,
        broker=mosquitto_broker,
        agent_id=AGENT,
        status_interval_s=1.0,
    )
    document["metrics"] = {"enabled": True, "listen_port": metrics_port}
    document["escalation"] = {
        "enabled": True,
        "cloud_address": cloud.address,
        "per_camera_frames_per_s": 2.0,
        "per_agent_frames_per_s": 2.0,
        "deadline_ms": 3000,
        "connection": {"reconnect_min_backoff_ms": 200, "reconnect_max_backoff_ms": 1000},
    }
    labels = tmp_path / "labels"
    document["labels"] = {"enabled": True, "directory": str(labels)}
    config = write_agent_config(tmp_path, document)
    agent = AgentProcess(config, tmp_path / "agent.log")
    try:
        wait_streaming(recorder, agent)
        # the cloud's first answer, however long a loaded box takes to give it
        deadline = time.monotonic() + FIRST_ANSWER_TIMEOUT_S
        while time.monotonic() < deadline and not _metric(
            metrics_port, "edge_agent_escalations_total", outcome="answered"
        ):
            time.sleep(0.5)
        frames_start = _metric(metrics_port, "edge_agent_frames_total")
        time.sleep(4.0)
        answered_before = _metric(metrics_port, "edge_agent_escalations_total", outcome="answered")
        frames_before = _metric(metrics_port, "edge_agent_frames_total")
        rate_before = (frames_before - frames_start) / 4.0
        cloud.kill()
        time.sleep(5.0)
        frames_while_down = _metric(metrics_port, "edge_agent_frames_total") - frames_before
        cloud.start()  # same port: the client reconnects on its own
        time.sleep(SCENE_S - 9.0 + 6.0)  # a whole loop after the restart, with margin
        answered_after = _metric(metrics_port, "edge_agent_escalations_total", outcome="answered")
        bytes_by_mode = {
            mode: _metric(metrics_port, "edge_agent_escalation_bytes_total", mode=mode)
            for mode in ("frame", "regions")
        }
        sent = _metric(metrics_port, "edge_agent_escalations_total", outcome="sent")
        sent_reasons = _metric(metrics_port, "edge_agent_escalation_reasons_total", outcome="sent")
    finally:
        code = agent.stop()
        recorder.close()
        cloud.stop()
    log = agent.tail()
    assert code == 0, log

    assert answered_before > 0, log  # escalated frames were answered ...
    assert answered_after > answered_before, log  # ... and again once the cloud was back
    # the edge went on at its own rate alone (not the camera's: a slow or loaded box is behind
    # it; half, as other work on the box comes and goes)
    assert frames_while_down >= 0.5 * rate_before * 5.0 > 0, (rate_before, frames_while_down, log)
    # whole frames by default; the byte budget (500 KB/s) pays for 2 a second: no crops
    assert bytes_by_mode["frame"] > 0 and bytes_by_mode["regions"] == 0, bytes_by_mode
    # every frame sent was sent for at least one reason, and says which (the metric counts a
    # frame under each of its reasons)
    assert sent_reasons >= sent > 0, (sent_reasons, sent)
    states = _cloud_states(recorder.messages)
    assert states[:1] in (["connected"], ["unreachable"]) and "unreachable" in states[1:], states
    assert states[-1] == "connected" or states[-2:] == ["connected", "unreachable"], states

    expected = load_expected(events_scene.root / "events.json")
    _, match = match_first_loop(
        expected, scene_events(event_payloads(recorder.messages)), duration_s=SCENE_S
    )
    assert match.ok, f"{match.report()}\n{log}"
    assert "cloud service unreachable" in log and "cloud service connected" in log
    _check_kept_labels(labels, answered_after)


def _check_kept_labels(folder: Path, answered: float) -> None:
    """Escalated frames were kept with the cloud's boxes, readable by the agent only."""
    assert folder.stat().st_mode & 0o777 == 0o700
    documents = [json.loads(p.read_text()) for p in sorted(folder.rglob("*.json"))]
    assert 0 < len(documents) <= answered * 8  # at most one image per region sent
    for document in documents:
        assert document["schema"] == "edge-labels/v1" and document["agent"] == AGENT
        assert document["edge_model"]["runtime"] == "litert"
        assert document["cloud_model"]["name"] and document["cloud_model"]["version"]
        image = document["image"]
        jpeg = folder.rglob(image["file"])
        data = next(jpeg).read_bytes()
        assert data[:2] == b"\xff\xd8"
        for box in document["boxes"]:
            assert 0 <= box["x1"] < box["x2"] <= image["width"]
            assert 0 <= box["y1"] < box["y2"] <= image["height"]
    assert any(document["boxes"] for document in documents)
