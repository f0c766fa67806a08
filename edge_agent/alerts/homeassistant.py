"""Home Assistant MQTT discovery: an agent's cameras, zones and rules as HA devices and entities.

Pure functions, no I/O. `discovery_messages(config, ha)` gives the retained discovery configs
(`(topic, payload)`, payload a JSON object; publish each with `encode_discovery`, retained,
QoS 1); `removal_messages(old, new, ...)` gives the empty retained payloads that remove, after a
config change, what the old config announced and the new one does not.

What Home Assistant gets (one device for the agent; one per enabled camera, connected via it):

* agent: `connectivity`, a binary_sensor (connectivity) reading the availability topic;
* per zone: `<zone> occupied`, a binary_sensor (occupancy), and `<zone> count`, a sensor
  (state class measurement), both reading the zone state topic;
* per `zone_occupancy` rule: `<rule> occupancy`, a sensor with the event's `count` (0 after
  `end`) from the rule's event topic;
* per rule, of any kind: `<rule>`, an event entity on the rule's event topic whose event type is
  the `phase` and whose attributes are all the event's fields.

Every entity except the agent's connectivity carries the agent's availability topic (`online` /
`offline`, Last Will `offline`), so HA shows them unavailable while the agent is away; the
connectivity entity reads that topic as its state instead (with availability it could never be
`off`). Rule kinds this module does not know (e.g. ones added later) still get their event entity,
with every phase as event type.

Rules are MQTT `event` entities rather than device triggers (`device_automation`): HA documents
the event platform (since 2023.8) for stateless signals such as button presses. One entity per
rule takes every phase (`event_type`) with the event's fields as attributes, shows in history,
logbook and dashboards, and is usable in automations by entity; device triggers need one
discovery config per type/subtype pair, match only a fixed payload and create no entity.

Checked against home-assistant/core `dev` (2026, after `object_id` was removed in favour of
`default_entity_id`): `components/mqtt/schemas.py` (common entity, availability, device and
origin schemas), `config.py` (`MQTT_RO_SCHEMA`), `binary_sensor.py`, `sensor.py`, `event.py`
(platform schemas; the event platform ignores retained messages and wants a JSON object with
`event_type` after the value template) and `discovery.py` (`TOPIC_MATCHER`).

Topics: `<discovery_prefix>/<component>/<node_id>/<object_id>/config`, node_id the agent id and
object_id the camera, place and role, both reduced to `[a-zA-Z0-9_-]`; object_id ends in a short
hash of the entity's unique id, so names that reduce alike (`cam.1`, `cam_1`) stay apart.

The zone state topic, `<prefix>/<agent>/zones/<camera>/<zone>`, is defined here
(`zone_state_topic`, `encode_zone_state`): a retained JSON object `{"count": n, "occupied": b}`.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple

from edge_agent.alerts.payload import (
    AVAILABILITY_OFFLINE,
    AVAILABILITY_ONLINE,
    availability_topic,
    event_topic,
)
from edge_agent.config.camera import CameraConfig
from edge_agent.config.homeassistant import HomeAssistantConfig
from edge_agent.config.root import EdgeAgentConfig
from edge_agent.config.rules import RuleConfig

__all__ = [
    "MANUFACTURER",
    "ORIGIN_NAME",
    "PHASES",
    "DiscoveryMessage",
    "discovery_messages",
    "discovery_topic",
    "encode_discovery",
    "encode_zone_state",
    "event_types",
    "removal_messages",
    "topic_id",
    "zone_state_topic",
]

MANUFACTURER: Final = "edge-cloud-video-analytics"
ORIGIN_NAME: Final = "edge-agent"
PHASES: Final = ("start", "update", "end", "retract")
"""Every phase of `edge-alert/v1`; the event types of a rule kind not listed below."""

_EVENT_TYPES_BY_KIND: Final[Mapping[str, tuple[str, ...]]] = {
    "zone_enter": ("start", "retract"),
    "zone_exit": ("start", "retract"),
    "line_cross": ("start", "retract"),
    "loiter": ("start", "update", "end"),
    "zone_occupancy": ("start", "update", "end"),
}
_UNIQUE_ID_ROOT: Final = "edge-agent"  # names never contain ":", so ":"-joined ids are unique
_HASH_CHARS: Final = 8  # only tells apart names that reduce to the same topic characters
_QOS: Final = 1  # events are sent at QoS 1; a QoS 0 subscription would downgrade them
_ONLINE: Final = AVAILABILITY_ONLINE.decode()
_OFFLINE: Final = AVAILABILITY_OFFLINE.decode()

_OCCUPIED_TEMPLATE: Final = "{{ 'ON' if value_json.occupied else 'OFF' }}"
_COUNT_TEMPLATE: Final = "{{ value_json.count }}"
_OCCUPANCY_RULE_TEMPLATE: Final = "{{ 0 if value_json.phase == 'end' else value_json.count }}"
# HA's event platform takes a JSON object: `event_type` plus attributes. Every field of the event
# goes along, so fields added within v1 (a kind's own, like `counts`) need no change here;
# `dict` and `tojson` are in Jinja and in HA's template environment.
_EVENT_TEMPLATE: Final = "{{ dict(value_json, event_type=value_json.phase) | tojson }}"


def _package_version() -> str:
    try:
        return importlib.metadata.version("edge-cloud-video-analytics")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


_SW_VERSION: Final = _package_version()


class DiscoveryMessage(NamedTuple):
    """One retained discovery config: its topic and its JSON object."""

    topic: str
    payload: dict[str, object]


def zone_state_topic(prefix: str, agent: str, camera: str, zone: str) -> str:
    """Retained topic with the live state of one zone (`encode_zone_state`)."""
    return f"{prefix}/{agent}/zones/{camera}/{zone}"


def encode_zone_state(count: int) -> bytes:
    """A zone's state as compact JSON: `{"count": n, "occupied": n > 0}`."""
    if isinstance(count, bool) or count < 0:
        raise ValueError(f"zone count must be a non-negative integer, got {count!r}")
    return json.dumps({"count": count, "occupied": count > 0}, separators=(",", ":")).encode()


