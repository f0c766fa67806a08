"""The versioned JSON payload of alert events, and the MQTT topics they go to.

Schema `edge-alert/v1` (one JSON object, UTF-8, keys in this order):

```json
{"schema": "edge-alert/v1",
 "event_id": "5b0c0e4e-3f0a-5d6e-9a53-1f6c4c0f2d8e",
 "phase": "start", "rule": "door-enter", "kind": "zone_enter",
 "camera": "cam-1", "agent": "edge-01", "track_id": 7, "class": 0, "label": "person",
 "timestamp": "2026-11-30T06:55:50.123Z",
 "box": [10.0, 20.4, 110.3, 220.0], "frame_size": [1920, 1080],
 "direction": null, "zone": "door", "line": null, "count": null}
```

* `event_id` is stable for one occurrence of a rule on one track (or one zone, for occupancy): the
  same for its `start`, `update` and `end` messages. It is a UUID derived from agent, camera, rule,
  track, place and the start time, so a resend of the same event carries the same id.
* `phase` is `start`, `update` or `end`; `timestamp` is the time of this message's frame, ISO 8601
  UTC with milliseconds. `retract` withdraws an earlier instantaneous `start` (same `event_id` and
  `timestamp`) after a cloud answer corrected the object's class to one the rule ignores (`class`
  is then the corrected class), or found no object where the track was (`class` unchanged).
* `track_id` and `class` are `null` for events about a place rather than one object (occupancy,
  line counts).
* `label` is the name of `class` from the detector's class names (the config's, else the model's
  own), `null` where `class` is `null` or the classes have no names. It follows `class`: a
  `retract` after a class correction carries the corrected class's name.
* `box` is `[x1, y1, x2, y2]` in pixels of the frame, rounded to 0.1 px, or `null`;
  `frame_size` is that frame's `[width, height]` in pixels (also for occupancy, whose `box` is
  `null`), or `null` where unknown.
* `counts`, `interval_s` and `interval_start` (optional, after `count`) are on `count_line`
  events only, absent on the others. Such a rule sends one `update` per interval of frame time
  (no `start` or `end`): `counts` holds the crossings of `line` per direction over the interval,
  e.g. `{"in": 3, "out": 1}`; the interval is `interval_s` seconds long and starts at
  `interval_start` (ISO 8601 like `timestamp`), a multiple of `interval_s` (a clock minute for
  60 s); a stream's first and last intervals are observed only in part. `timestamp` is the
  frame that closed the interval (the first at or after its end), or the end of the stream.
  `event_id` is stable per rule and interval start; `track_id`, `class`, `label`, `box`,
  `direction` and `count` are `null`.
* `media` (optional, last) names the pictures recorded for the event, e.g.
  `{"snapshot": {"path": "...", "url": "..."}, "crop": {...}, "clip": {...}}`; absent when no
  recorder is configured. A reference is known when the alert is sent; the file appears shortly
  after (written off the frame loop, atomically).
* `label`, `frame_size`, `media` and the `count_line` kind with its keys were added within v1:
  consumers of v1 ignore keys (and kinds) they do not know, and no earlier key changed meaning.

Topics (`prefix` from `mqtt.topic_prefix`):

* `<prefix>/<agent>/events/<camera>/<rule>`: events, QoS from config (1), not retained.
* `<prefix>/<agent>/availability`: `online` / `offline`, retained, QoS 1; the broker sets
  `offline` as the agent's Last Will.
* `<prefix>/<agent>/status/<camera>`: a retained JSON object describing the camera's state.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

from edge_agent.rules.events import NO_TRACK, RuleEvent

__all__ = [
    "AVAILABILITY_OFFLINE",
    "AVAILABILITY_ONLINE",
    "SCHEMA",
    "EventIds",
    "availability_topic",
    "encode_event",
    "encode_status",
    "event_id",
    "event_payload",
    "event_topic",
    "iso_utc",
    "status_topic",
]

SCHEMA: Final = "edge-alert/v1"
AVAILABILITY_ONLINE: Final = b"online"
AVAILABILITY_OFFLINE: Final = b"offline"

_EVENT_ID_NAMESPACE: Final = uuid.UUID("6f1d2a9e-6c1b-4f57-9a8e-3d0b7c5e2a41")
_LASTING_KINDS: Final = frozenset({"loiter", "zone_occupancy"})
_BOX_DECIMALS: Final = 1  # 0.1 px: finer is float32 noise, not information


def event_topic(prefix: str, agent: str, camera: str, rule: str) -> str:
    """Topic of the events of one rule on one camera."""
    return f"{prefix}/{agent}/events/{camera}/{rule}"


def availability_topic(prefix: str, agent: str) -> str:
    """Retained topic that says whether the agent is `online` or `offline`."""
    return f"{prefix}/{agent}/availability"


def status_topic(prefix: str, agent: str, camera: str) -> str:
    """Retained topic with the JSON status of one camera."""
    return f"{prefix}/{agent}/status/{camera}"


def iso_utc(timestamp_s: float) -> str:
    """`timestamp_s` (Unix seconds) as ISO 8601 UTC with milliseconds, e.g. `...T06:55:50.123Z`."""
    moment = datetime.fromtimestamp(timestamp_s, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event_id(
    agent: str,
    camera: str,
    rule: str,
    track_id: int,
    start_s: float,
    place: str | None = None,
) -> str:
    """The stable id of one event: a UUID5 of who, where and when (millisecond) it started."""
    name = f"{agent}/{camera}/{rule}/{track_id}/{place or ''}/{round(start_s * 1000)}"
    return str(uuid.uuid5(_EVENT_ID_NAMESPACE, name))


class EventIds:
    """Gives each event its stable id, remembering the start time of lasting events.

    `loiter` and `zone_occupancy` events send `start`, maybe `update`, then `end`; they share the
    id of their `start`. Instantaneous events only send `start`. An `update`/`end` whose `start`
    was not seen (e.g. after a restart) gets an id from its own timestamp. A `count_line` update
    takes its id from its interval's start.
    """

    def __init__(self, agent: str) -> None:
        """Ids for the events of agent `agent`."""
        self.agent = agent
        self._started: dict[tuple[str, str, int, str | None], float] = {}

    def __len__(self) -> int:
        """Number of lasting events started and not yet ended."""
        return len(self._started)

    def id_for(self, event: RuleEvent) -> str:
        """The id of `event`; call once per event, in order."""
        place = event.zone if event.zone is not None else event.line
        key = (event.camera, event.rule, event.track_id, place)
        start_s = event.timestamp_s
        if event.line_counts is not None:
            start_s = event.line_counts.start_s
        elif event.phase == "start":
            if event.kind in _LASTING_KINDS:
                self._started[key] = start_s
        elif event.phase == "retract":
            start_s = event.timestamp_s  # the retracted start's own time: the same id
        elif event.phase == "update":
            start_s = self._started.get(key, start_s)
        else:
            start_s = self._started.pop(key, start_s)
        return event_id(self.agent, event.camera, event.rule, event.track_id, start_s, place)


def event_payload(event: RuleEvent, agent: str, event_id: str) -> dict[str, object]:
    """The `edge-alert/v1` JSON object of `event` (see the module docstring)."""
    no_track = event.track_id == NO_TRACK
    no_class = no_track or event.class_id == NO_TRACK
    payload: dict[str, object] = {
        "schema": SCHEMA,
        "event_id": event_id,
        "phase": event.phase,
        "rule": event.rule,
        "kind": event.kind,
        "camera": event.camera,
        "agent": agent,
        "track_id": None if no_track else event.track_id,
        "class": None if no_class else event.class_id,
        "label": None if no_class else event.label,
        "timestamp": iso_utc(event.timestamp_s),
        "box": None if event.box is None else [round(float(v), _BOX_DECIMALS) for v in event.box],
        "frame_size": None if event.frame_size is None else [int(v) for v in event.frame_size],
        "direction": event.direction,
        "zone": event.zone,
        "line": event.line,
        "count": event.count,
    }
    if event.line_counts is not None:
        payload["counts"] = event.line_counts.by_direction()
        payload["interval_s"] = event.line_counts.interval_s
        payload["interval_start"] = iso_utc(event.line_counts.start_s)
    return payload


def encode_event(event: RuleEvent, agent: str, event_id: str) -> bytes:
    """`event_payload` as compact UTF-8 JSON."""
    return json.dumps(event_payload(event, agent, event_id), separators=(",", ":")).encode()


def encode_status(status: Mapping[str, object]) -> bytes:
    """A camera status object as compact UTF-8 JSON (keys sorted)."""
    return json.dumps(dict(status), separators=(",", ":"), sort_keys=True).encode()
