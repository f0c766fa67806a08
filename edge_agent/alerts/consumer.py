"""How an alert consumer subscribes: alone or in a share group, with or without a lasting session.

Several consumers on one broker (the central one, behind the site bridges) split the event stream
with an MQTT shared subscription: each subscribes to `$share/<group>/<filter>` and the broker hands
each message to one member of the group. Mosquitto 2 accepts `$share/` from MQTT 3.1.1 clients
as well as MQTT 5 ones, so paho subscribes to it like any filter (with MQTT 5 the subscription
must not set No Local). Only event topics are shared: availability and status are state that
every consumer wants whole, and a broker sends no retained messages to a shared subscription.

Delivery is QoS 1, at least once: a message comes again after a reconnect or a restart of the
publisher before its acknowledgement, so a consumer may drop repeats with `RecentEvents`.

Pure logic: nothing here touches the network.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Final

from pydantic import Field, field_validator

from configkit.base import StrictModel
from edge_agent.config.agent import NAME_PATTERN
from edge_agent.config.mqtt import MqttConfig

__all__ = [
    "SHARE_PREFIX",
    "AlertConsumerConfig",
    "AlertsConsumerFile",
    "EventKey",
    "RecentEvents",
    "check_share_group",
    "event_key",
    "session_client_id",
    "shared_filter",
]

SHARE_PREFIX: Final = "$share/"
_SESSION_CLIENT_PREFIX: Final = "edge-alerts-"
# MQTT 5 §4.8.2: a share name has at least one character and no `/`, `+` or `#`; control
# characters are allowed by the standard but are never what an operator meant.
_SHARE_FORBIDDEN: Final = re.compile(r"[/+#\x00-\x1f\x7f-\x9f]")
_SHARE_GROUP_MAX_CHARS: Final = 128

EventKey = tuple[str, str, str]
"""What makes one event message: `event_id`, `phase` and `timestamp` (start, updates and end of
one event share their `event_id`)."""


def check_share_group(name: str) -> str:
    """`name` if it can name a share group; else `ValueError` saying what is wrong with it."""
    if not name:
        raise ValueError("a share group name cannot be empty")
    if len(name) > _SHARE_GROUP_MAX_CHARS:
        raise ValueError(
            f"share group {name[:20]!r}... has {len(name)} characters, "
            f"at most {_SHARE_GROUP_MAX_CHARS}"
        )
    bad = _SHARE_FORBIDDEN.search(name)
    if bad is not None:
        raise ValueError(
            f"share group {name!r} contains {bad.group()!r}: no '/', '+', '#' or control characters"
        )
    return name


def shared_filter(group: str, topic_filter: str) -> str:
    """`topic_filter` as a shared subscription of `group`: `$share/<group>/<filter>`."""
    return f"{SHARE_PREFIX}{check_share_group(group)}/{topic_filter}"


def session_client_id(session: str) -> str:
    """The MQTT client id of the lasting session `session` (never an agent's client id)."""
    return _SESSION_CLIENT_PREFIX + session


class AlertConsumerConfig(StrictModel):
    """How one `edge-agent alerts` process takes part in the alert stream."""

    share_group: str | None = Field(
        default=None,
        description=(
            "Share group: consumers with the same group split the events between them "
            "(`$share/<group>/...`); none: this consumer gets every event."
        ),
    )
    session: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description=(
            "Name of a lasting session (client id `edge-alerts-<session>`, clean session off): "
            "the broker keeps the subscription and queues events while the consumer is away. "
            "One process per name. None: a fresh session that ends with the process."
        ),
    )
    dedup_memory: int = Field(
        default=0,
        ge=0,
        le=10_000_000,
        description="Drop repeats among this many most recent events; 0: print every delivery.",
    )

    @field_validator("share_group")
    @classmethod
    def _check_share_group(cls, value: str | None) -> str | None:
        return None if value is None else check_share_group(value)

    @property
    def client_id(self) -> str | None:
        """The client id of the lasting session; None for a fresh random one."""
        return None if self.session is None else session_client_id(self.session)


class AlertsConsumerFile(StrictModel):
    """The YAML of a consumer that runs away from any agent (at the central broker): a broker.

    ```yaml
    mqtt:
      host: central.example.net
      port: 8883
      tls: {ca_path: /etc/ssl/certs/central-ca.pem}
      username: ops
      password: {env: MQTT_PASSWORD}
    ```
    """

    mqtt: MqttConfig = Field(
        description=(
            "The broker to follow: host, port, TLS, credentials and `topic_prefix` (the outbox "
            "fields are an agent's and not used)."
        )
    )


def event_key(payload: bytes) -> EventKey | None:
    """The `EventKey` of an `edge-alert/v1` payload; None when it has no usable `event_id`."""
    try:
        event = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(event, dict) or not isinstance(event.get("event_id"), str):
        return None
    return (event["event_id"], str(event.get("phase")), str(event.get("timestamp")))


class RecentEvents:
    """Remembers the last `memory` event keys to tell a redelivery from a new message.

    Bounded: the oldest key is forgotten first, so a repeat that comes back after `memory` other
    events is taken for new (printed twice), never the other way round.
    """

    def __init__(self, memory: int) -> None:
        """Remember at most `memory` keys (at least 1)."""
        if memory < 1:
            raise ValueError(f"memory must be at least 1, got {memory}")
        self.memory = memory
        self.repeats = 0
        self._keys: OrderedDict[EventKey, None] = OrderedDict()

    def __len__(self) -> int:
        """Number of keys remembered."""
        return len(self._keys)

    def is_repeat(self, key: EventKey) -> bool:
        """Whether `key` was seen among the last `memory` keys; remembers it either way."""
        if key in self._keys:
            self._keys.move_to_end(key)
            self.repeats += 1
            return True
        self._keys[key] = None
        if len(self._keys) > self.memory:
            self._keys.popitem(last=False)
        return False
