"""Home Assistant MQTT discovery: payloads checked against HA's own schemas, removal on config
change, retained delivery through a real Mosquitto, and the value templates rendered with Jinja
against real `edge-alert/v1` payloads."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from edge_agent.alerts import AlertPublisher, EventIds
from edge_agent.alerts.homeassistant import (
    PHASES,
    DiscoveryMessage,
    discovery_messages,
    encode_discovery,
    encode_zone_state,
    removal_messages,
    zone_state_topic,
)
from edge_agent.alerts.payload import availability_topic, encode_event, event_topic
from edge_agent.config import EdgeAgentConfig
from edge_agent.config.homeassistant import HomeAssistantConfig
from edge_agent.config.mqtt import MqttConfig
from edge_agent.rules.engine import NO_TRACK
from tests.fixtures.events import T0, door_event
from tests.fixtures.mqtt import MosquittoBroker, MqttRecorder

PREFIX = "va-test"
AGENT = "edge-01"
HA = HomeAssistantConfig(enabled=True, support_url="https://example.org/edge-agent")
AVAILABILITY = availability_topic(PREFIX, AGENT)

# --- What Home Assistant accepts, from home-assistant/core `dev` (2026, the version with
# `default_entity_id` and without `object_id`), homeassistant/components/mqtt/:
# schemas.py: `_MQTT_AVAILABILITY_SINGLE_SCHEMA`, `_MQTT_AVAILABILITY_LIST_SCHEMA` and
# `MQTT_ENTITY_COMMON_SCHEMA`, extended by every entity platform.
COMMON_KEYS = frozenset(
    {
        "availability_topic", "availability_template", "payload_available",
        "payload_not_available", "availability_mode", "availability",
        "device", "entity_picture", "origin", "enabled_by_default", "entity_category", "icon",
        "json_attributes_topic", "json_attributes_template", "default_entity_id",
        "message_expiry_interval", "unique_id", "visible_by_default",
    }
)  # fmt: skip
# config.py: `MQTT_RO_SCHEMA` (`MQTT_BASE_SCHEMA` + state topic), the base of read-only platforms.
READ_ONLY_KEYS = frozenset({"qos", "encoding", "group", "state_topic", "value_template"})
# binary_sensor.py `PLATFORM_SCHEMA_MODERN`, sensor.py and event.py `_PLATFORM_SCHEMA_BASE`.
PLATFORM_KEYS = {
    "binary_sensor": frozenset(
        {"device_class", "expire_after", "force_update", "name", "off_delay", "payload_off",
         "payload_on"}
    ),
    "sensor": frozenset(
        {"device_class", "expire_after", "force_update", "last_reset_value_template", "name",
         "options", "suggested_display_precision", "state_class", "unit_of_measurement"}
    ),
    "event": frozenset({"device_class", "name", "event_types"}),
}  # fmt: skip
REQUIRED_BY_HA = {
    "binary_sensor": {"state_topic"},
    "sensor": {"state_topic"},
    "event": {"state_topic", "event_types"},
}
# schemas.py `MQTT_ENTITY_DEVICE_INFO_SCHEMA` (at least one of identifiers / connections) and
# `MQTT_ORIGIN_INFO_SCHEMA` (`name` required).
DEVICE_KEYS = frozenset(
    {"identifiers", "connections", "manufacturer", "model", "model_id", "name", "hw_version",
     "serial_number", "sw_version", "via_device", "suggested_area", "configuration_url"}
)  # fmt: skip
ORIGIN_KEYS = frozenset({"name", "sw_version", "support_url"})
# discovery.py `TOPIC_MATCHER`, applied to the topic after `<discovery_prefix>/`.
HA_TOPIC_MATCHER = re.compile(
    r"(?P<component>\w+)/(?:(?P<node_id>[a-zA-Z0-9_-]+)/)?(?P<object_id>[a-zA-Z0-9_-]+)/config"
)
# homeassistant/core.py `VALID_ENTITY_ID`: what `default_entity_id` must look like.
VALID_ENTITY_ID = re.compile(r"^(?!.+__)(?!_)[\da-z_]+(?<!_)\.(?!_)[\da-z_]+(?<!_)$")
# The enum values used here: event/__init__.py `EventDeviceClass`, sensor `SensorStateClass`,
# binary_sensor `BinarySensorDeviceClass` (a subset), helpers/entity.py `EntityCategory`.
VALID_VALUES: dict[str, dict[str, frozenset[str]]] = {
    "event": {"device_class": frozenset({"doorbell", "button", "motion"})},
    "sensor": {
        "state_class": frozenset({"measurement", "measurement_angle", "total", "total_increasing"})
    },
    "binary_sensor": {"device_class": frozenset({"occupancy", "connectivity", "motion"})},
}
ENTITY_CATEGORIES = frozenset({"config", "diagnostic"})


def _document(**mqtt: Any) -> dict[str, Any]:
    """Two enabled cameras (one whose name needs sanitizing) with every rule kind, and a
    disabled camera, which gets no entities."""
    return {
        "agent": {"id": AGENT, "site": "shop"},
        "mqtt": {"topic_prefix": PREFIX, **mqtt},
        "cameras": [
            {
                "name": "cam-1",
                "url": "rtsp://10.0.0.1/stream",
                "zones": [
                    {"name": "door", "points": [[0, 0], [0.5, 0], [0.5, 1]]},
                    {"name": "yard", "points": [[0.5, 0], [1, 0], [1, 1]]},
                ],
                "lines": [{"name": "gate", "points": [[0, 0.5], [1, 0.5]]}],
                "rules": [
                    {"name": "door-enter", "kind": "zone_enter", "zone": "door"},
                    {"name": "door-exit", "kind": "zone_exit", "zone": "door"},
                    {"name": "gate-cross", "kind": "line_cross", "line": "gate"},
                    {"name": "linger", "kind": "loiter", "zone": "yard", "dwell_s": 10},
                    {"name": "crowd", "kind": "zone_occupancy", "zone": "yard", "min_objects": 2},
                ],
            },
            {
                "name": "lobby.cam",
                "url": "rtsp://10.0.0.2/stream",
                "zones": [{"name": "desk", "points": [[0, 0], [1, 0], [1, 1]]}],
                "rules": [
                    {"name": "queue", "kind": "zone_occupancy", "zone": "desk", "min_objects": 3},
                    {"name": "desk-enter", "kind": "zone_enter", "zone": "desk"},
                ],
            },
            {
                "name": "spare",
                "url": "rtsp://10.0.0.3/stream",
                "enabled": False,
                "zones": [{"name": "all", "points": [[0, 0], [1, 0], [1, 1]]}],
                "rules": [{"name": "any", "kind": "zone_enter", "zone": "all"}],
            },
        ],
        "detector": {
            "runtime": {"type": "litert", "model_path": "models/edge/yolov5s-int8.tflite"}
        },
    }


def _config(document: dict[str, Any] | None = None) -> EdgeAgentConfig:
    return EdgeAgentConfig.model_validate(document or _document())


def _by_unique_id(messages: list[DiscoveryMessage]) -> dict[str, DiscoveryMessage]:
    return {str(m.payload["unique_id"]): m for m in messages}


def _uid(*key: str) -> str:
    return ":".join(("edge-agent", AGENT, *key))


def _check_against_ha(message: DiscoveryMessage, discovery_prefix: str) -> str:
    """Fail unless `message` is what HA's discovery accepts; returns its component."""
    assert message.topic.startswith(f"{discovery_prefix}/")
    match = HA_TOPIC_MATCHER.fullmatch(message.topic.removeprefix(f"{discovery_prefix}/"))
    assert match is not None, message.topic
    component = match["component"]
    payload = message.payload
    allowed = COMMON_KEYS | READ_ONLY_KEYS | PLATFORM_KEYS[component]
    assert set(payload) <= allowed, f"{message.topic}: unknown keys {set(payload) - allowed}"
    required = REQUIRED_BY_HA[component] | {
        "name", "unique_id", "default_entity_id", "device", "origin", "qos",
    }  # fmt: skip
    assert required <= set(payload), f"{message.topic}: missing {required - set(payload)}"
    for key, values in VALID_VALUES[component].items():
        assert payload.get(key, next(iter(values))) in values, (message.topic, key)
    assert payload.get("entity_category", "config") in ENTITY_CATEGORIES
    default_entity_id = str(payload["default_entity_id"])
    assert VALID_ENTITY_ID.match(default_entity_id), default_entity_id
    assert default_entity_id.startswith(f"{component}.")
    device = payload["device"]
    assert isinstance(device, dict) and set(device) <= DEVICE_KEYS
    assert device["identifiers"] and all(isinstance(i, str) for i in device["identifiers"])
    origin = payload["origin"]
    assert isinstance(origin, dict) and set(origin) <= ORIGIN_KEYS and origin["name"]
    assert payload["qos"] in (0, 1, 2)
    json.loads(encode_discovery(payload))  # plain JSON, as sent
    return component


