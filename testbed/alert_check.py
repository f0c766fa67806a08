"""Agent configs for generated `events` scenes, and the check of observed alerts against them.

`scene_agent_config` writes the edge-agent config that watches an `events` scene with the zone,
line and rules its `events.json` was computed for. `match_events` pairs the alerts an agent
raised with the scripted events: same kind, class, place and direction, within a time tolerance,
and reports the ones missing, the unexpected ones, and pairs that came out of order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from edge_agent.detect_command import runtime_config_for

SCENE_CAMERA = "scene"
EDGE_INPUT_SIZE = (320, 320)  # the committed edge models; the ONNX one has a dynamic input
LOITER_RULE = "loiter-zone-a"


@dataclass(frozen=True, slots=True)
class SceneEvent:
    """An event reduced to what must agree: kind, class, place, direction and time."""

    kind: str
    class_name: str
    place: str
    direction: str | None
    time_s: float  # seconds from the start of the scene

    def key(self) -> tuple[str, str, str, str | None]:
        """What two events must share to be the same event."""
        return (self.kind, self.class_name, self.place, self.direction)

    def __str__(self) -> str:
        direction = f" {self.direction}" if self.direction else ""
        return f"{self.time_s:6.2f}s {self.kind}{direction} {self.class_name} @{self.place}"


@dataclass
class EventMatch:
    """The outcome of `match_events`."""

    matched: list[tuple[SceneEvent, SceneEvent]] = field(default_factory=list)
    missing: list[SceneEvent] = field(default_factory=list)
    unexpected: list[SceneEvent] = field(default_factory=list)
    out_of_order: list[tuple[SceneEvent, SceneEvent]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every expected event seen, nothing else, in order."""
        return not (self.missing or self.unexpected or self.out_of_order)

    @property
    def precision(self) -> float:
        """Share of observed events that were expected."""
        observed = len(self.matched) + len(self.unexpected)
        return len(self.matched) / observed if observed else 1.0

    @property
    def recall(self) -> float:
        """Share of expected events that were observed."""
        expected = len(self.matched) + len(self.missing)
        return len(self.matched) / expected if expected else 1.0

    def report(self) -> str:
        """Human lines listing what did not match."""
        lines = [f"matched {len(self.matched)}"]
        lines += [f"missing     {e}" for e in self.missing]
        lines += [f"unexpected  {e}" for e in self.unexpected]
        lines += [f"out of order {a} / {b}" for a, b in self.out_of_order]
        return "\n".join(lines)


def load_expected(events_json: Path) -> list[SceneEvent]:
    """The scripted events of a scene's `events.json`, timed from its first frame."""
    document = json.loads(events_json.read_text())
    fps, base = float(document["fps"]), int(document["frame_base"])
    return [
        SceneEvent(
            kind=e["kind"],
            class_name=e["class"],
            place=e.get("zone") or e.get("line") or "",
            direction=e.get("direction"),
            time_s=(int(e["frame"]) - base) / fps,
        )
        for e in document["events"]
    ]


def observed_from_payloads(
    payloads: Iterable[Mapping[str, Any]], class_names: Sequence[str], start_time_s: float
) -> list[SceneEvent]:
    """Scene events from `edge-alert/v1` payloads (`start` phases only; times from the start)."""
    events = []
    for p in payloads:
        if p.get("phase") != "start" or p.get("class") is None:
            continue
        stamp = datetime.fromisoformat(str(p["timestamp"]).replace("Z", "+00:00")).timestamp()
        events.append(
            SceneEvent(
                kind=str(p["kind"]),
                class_name=class_names[int(p["class"])],
                place=str(p.get("zone") or p.get("line") or ""),
                direction=p.get("direction"),
                time_s=stamp - start_time_s,
            )
        )
    return events


