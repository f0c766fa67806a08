"""Alerts against a real Mosquitto broker: payload, availability, Last Will, outage, outbox."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from edge_agent.alerts import SCHEMA, AlertPublisher, EventIds, Outbox
from edge_agent.alerts.payload import encode_event
from edge_agent.config.mqtt import MqttConfig
from edge_agent.rules.engine import NO_TRACK
from tests.fixtures.events import T0, door_event
from tests.fixtures.mqtt import MosquittoBroker, MosquittoBrokerFactory, Received
from tests.fixtures.mqtt import MqttRecorder as Subscriber

REPO_ROOT = Path(__file__).resolve().parents[2]
PREFIX = "va-test"
AGENT = "edge-01"


def _config(broker: MosquittoBroker, outbox: Path) -> MqttConfig:
    return MqttConfig(
        host=broker.host, port=broker.port, topic_prefix=PREFIX, keepalive_s=5, outbox_path=outbox
    )


def _publisher(broker: MosquittoBroker, outbox: Path) -> AlertPublisher:
    return AlertPublisher(_config(broker, outbox), AGENT, reconnect_min_s=1, reconnect_max_s=1)


EVENTS_TOPIC = f"{PREFIX}/{AGENT}/events/cam-1/door-enter"
AVAILABILITY = f"{PREFIX}/{AGENT}/availability"


def test_event_ids_are_stable_over_the_lifecycle() -> None:
    ids = EventIds(AGENT)
    loiter = {"rule": "linger", "kind": "loiter", "zone": "door"}
    start = ids.id_for(door_event(3, phase="start", **loiter))
    end = ids.id_for(door_event(3, phase="end", timestamp_s=T0 + 30, **loiter))
    assert start == end and len(ids) == 0
    occ = {"rule": "crowd", "kind": "zone_occupancy", "track_id": NO_TRACK, "box": None}
    first = ids.id_for(door_event(phase="start", count=3, **occ))
    update = ids.id_for(door_event(phase="update", count=4, timestamp_s=T0 + 1, **occ))
    last = ids.id_for(door_event(phase="end", count=1, timestamp_s=T0 + 2, **occ))
    assert first == update == last != start
    assert ids.id_for(door_event(phase="start", timestamp_s=T0 + 5, **occ)) != first
    assert (
        ids.id_for(door_event(1))
        == EventIds(AGENT).id_for(door_event(1))
        != ids.id_for(door_event(2))
    )


def test_event_topic_payload_qos_and_retain(
    mosquitto_broker: MosquittoBroker, tmp_path: Path
) -> None:
    sub = Subscriber(mosquitto_broker, f"{PREFIX}/#")
    pub = _publisher(mosquitto_broker, tmp_path / "outbox.sqlite3")
    pub.start()
    event = door_event(label="person", frame_size=(640, 480))
    try:
        pub.publish_event(event)
        sub.wait_for(lambda ms: any(m.topic == EVENTS_TOPIC for m in ms))
        assert pub.flush(5) and pub.outbox.depth() == 0
    finally:
        pub.close()
        sub.close()
    (msg,) = sub.on(EVENTS_TOPIC)
    assert (msg.qos, msg.retain) == (1, False)
    body = json.loads(msg.payload)
    assert body == {
        "schema": SCHEMA,
        "event_id": EventIds(AGENT).id_for(event),
        "phase": "start",
        "rule": "door-enter",
        "kind": "zone_enter",
        "camera": "cam-1",
        "agent": AGENT,
        "track_id": 7,
        "class": 0,
        "label": "person",
        "timestamp": "2025-11-30T06:55:50.125Z",
        "box": [10.0, 20.0, 110.0, 220.0],
        "frame_size": [640, 480],
        "direction": None,
        "zone": "door",
        "line": None,
        "count": None,
    }
    assert list(body) == [  # key order as documented
        "schema", "event_id", "phase", "rule", "kind", "camera", "agent", "track_id", "class",
        "label", "timestamp", "box", "frame_size", "direction", "zone", "line", "count",
    ]  # fmt: skip
    assert body["schema"] == "edge-alert/v1"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"label": "person", "frame_size": (1920, 1080)},
            {"class": 0, "label": "person", "box": [10.0, 20.0, 110.0, 220.0],
             "frame_size": [1920, 1080]},
        ),
        (  # float32 noise is rounded away to 0.1 px
            {"box": (10.04999, 20.450001, 110.96, 219.99998), "label": "car", "class_id": 1,
             "frame_size": (640, 272)},
            {"class": 1, "label": "car", "box": [10.0, 20.5, 111.0, 220.0],
             "frame_size": [640, 272]},
        ),
        (  # a class the detector has no name for
            {"class_id": 85, "label": None, "frame_size": (640, 480)},
            {"class": 85, "label": None, "box": [10.0, 20.0, 110.0, 220.0],
             "frame_size": [640, 480]},
        ),
        (  # occupancy is about a zone: no class, no label, no box, but the frame's size
            {"track_id": NO_TRACK, "class_id": NO_TRACK, "kind": "zone_occupancy", "box": None,
             "count": 3, "label": None, "frame_size": (640, 480)},
            {"class": None, "label": None, "box": None, "frame_size": [640, 480]},
        ),
        (  # an event made without them (older producers): both null
            {},
            {"class": 0, "label": None, "box": [10.0, 20.0, 110.0, 220.0], "frame_size": None},
        ),
    ],
    ids=["named", "rounded", "unnamed-class", "occupancy", "without-label-and-size"],
)  # fmt: skip
def test_payload_label_rounded_box_and_frame_size(
    fields: dict[str, Any], expected: dict[str, object]
) -> None:
    body = json.loads(encode_event(door_event(**fields), AGENT, "id-1"))
    assert {key: body[key] for key in expected} == expected
    assert body["schema"] == SCHEMA == "edge-alert/v1"  # fields were added: still v1


def test_availability_is_retained_for_late_subscribers(
    mosquitto_broker: MosquittoBroker, tmp_path: Path
) -> None:
    pub = _publisher(mosquitto_broker, tmp_path / "outbox.sqlite3")
    pub.start()
    assert pub.wait_connected(10)
    pub.publish_status("cam-1", {"state": "streaming", "fps": 15})
    assert pub.flush(5)
    late = Subscriber(mosquitto_broker, f"{PREFIX}/{AGENT}/#")
    late.wait_for(lambda ms: len(ms) >= 2)
    assert late.on(AVAILABILITY) == [Received(AVAILABILITY, b"online", 1, True)]
    (status,) = late.on(f"{PREFIX}/{AGENT}/status/cam-1")
    body = json.loads(status.payload)
    expires = datetime.fromisoformat(body.pop("expires_at")).timestamp()
    assert status.retain and body == {"fps": 15, "state": "streaming"}
    assert expires - time.time() == pytest.approx(3 * 30.0, abs=5.0)  # 3x status_interval_s
    late.close()
    pub.close()
    later = Subscriber(mosquitto_broker, AVAILABILITY)
    later.wait_for(lambda ms: len(ms) >= 1)
    later.close()
    assert later.on(AVAILABILITY) == [Received(AVAILABILITY, b"offline", 1, True)]


_CHILD = """
import sys, time
from edge_agent.alerts import AlertPublisher
from edge_agent.config.mqtt import MqttConfig
host, port, outbox = sys.argv[1], int(sys.argv[2]), sys.argv[3]
config = MqttConfig(
    host=host, port=port, topic_prefix="va-test", outbox_path=outbox, status_ttl_s=4
)
publisher = AlertPublisher(config, "edge-01")
publisher.start()
if not publisher.wait_connected(10):
    sys.exit(2)