def test_every_payload_is_what_home_assistant_accepts() -> None:
    messages = discovery_messages(_config(), HA)

    components = Counter(_check_against_ha(m, "homeassistant") for m in messages)
    # agent: 1; cam-1: 2 zones x 2, 5 rules, 1 occupancy sensor; lobby.cam: 1 x 2, 2 rules, 1
    assert components == {"binary_sensor": 1 + 2 + 1, "sensor": 3 + 2, "event": 5 + 2}
    assert len({m.topic for m in messages}) == len(messages)
    assert len({m.payload["unique_id"] for m in messages}) == len(messages)
    assert len({m.payload["default_entity_id"] for m in messages}) == len(messages)
    assert not any("spare" in m.topic or "spare" in str(m.payload) for m in messages)


def test_devices_availability_and_origin() -> None:
    messages = discovery_messages(_config(), HA)
    agent, *entities = messages

    assert agent.payload["device"] == {
        "identifiers": ["edge-agent:edge-01"],
        "name": AGENT,
        "manufacturer": "edge-cloud-video-analytics",
        "model": "Edge agent",
        "sw_version": "0.1.0",
    }
    assert agent.payload["state_topic"] == AVAILABILITY
    assert (agent.payload["payload_on"], agent.payload["payload_off"]) == ("online", "offline")
    assert "availability_topic" not in agent.payload  # it reports availability as its state
    devices = {str(m.payload["unique_id"]).split(":")[2]: m.payload["device"] for m in entities}
    assert devices == {
        "cam-1": {
            "identifiers": ["edge-agent:edge-01:cam-1"],
            "name": "edge-01 cam-1",
            "manufacturer": "edge-cloud-video-analytics",
            "model": "Camera",
            "via_device": "edge-agent:edge-01",
        },
        "lobby.cam": {
            "identifiers": ["edge-agent:edge-01:lobby.cam"],
            "name": "edge-01 lobby.cam",
            "manufacturer": "edge-cloud-video-analytics",
            "model": "Camera",
            "via_device": "edge-agent:edge-01",
        },
    }
    for message in entities:
        assert message.payload["availability_topic"] == AVAILABILITY
        assert message.payload["payload_available"] == "online"
        assert message.payload["payload_not_available"] == "offline"
    for message in messages:
        assert message.payload["origin"] == {
            "name": "edge-agent",
            "sw_version": "0.1.0",
            "support_url": "https://example.org/edge-agent",
        }