def topic_id(name: str) -> str:
    """`name` reduced to the characters HA allows in node and object ids: `[a-zA-Z0-9_-]`."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def discovery_topic(discovery_prefix: str, component: str, node_id: str, object_id: str) -> str:
    """`<discovery_prefix>/<component>/<node_id>/<object_id>/config` (ids made safe)."""
    return f"{discovery_prefix}/{component}/{topic_id(node_id)}/{topic_id(object_id)}/config"


def event_types(kind: str) -> list[str]:
    """The phases a rule of `kind` sends, as the event types of its HA event entity."""
    return list(_EVENT_TYPES_BY_KIND.get(kind, PHASES))


def encode_discovery(payload: Mapping[str, object]) -> bytes:
    """A discovery config as compact UTF-8 JSON."""
    return json.dumps(dict(payload), separators=(",", ":")).encode()


def discovery_messages(config: EdgeAgentConfig, ha: HomeAssistantConfig) -> list[DiscoveryMessage]:
    """The retained discovery configs of `config`'s agent and enabled cameras, agent first (HA
    links camera devices to it); none when `ha` is not enabled."""
    if not ha.enabled:
        return []
    agent = config.agent.id
    prefix = config.mqtt.topic_prefix
    common: dict[str, object] = {
        "availability_topic": availability_topic(prefix, agent),
        "payload_available": _ONLINE,
        "payload_not_available": _OFFLINE,
    }
    origin: dict[str, object] = {"name": ORIGIN_NAME, "sw_version": _SW_VERSION}
    if ha.support_url is not None:
        origin["support_url"] = ha.support_url
    # the agent's entity reports availability as its state, so it does not carry it
    agent_entity = _agent_entity(prefix, agent)
    messages = [_message(ha, agent, agent_entity, _agent_device(agent), origin, {})]
    for camera in config.cameras:
        if not camera.enabled:
            continue
        device = _camera_device(ha, config, camera)
        for entity in _camera_entities(prefix, agent, camera):
            messages.append(_message(ha, agent, entity, device, origin, common))
    return messages


def removal_messages(
    old: EdgeAgentConfig,
    new: EdgeAgentConfig,
    old_ha: HomeAssistantConfig,
    new_ha: HomeAssistantConfig,
) -> list[tuple[str, bytes]]:
    """Empty retained payloads (`(topic, b"")`) for every config `old` announced and `new` does
    not: removed cameras, zones, rules, disabled cameras, a changed agent id or discovery prefix,
    or all of them when discovery is turned off. Cameras come before the agent's own entity."""
    kept = {message.topic for message in discovery_messages(new, new_ha)}
    return [
        (message.topic, b"")
        for message in reversed(discovery_messages(old, old_ha))
        if message.topic not in kept
    ]


# -- entities ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entity:
    """One HA entity before it gets its ids, device and origin.

    `key` names it within the agent (`(camera, "zone", zone, "occupied")`); `slug` gives its
    readable default entity id."""

    component: str
    key: tuple[str, ...]
    slug: tuple[str, ...]
    name: str
    fields: dict[str, object]


_RuleEntities = Callable[[str, str, CameraConfig, RuleConfig], list[_Entity]]
"""Builds the extra entities of one rule kind: `(prefix, agent, camera, rule) -> entities`."""


