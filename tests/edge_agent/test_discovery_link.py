"""A running agent's integrations: Home Assistant discovery (configs and live zone states on a
real broker, and what a reload removes) and the webhook sink (the same payloads as MQTT, over
real HTTP)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from edge_agent.alerts.homeassistant import discovery_messages, zone_state_topic
from edge_agent.config import EdgeAgentConfig
from edge_agent.metrics import EdgeMetrics
from edge_agent.pipeline import EdgeAgent
from testbed.alert_check import SCENE_CAMERA
from testbed.scenes.writer import SceneFolder
from tests.edge_agent.test_run_command import _document
from tests.fixtures.mqtt import MosquittoBroker, MqttRecorder


class _Hook(BaseHTTPRequestHandler):
    bodies: list[bytes]

    def do_POST(self) -> None:
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def webhook_receiver() -> Iterator[tuple[str, list[bytes]]]:
    bodies: list[bytes] = []
    handler = type("Hook", (_Hook,), {"bodies": bodies})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", bodies
    server.shutdown()
    server.server_close()


def test_agent_announces_entities_and_publishes_zone_changes_only(
    events_scene: SceneFolder,
    mosquitto_broker: MosquittoBroker,
    tmp_path: Path,
    webhook_receiver: tuple[str, list[bytes]],
) -> None:
    document = _document(events_scene, mosquitto_broker.port, tmp_path)
    document["homeassistant"] = {"enabled": True}
    url, posted = webhook_receiver
    document["webhook"] = {"url": url, "min_backoff_s": 0.1}
    document["media"] = {"enabled": True, "directory": str(tmp_path / "media")}
    document["cameras"][0]["file_replay"] = "every_frame"
    config = EdgeAgentConfig.model_validate(document)
    prefix, agent_id = config.mqtt.topic_prefix, config.agent.id
    zone_topic = zone_state_topic(prefix, agent_id, SCENE_CAMERA, "zone-a")
    recorder = MqttRecorder(mosquitto_broker, "#")
    metrics = EdgeMetrics()
    agent = EdgeAgent.from_config(config, metrics=metrics)
    analysed = [0]
    agent.hooks.append(lambda _outcome: analysed.__setitem__(0, analysed[0] + 1))
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    agent.start()
    runner.start()
    try:
        deadline = time.monotonic() + 40.0
        while agent.workers[0].state != "stopped" and time.monotonic() < deadline:
            time.sleep(0.2)
        # a reload renames the zone: the old one's entities and state are removed
        renamed = document | {"cameras": [json.loads(json.dumps(document["cameras"][0]))]}
        camera = renamed["cameras"][0]
        camera["zones"][0]["name"] = "zone-b"
        for rule in camera["rules"]:
            if rule.get("zone") == "zone-a":
                rule["zone"] = "zone-b"
        new = EdgeAgentConfig.model_validate(renamed)
        plan = agent.request_reload(new).result(10)
        assert plan.changed == (SCENE_CAMERA,)
    finally:
        stop.set()
        runner.join(10)
        agent.close()
    time.sleep(0.5)
    recorder.close()

    announced = {m.topic for m in discovery_messages(config, config.homeassistant)}
    received = {m.topic for m in recorder.messages if m.topic.startswith("homeassistant/")}
    assert announced <= received
    states = [m.payload for m in recorder.on(zone_topic)]
    counts = [json.loads(p)["count"] for p in states[:-1]]
    # empty at start, then up to 3 people at once (a lost track counts where it was last seen
    # until the tracker forgets it), one message per change, not per frame
    assert counts[0] == 0 and 2 <= max(counts) <= 5, counts
    assert all(a != b for a, b in zip(counts, counts[1:], strict=False))
    assert len(states) < analysed[0] / 10
    assert states[-1] == b""  # the renamed zone's state is cleared
    kept = {m.topic for m in discovery_messages(new, new.homeassistant)}
    removed = [m for m in recorder.messages if m.topic in announced - kept]
    assert removed and all(m.payload == b"" for m in removed[-len(announced - kept) :])
    assert recorder.on(zone_state_topic(prefix, agent_id, SCENE_CAMERA, "zone-b"))
    # the webhook got exactly the payloads MQTT got, in the same order
    mqtt_events = [m.payload for m in recorder.messages if "/events/" in m.topic]
    assert mqtt_events and posted == mqtt_events
    # the sinks' own counts reach Prometheus (refreshed every second while the loop ran)
    sample = metrics.registry.get_sample_value
    sent = sample("edge_agent_webhook_events_total", {"outcome": "sent"})
    assert sent is not None and 0 < sent <= len(posted)
    written = sample("edge_agent_media_files_total")
    assert written is not None and written > 0
    assert sample("edge_agent_media_lost_total", {"reason": "dropped"}) == 0