def test_entities_of_zones_and_rules() -> None:
    by_id = _by_unique_id(discovery_messages(_config(), HA))
    door_state = zone_state_topic(PREFIX, AGENT, "cam-1", "door")

    occupied = by_id[_uid("cam-1", "zone", "door", "occupied")]
    assert occupied.topic.startswith("homeassistant/binary_sensor/edge-01/cam-1_zone_door_")
    assert occupied.payload["device_class"] == "occupancy"
    assert occupied.payload["state_topic"] == door_state
    assert occupied.payload["default_entity_id"] == "binary_sensor.edge_01_cam_1_door_occupied"
    count = by_id[_uid("cam-1", "zone", "door", "count")]
    assert (count.payload["state_topic"], count.payload["state_class"]) == (
        door_state,
        "measurement",
    )
    crowd = by_id[_uid("cam-1", "rule", "crowd", "occupancy")]
    assert crowd.payload["state_topic"] == event_topic(PREFIX, AGENT, "cam-1", "crowd")
    assert crowd.payload["state_class"] == "measurement"
    expected_types = {
        "door-enter": ["start", "retract"],
        "door-exit": ["start", "retract"],
        "gate-cross": ["start", "retract"],
        "linger": ["start", "update", "end"],
        "crowd": ["start", "update", "end"],
    }
    for rule, types in expected_types.items():
        event = by_id[_uid("cam-1", "rule", rule, "event")]
        assert event.topic.startswith(f"homeassistant/event/edge-01/cam-1_rule_{rule}_event_")
        assert event.payload["state_topic"] == event_topic(PREFIX, AGENT, "cam-1", rule)
        assert event.payload["event_types"] == types
        assert event.payload["name"] == rule
    # only zone_occupancy rules get a count sensor
    assert sum(":occupancy" in uid for uid in by_id) == 2