def _occupancy_sensor(
    prefix: str, agent: str, camera: CameraConfig, rule: RuleConfig
) -> list[_Entity]:
    return [
        _Entity(
            "sensor",
            (camera.name, "rule", rule.name, "occupancy"),
            (camera.name, rule.name, "occupancy"),
            f"{rule.name} occupancy",
            {
                "state_topic": event_topic(prefix, agent, camera.name, rule.name),
                "value_template": _OCCUPANCY_RULE_TEMPLATE,
                "state_class": "measurement",
                "icon": "mdi:account-group",
            },
        )
    ]


_RULE_EXTRAS: Final[Mapping[str, _RuleEntities]] = {"zone_occupancy": _occupancy_sensor}
"""Entities a rule kind gets besides its event entity."""


def _camera_entities(prefix: str, agent: str, camera: CameraConfig) -> list[_Entity]:
    entities: list[_Entity] = []
    for zone in camera.zones:
        state_topic = zone_state_topic(prefix, agent, camera.name, zone.name)
        entities.append(
            _Entity(
                "binary_sensor",
                (camera.name, "zone", zone.name, "occupied"),
                (camera.name, zone.name, "occupied"),
                f"{zone.name} occupied",
                {
                    "state_topic": state_topic,
                    "value_template": _OCCUPIED_TEMPLATE,
                    "payload_on": "ON",
                    "payload_off": "OFF",
                    "device_class": "occupancy",
                },
            )
        )
        entities.append(
            _Entity(
                "sensor",
                (camera.name, "zone", zone.name, "count"),
                (camera.name, zone.name, "count"),
                f"{zone.name} count",
                {
                    "state_topic": state_topic,
                    "value_template": _COUNT_TEMPLATE,
                    "state_class": "measurement",
                    "icon": "mdi:counter",
                },
            )
        )
    for rule in camera.rules:
        entities.append(
            _Entity(
                "event",
                (camera.name, "rule", rule.name, "event"),
                (camera.name, rule.name),
                rule.name,
                {
                    "state_topic": event_topic(prefix, agent, camera.name, rule.name),
                    "value_template": _EVENT_TEMPLATE,
                    "event_types": event_types(rule.kind),
                    "device_class": "motion",
                },
            )
        )
        extras = _RULE_EXTRAS.get(rule.kind)
        if extras is not None:
            entities += extras(prefix, agent, camera, rule)
    return entities


def _agent_entity(prefix: str, agent: str) -> _Entity:
    return _Entity(
        "binary_sensor",
        ("agent", "connectivity"),
        ("connectivity",),
        "connectivity",
        {
            "state_topic": availability_topic(prefix, agent),
            "payload_on": _ONLINE,
            "payload_off": _OFFLINE,
            "device_class": "connectivity",
            "entity_category": "diagnostic",
        },
    )


# -- devices and messages ----------------------------------------------------------------------


def _agent_identifier(agent: str) -> str:
    return f"{_UNIQUE_ID_ROOT}:{agent}"


def _agent_device(agent: str) -> dict[str, object]:
    return {
        "identifiers": [_agent_identifier(agent)],
        "name": agent,
        "manufacturer": MANUFACTURER,
        "model": "Edge agent",
        "sw_version": _SW_VERSION,
    }


def _camera_device(
    ha: HomeAssistantConfig, config: EdgeAgentConfig, camera: CameraConfig
) -> dict[str, object]:
    agent = config.agent.id
    return {
        "identifiers": [f"{_agent_identifier(agent)}:{camera.name}"],
        "name": ha.device_name(agent, config.agent.site, camera.name),
        "manufacturer": MANUFACTURER,
        "model": "Camera",
        "via_device": _agent_identifier(agent),
    }


def _entity_slug(parts: tuple[str, ...]) -> str:
    # HA entity ids: lower-case letters, digits and single underscores inside
    return re.sub(r"[^a-z0-9]+", "_", "_".join(parts).lower()).strip("_")


def _message(
    ha: HomeAssistantConfig,
    agent: str,
    entity: _Entity,
    device: Mapping[str, object],
    origin: Mapping[str, object],
    availability: Mapping[str, object],
) -> DiscoveryMessage:
    unique_id = ":".join((_UNIQUE_ID_ROOT, agent, *entity.key))
    digest = hashlib.sha256(unique_id.encode()).hexdigest()[:_HASH_CHARS]
    object_id = f"{'_'.join(entity.key)}_{digest}"
    payload: dict[str, object] = {
        "name": entity.name,
        "unique_id": unique_id,
        "default_entity_id": f"{entity.component}.{_entity_slug((agent, *entity.slug))}",
        **entity.fields,
        **availability,
        "qos": _QOS,
        # copies: no two messages share a mutable object
        "device": copy.deepcopy(dict(device)),
        "origin": dict(origin),
    }
    topic = discovery_topic(ha.discovery_prefix, entity.component, agent, object_id)
    return DiscoveryMessage(topic, payload)
