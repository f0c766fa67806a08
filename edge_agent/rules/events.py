"""`RuleEvent`: what a rule raises, and the literals that describe it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RuleKind = Literal[
    "zone_enter", "zone_exit", "zone_occupancy", "line_cross", "loiter", "count_line"
]
Phase = Literal["start", "update", "end", "retract"]
Direction = Literal["in", "out"]
Box = tuple[float, float, float, float]

NO_TRACK = -1
"""`track_id` / `class_id` of events that concern a place rather than one object (occupancy,
line counts)."""


@dataclass(frozen=True)
class LineCounts:
    """Crossings of a line counted over one interval of frame time (`count_line` events).

    The interval is `[start_s, start_s + interval_s)`; the last one of a stream may end early.
    """

    start_s: float
    interval_s: float
    in_count: int = 0
    out_count: int = 0

    def by_direction(self) -> dict[Direction, int]:
        """The totals keyed by direction: `{"in": ..., "out": ...}`."""
        return {"in": self.in_count, "out": self.out_count}


@dataclass(frozen=True)
class RuleEvent:
    """One event of a rule.

    `phase` is `start` for instantaneous events (enter, exit, cross) and for the start of a
    lasting one (loiter, occupancy), which later sends `end` (occupancy also `update`); line
    counts send one `update` per interval. `box` is the object's `(x1, y1, x2, y2)` in pixels
    (its last box for `end` events; `None` for occupancy and counts) of a frame `frame_size`
    `(width, height)` pixels large. `label` is the name of `class_id` (from the detector's class
    names; `None` where it has none, or for occupancy and counts). `zone` or `line` names the
    place; `direction` is set for crossings, `count` (objects inside) for occupancy and
    `line_counts` for line counts.
    """

    rule: str
    kind: RuleKind
    camera: str
    track_id: int
    class_id: int
    timestamp_s: float
    box: Box | None
    phase: Phase = "start"
    direction: Direction | None = None
    zone: str | None = None
    line: str | None = None
    count: int | None = None
    label: str | None = None
    frame_size: tuple[int, int] | None = None
    line_counts: LineCounts | None = None