def test_names_that_need_sanitizing_give_distinct_valid_topics() -> None:
    document = _document()
    twin = {**document["cameras"][1], "name": "lobby_cam"}
    document["cameras"].append(twin)  # `lobby.cam` and `lobby_cam` reduce to the same id
    document["agent"]["id"] = "edge.01"
    messages = discovery_messages(_config(document), HA)

    for message in messages:
        _check_against_ha(message, "homeassistant")
        assert message.topic.split("/")[2] == "edge_01"
    assert len({m.topic for m in messages}) == len(messages)
    lobby = [m.topic for m in messages if "lobby_cam_zone_desk_occupied" in m.topic]
    assert len(lobby) == 2


@dataclass(frozen=True)
class _FutureRule:
    """A rule kind this module has never heard of (like `count_line`, being added)."""

    name: str
    kind: str


def test_an_unknown_rule_kind_is_an_event_with_every_phase() -> None:
    config = _config()
    camera = config.cameras[0]
    rules = [*camera.rules, _FutureRule("tally", "count_line")]
    config = config.model_copy(
        update={"cameras": [camera.model_copy(update={"rules": rules}), *config.cameras[1:]]}
    )
    by_id = _by_unique_id(discovery_messages(config, HA))

    event = by_id[_uid("cam-1", "rule", "tally", "event")]
    _check_against_ha(event, "homeassistant")
    assert event.payload["event_types"] == list(PHASES)
    assert event.payload["state_topic"] == event_topic(PREFIX, AGENT, "cam-1", "tally")


def test_device_name_format_and_discovery_prefix() -> None:
    ha = HomeAssistantConfig(
        enabled=True, discovery_prefix="ha/discovery", device_name_format="{site}: {camera}"
    )
    messages = discovery_messages(_config(), ha)

    for message in messages:
        _check_against_ha(message, "ha/discovery")
    device, origin = messages[1].payload["device"], messages[0].payload["origin"]
    assert isinstance(device, dict) and device["name"] == "shop: cam-1"
    assert isinstance(origin, dict) and "support_url" not in origin


def test_nothing_is_announced_while_disabled() -> None:
    assert discovery_messages(_config(), HomeAssistantConfig()) == []


# -- removal on config change ------------------------------------------------------------------


def _changed_document() -> dict[str, Any]:
    document = _document()
    cam1 = document["cameras"][0]
    cam1["zones"] = [z for z in cam1["zones"] if z["name"] != "door"]
    cam1["rules"] = [
        {"name": "linger", "kind": "loiter", "zone": "yard", "dwell_s": 10},
        {"name": "crowd", "kind": "zone_enter", "zone": "yard"},  # no longer occupancy
        {"name": "gate-cross", "kind": "line_cross", "line": "gate"},
    ]
    del document["cameras"][1]  # lobby.cam removed
    return document


def test_removal_clears_what_the_new_config_no_longer_has() -> None:
    old, new = _config(), _config(_changed_document())
    old_by_topic = {m.topic: m for m in discovery_messages(old, HA)}

    removed = removal_messages(old, new, HA, HA)

    assert all(payload == b"" for _, payload in removed)
    assert {old_by_topic[t].payload["unique_id"] for t, _ in removed} == {
        _uid("cam-1", "zone", "door", "occupied"),
        _uid("cam-1", "zone", "door", "count"),
        _uid("cam-1", "rule", "door-enter", "event"),
        _uid("cam-1", "rule", "door-exit", "event"),
        _uid("cam-1", "rule", "crowd", "occupancy"),
        _uid("lobby.cam", "zone", "desk", "occupied"),
        _uid("lobby.cam", "zone", "desk", "count"),
        _uid("lobby.cam", "rule", "queue", "event"),
        _uid("lobby.cam", "rule", "queue", "occupancy"),
        _uid("lobby.cam", "rule", "desk-enter", "event"),
    }
    kept = {m.topic for m in discovery_messages(new, HA)}
    assert not kept & {t for t, _ in removed}
    # `crowd` stays an event entity (now with zone_enter's types): updated, not removed
    assert _uid("cam-1", "rule", "crowd", "event") in _by_unique_id(discovery_messages(new, HA))