publisher.publish_status("cam-1", {"state": "streaming", "cloud": "connected"})
if not publisher.flush(10):
    sys.exit(3)
sys.stdout.write("ready\\n")
sys.stdout.flush()
time.sleep(60)
"""


def test_a_dead_agent_reads_offline_and_its_statuses_expire(
    mosquitto_broker: MosquittoBroker, tmp_path: Path
) -> None:
    """kill -9: the Last Will says `offline`, and the retained `streaming` status, published
    with an MQTT 5 expiry, is gone from the broker once it expires (a user found it stayed)."""
    sub = Subscriber(mosquitto_broker, AVAILABILITY)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _CHILD,
            mosquitto_broker.host,
            str(mosquitto_broker.port),
            str(tmp_path / "outbox.sqlite3"),
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        sub.wait_for(lambda ms: [m.payload for m in ms] == [b"online"])
        child.kill()  # SIGKILL: no clean disconnect, the broker sends the Last Will
        child.wait(10)
        sub.wait_for(lambda ms: [m.payload for m in ms] == [b"online", b"offline"])
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
        sub.close()
    status_topic = f"{PREFIX}/{AGENT}/status/cam-1"
    before = Subscriber(mosquitto_broker, status_topic)
    before.wait_for(lambda ms: len(ms) >= 1)  # still there right after the crash
    before.close()
    (status,) = before.messages
    assert json.loads(status.payload)["state"] == "streaming"
    expires = datetime.fromisoformat(json.loads(status.payload)["expires_at"]).timestamp()
    time.sleep(max(0.0, expires - time.time() + 1.0))  # past the status's 4 s expiry
    late = Subscriber(mosquitto_broker, f"{PREFIX}/{AGENT}/#")
    late.wait_for(lambda ms: len(ms) >= 1)
    time.sleep(0.5)  # any other retained message would have come with it
    late.close()
    assert late.messages == [Received(AVAILABILITY, b"offline", 1, True)]


@pytest.mark.process
def test_broker_outage_loses_nothing_and_keeps_order(
    mosquitto_broker_factory: MosquittoBrokerFactory, tmp_path: Path
) -> None:
    # Broker persistence keeps the subscriber's session (and its queue) across the restart, so the
    # subscriber misses nothing however fast the publisher reconnects.
    store = tmp_path / "broker-store"
    store.mkdir()
    broker = mosquitto_broker_factory(
        extra_config=("persistence true", f"persistence_location {store}/")
    )
    sub = Subscriber(
        broker, f"{PREFIX}/{AGENT}/events/#", client_id="sub-outage", clean_session=False
    )
    pub = _publisher(broker, tmp_path / "outbox.sqlite3")
    pub.start()
    try:
        pub.publish_event(door_event(0))
        sub.wait_for(lambda ms: len(ms) == 1)
        broker.stop()
        for track_id in range(1, 6):
            pub.publish_event(door_event(track_id, timestamp_s=T0 + track_id))
        assert pub.outbox.depth() == 5  # nothing acknowledged while the broker is down
        broker.start()
        sub.wait_for(lambda ms: len(ms) >= 6, timeout_s=15)
        assert pub.flush(10) and pub.outbox.depth() == 0
    finally:
        pub.close()
        sub.close()
    tracks = [json.loads(m.payload)["track_id"] for m in sub.messages]
    assert tracks == [0, 1, 2, 3, 4, 5], broker.log_tail()


def test_outbox_persists_across_publisher_instances(
    mosquitto_broker: MosquittoBroker, tmp_path: Path
) -> None:
    path = tmp_path / "outbox.sqlite3"
    mosquitto_broker.stop()
    first = _publisher(mosquitto_broker, path)
    first.start()
    for track_id in range(3):
        first.publish_event(door_event(track_id))
    first.close(timeout_s=0.2)  # broker down: the events stay on disk
    assert Outbox(path).depth() == 3

    mosquitto_broker.start()
    sub = Subscriber(mosquitto_broker, f"{PREFIX}/{AGENT}/events/#")
    second = _publisher(mosquitto_broker, path)
    second.start()
    try:
        sub.wait_for(lambda ms: len(ms) >= 3)
        assert second.flush(5)
    finally:
        second.close()
        sub.close()
    assert [json.loads(m.payload)["track_id"] for m in sub.messages] == [0, 1, 2]
    assert Outbox(path).depth() == 0


def test_outbox_bounds_drop_the_oldest_and_count(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / "outbox.sqlite3"
    box = Outbox(path, max_rows=3, max_age_s=60, clock=lambda: now[0])
    ids = [box.put(f"t/{i}", f"p{i}".encode(), 1, i % 2 == 0) for i in range(5)]
    assert box.depth() == 3 and box.dropped == 2
    rows = box.peek(10)
    assert [r.id for r in rows] == ids[2:]
    assert [(r.topic, r.payload, r.qos, r.retain) for r in rows][0] == ("t/2", b"p2", 1, True)
    assert box.ack([ids[2], 99_999]) == 1 and box.depth() == 2
    box.close()

    reopened = Outbox(path, max_rows=3, max_age_s=60, clock=lambda: now[0])
    assert reopened.depth() == 2 and reopened.dropped == 2
    assert reopened.peek(1)[0].id == ids[3]
    now[0] += 61  # both left rows expire
    assert reopened.peek(10) == [] and reopened.dropped == 4
    with pytest.raises(ValueError, match="max_rows"):
        Outbox(path, max_rows=0)
    reopened.close()


def test_outbox_deletes_messages_past_their_own_expiry_unsent(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:  # a file from before messages could expire
        db.execute(
            "CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL,"
            " payload BLOB NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL,"
            " created_s REAL NOT NULL)"
        )
        db.execute("INSERT INTO outbox (topic, payload, qos, retain, created_s) VALUES"
                   " ('t/old', x'00', 1, 0, 999.0)")  # fmt: skip
    box = Outbox(path, clock=lambda: now[0])
    box.put("t/status", b"{}", 1, True, expires_s=1010.0)
    box.put("t/event", b"{}", 1, False)
    assert [(r.topic, r.expires_s) for r in box.peek(10)] == [
        ("t/old", None),
        ("t/status", 1010.0),
        ("t/event", None),
    ]
    now[0] = 1011.0  # the status is no longer true: it goes unsent, and is no loss
    assert [r.topic for r in box.peek(10)] == ["t/old", "t/event"] and box.dropped == 0
    box.close()