def match_events(
    expected: Sequence[SceneEvent], observed: Sequence[SceneEvent], *, tolerance_s: float = 1.0
) -> EventMatch:
    """Pair each expected event with the nearest-in-time unpaired observed one of the same key.

    Pairs more than `tolerance_s` apart do not match. Two matched events whose expected times
    differ by more than `tolerance_s` must be observed in the same order.
    """
    result = EventMatch()
    free = list(observed)
    for want in sorted(expected, key=lambda e: e.time_s):
        candidates = [
            o for o in free if o.key() == want.key() and abs(o.time_s - want.time_s) <= tolerance_s
        ]
        if not candidates:
            result.missing.append(want)
            continue
        best = min(candidates, key=lambda o: abs(o.time_s - want.time_s))
        free.remove(best)
        result.matched.append((want, best))
    result.unexpected = free
    order = {id(o): i for i, o in enumerate(observed)}
    for i, (want_a, got_a) in enumerate(result.matched):
        for want_b, got_b in result.matched[i + 1 :]:
            if want_b.time_s - want_a.time_s > tolerance_s and order[id(got_b)] < order[id(got_a)]:
                result.out_of_order.append((want_a, want_b))
    return result


def match_first_loop(
    expected: Sequence[SceneEvent],
    observed: Sequence[SceneEvent],
    *,
    duration_s: float,
    tolerance_s: float = 1.0,
) -> tuple[float, EventMatch]:
    """Match against one pass of a looping scene whose start time is not known.

    Observed times are on any clock. Each pairing of an observed with an expected event of the
    same key proposes a start offset; the earliest offset with the most matches wins, and only
    observed events within `[offset, offset + duration_s)` are compared. Returns the offset and
    the match.
    """
    offsets = sorted(
        {round(o.time_s - e.time_s, 3) for o in observed for e in expected if o.key() == e.key()}
    )
    best: tuple[float, EventMatch] | None = None
    for offset in offsets:
        window = [
            SceneEvent(o.kind, o.class_name, o.place, o.direction, o.time_s - offset)
            for o in observed
            if -tolerance_s <= o.time_s - offset < duration_s - tolerance_s / 2
        ]
        match = match_events(expected, window, tolerance_s=tolerance_s)
        if best is None or len(match.matched) > len(best[1].matched):
            best = (offset, match)
    if best is None:
        return 0.0, EventMatch(missing=list(expected), unexpected=list(observed))
    return best


def scene_agent_config(
    scene_dir: Path,
    *,
    camera_url: str,
    model_path: Path,
    class_names: Sequence[str],
    mqtt_port: int,
    outbox_path: Path,
    agent_id: str = "scene-agent",
    mqtt_host: str = "127.0.0.1",
    threads: int = 1,
    embedder: str = "none",
    low_score_threshold: float | None = 0.1,
    target_fps: float = 25.0,
    loop_file: bool = False,
) -> dict[str, Any]:
    """An edge-agent config (as a YAML-ready dict) watching one `events` scene."""
    document = json.loads((scene_dir / "events.json").read_text())
    (zone,), (line,) = document["zones"], document["lines"]
    return {
        "agent": {"id": agent_id},
        "cameras": [
            {
                "name": SCENE_CAMERA,
                "url": camera_url,
                "target_fps": target_fps,
                "loop_file": loop_file,
                "capture": {"stall_timeout_ms": 3000, "reconnect_min_backoff_ms": 200},
                "zones": [{"name": zone["name"], "points": zone["points_normalized"]}],
                "lines": [
                    {
                        "name": line["name"],
                        "points": line["points_normalized"],
                        "in_side": line["in_side"],
                    }
                ],
                "rules": [
                    {"name": "enter-zone-a", "kind": "zone_enter", "zone": zone["name"]},
                    {"name": "exit-zone-a", "kind": "zone_exit", "zone": zone["name"]},
                    {
                        "name": LOITER_RULE,
                        "kind": "loiter",
                        "zone": zone["name"],
                        "dwell_s": document["loiter_dwell_s"],
                    },
                    {"name": "cross-line-a", "kind": "line_cross", "line": line["name"]},
                ],
            }
        ],
        "detector": {
            "runtime": runtime_config_for(model_path, threads).model_dump(mode="json"),
            "class_names": list(class_names),
            "confidence_threshold": 0.3,
            "input_size": list(EDGE_INPUT_SIZE),
        },
        "tracker": {
            "embedder": embedder,
            "n_init": 2,
            "max_age_frames": 25,
            "low_score_threshold": low_score_threshold,
        },
        "mqtt": {
            "host": mqtt_host,
            "port": mqtt_port,
            "outbox_path": str(outbox_path),
            "status_interval_s": 5.0,
        },
        "metrics": {"enabled": False},
    }