@pytest.mark.parametrize(
    ("new_ha", "removed_all"),
    [
        (HA, False),
        (HA.model_copy(update={"device_name_format": "{camera}"}), False),  # renamed: updated
        (HomeAssistantConfig(), True),  # turned off: all gone
        (HA.model_copy(update={"discovery_prefix": "ha2"}), True),  # moved: old prefix cleared
    ],
    ids=["same", "renamed", "disabled", "new-prefix"],
)
def test_removal_when_discovery_settings_change(
    new_ha: HomeAssistantConfig, removed_all: bool
) -> None:
    config = _config()
    old = discovery_messages(config, HA)

    removed = removal_messages(config, config, HA, new_ha)

    assert [t for t, _ in removed] == ([m.topic for m in reversed(old)] if removed_all else [])
    if removed_all:
        assert removed[-1][0] == old[0].topic  # the agent (via_device of the cameras) last
    assert removal_messages(config, config, HomeAssistantConfig(), HA) == []  # nothing was there


# -- zone state --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "expected"),
    [(0, b'{"count":0,"occupied":false}'), (3, b'{"count":3,"occupied":true}')],
)
def test_zone_state_payload(count: int, expected: bytes) -> None:
    assert encode_zone_state(count) == expected
    assert zone_state_topic(PREFIX, AGENT, "cam-1", "door") == "va-test/edge-01/zones/cam-1/door"


@pytest.mark.parametrize("count", [-1, True])
def test_zone_state_refuses_what_is_not_a_count(count: int) -> None:
    with pytest.raises(ValueError, match="non-negative integer"):
        encode_zone_state(count)


# -- config ------------------------------------------------------------------------------------


def test_config_defaults() -> None:
    ha = HomeAssistantConfig()
    assert (ha.enabled, ha.discovery_prefix, ha.support_url) == (False, "homeassistant", None)
    assert ha.device_name("edge-01", "shop", "cam-1") == "edge-01 cam-1"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"device_name_format": "{cam}"}, "unknown placeholder {cam}"),
        ({"device_name_format": "{camera!r}"}, "no format spec or conversion"),
        ({"device_name_format": "{camera:>9}"}, "no format spec or conversion"),
        ({"device_name_format": "{camera"}, "not a valid format string"),
        ({"discovery_prefix": "home/#"}, "discovery_prefix"),
        ({"discovery_prefix": "/homeassistant"}, "discovery_prefix"),
        ({"support_url": "ftp://example.org"}, "support_url"),
        ({"name_prefix": "x"}, "Extra inputs are not permitted"),
    ],
    ids=["placeholder", "conversion", "spec", "unbalanced", "wildcard", "slash", "url", "extra"],
)
def test_config_errors(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        HomeAssistantConfig.model_validate(fields)


# -- value templates, rendered as HA renders them ----------------------------------------------


def _render(template: str, payload: bytes) -> str:
    """`template` with `value` / `value_json` of `payload`, in a sandbox like HA's own (HA's
    environment adds filters of its own; these templates use only Jinja's `tojson`)."""
    sandbox = pytest.importorskip("jinja2.sandbox", reason="jinja2 is not installed")
    environment = sandbox.ImmutableSandboxedEnvironment()
    text = payload.decode()
    return str(environment.from_string(template).render(value=text, value_json=json.loads(text)))


def _event_payloads() -> list[tuple[str, bytes]]:
    """Real `edge-alert/v1` payloads of every kind and phase, with their rule names."""
    occupancy: dict[str, Any] = {"kind": "zone_occupancy", "track_id": NO_TRACK,
                                 "class_id": NO_TRACK, "box": None, "zone": "yard",
                                 "rule": "crowd"}  # fmt: skip
    events = [
        door_event(label="person", frame_size=(640, 480)),
        door_event(phase="retract", class_id=2, label="car"),
        door_event(rule="door-exit", kind="zone_exit", label="person"),
        door_event(rule="gate-cross", kind="line_cross", zone=None, line="gate", direction="in"),
        door_event(rule="linger", kind="loiter", zone="yard"),
        door_event(rule="linger", kind="loiter", zone="yard", phase="end", timestamp_s=T0 + 20),
        door_event(phase="start", count=2, **occupancy),
        door_event(phase="update", count=4, timestamp_s=T0 + 1, **occupancy),
        door_event(phase="end", count=1, timestamp_s=T0 + 2, **occupancy),
    ]
    ids = EventIds(AGENT)
    return [(e.rule, encode_event(e, AGENT, ids.id_for(e))) for e in events]


def test_event_template_gives_ha_an_event_type_and_the_event_fields() -> None:
    by_id = _by_unique_id(discovery_messages(_config(), HA))

    for rule, payload in _event_payloads():
        entity = by_id[_uid("cam-1", "rule", rule, "event")].payload
        rendered = json.loads(_render(str(entity["value_template"]), payload))
        body = json.loads(payload)
        assert rendered.pop("event_type") == body["phase"]
        event_types = entity["event_types"]
        assert isinstance(event_types, list) and body["phase"] in event_types
        assert rendered == body  # every field becomes an attribute of the HA event


def test_event_template_passes_fields_added_within_v1() -> None:
    entity = _by_unique_id(discovery_messages(_config(), HA))[
        _uid("cam-1", "rule", "gate-cross", "event")
    ].payload
    _, payload = _event_payloads()[3]
    body = {**json.loads(payload), "phase": "update", "counts": {"in": 3, "out": 1}}

    rendered = json.loads(_render(str(entity["value_template"]), json.dumps(body).encode()))

    assert rendered == {**body, "event_type": "update"}


def test_occupancy_rule_sensor_reads_the_count_and_zero_after_end() -> None:
    entity = _by_unique_id(discovery_messages(_config(), HA))[
        _uid("cam-1", "rule", "crowd", "occupancy")
    ].payload
    counts = [
        _render(str(entity["value_template"]), payload)
        for rule, payload in _event_payloads()
        if rule == "crowd"
    ]
    assert counts == ["2", "4", "0"]


@pytest.mark.parametrize(("count", "occupied"), [(0, "OFF"), (1, "ON"), (5, "ON")])
def test_zone_templates_read_the_zone_state(count: int, occupied: str) -> None:
    by_id = _by_unique_id(discovery_messages(_config(), HA))
    binary = by_id[_uid("cam-1", "zone", "door", "occupied")].payload
    sensor = by_id[_uid("cam-1", "zone", "door", "count")].payload

    assert _render(str(binary["value_template"]), encode_zone_state(count)) == occupied
    assert occupied in (binary["payload_on"], binary["payload_off"])
    assert _render(str(sensor["value_template"]), encode_zone_state(count)) == str(count)


# -- through a real broker ---------------------------------------------------------------------


def test_discovery_is_retained_on_a_real_broker_and_removal_clears_it(
    mosquitto_broker: MosquittoBroker, tmp_path: Path
) -> None:
    config = _config()
    messages = discovery_messages(config, HA)
    removed = removal_messages(config, _config(_changed_document()), HA, HA)
    mqtt = MqttConfig(
        host=mosquitto_broker.host,
        port=mosquitto_broker.port,
        topic_prefix=PREFIX,
        keepalive_s=5,
        outbox_path=tmp_path / "outbox.sqlite3",
    )
    publisher = AlertPublisher(mqtt, AGENT, reconnect_min_s=1, reconnect_max_s=1)
    publisher.start()
    try:
        assert publisher.wait_connected(10)
        for topic, payload in messages:
            publisher.publish_retained(topic, encode_discovery(payload))
        assert publisher.flush(10)

        # a Home Assistant starting later gets every config from the broker's retained store
        late = MqttRecorder(mosquitto_broker, "homeassistant/#")
        try:
            late.wait_for(lambda got: len(got) >= len(messages))
        finally:
            late.close()
        received = {m.topic: m for m in late.messages}
        assert set(received) == {m.topic for m in messages}
        for topic, payload in messages:
            assert (received[topic].qos, received[topic].retain) == (1, True)
            assert json.loads(received[topic].payload) == payload

        for topic, empty in removed:
            publisher.publish_retained(topic, empty)
        assert publisher.flush(10)
    finally:
        publisher.close()

    after = MqttRecorder(mosquitto_broker, "homeassistant/#")
    kept = {m.topic for m in messages} - {t for t, _ in removed}
    try:
        after.wait_for(lambda got: len(got) >= len(kept))
        time.sleep(0.3)  # retained messages come in one burst: give a stray one time to arrive
    finally:
        after.close()
    assert {m.topic for m in after.messages} == kept
