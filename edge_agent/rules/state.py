"""What the rule engine knows of a camera's places and of each track between frames."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from edge_agent.config.geometry import LineConfig, Point, ZoneConfig
from edge_agent.rules.events import Box, Direction, RuleEvent
from edge_agent.rules.geometry import crossing_direction, pixel_points


@dataclass(frozen=True)
class Zone:
    """A zone with its polygon in pixels."""

    name: str
    points: tuple[Point, ...]

    @classmethod
    def from_config(cls, zone: ZoneConfig, frame_size: tuple[int, int]) -> Zone:
        """`zone` resolved to pixels of a frame `frame_size` `(width, height)` large."""
        return cls(zone.name, tuple(pixel_points(zone.points, zone.units, frame_size)))


@dataclass(frozen=True)
class Line:
    """A line segment `a -> b` in pixels; `in_side` is the inside, seen from `a` to `b`."""

    name: str
    a: Point
    b: Point
    in_side: Literal["left", "right"]

    @classmethod
    def from_config(cls, line: LineConfig, frame_size: tuple[int, int]) -> Line:
        """`line` resolved to pixels of a frame `frame_size` `(width, height)` large."""
        a, b = pixel_points(line.points, line.units, frame_size)
        return cls(line.name, a, b, line.in_side)

    def holds(self, point: Point) -> bool:
        """Whether `point` lies exactly on the (infinite) line."""
        (ax, ay), (bx, by) = self.a, self.b
        return (bx - ax) * (point[1] - ay) - (by - ay) * (point[0] - ax) == 0.0


@dataclass(frozen=True)
class TrackChange:
    """What one frame changed for one track: zones entered and left, lines crossed."""

    entered: frozenset[str] = frozenset()
    exited: frozenset[str] = frozenset()
    crossings: Mapping[str, Direction] = field(default_factory=dict)


@dataclass
class TrackState:
    """What the engine remembers of one track between frames."""

    track_id: int
    class_id: int
    confidence: float  # the best seen so far
    box: Box
    last_seen_s: float
    inside: dict[str, bool] = field(default_factory=dict)
    entered_s: dict[str, float] = field(default_factory=dict)
    line_anchor: dict[str, Point] = field(default_factory=dict)  # last point strictly off line
    raised: list[RuleEvent] = field(default_factory=list)  # recent `start` events, oldest first

    def move(
        self,
        anchor: Point,
        in_zones: Mapping[str, bool],
        lines: Sequence[Line],
        timestamp_s: float,
        *,
        is_new: bool,
    ) -> TrackChange:
        """Record the track's new anchor; the zones it entered or left and the lines it crossed.

        A track first seen inside a zone enters nothing (its time inside counts from now).
        """
        entered: set[str] = set()
        exited: set[str] = set()
        for name, now_inside in in_zones.items():
            if is_new:
                if now_inside:
                    self.entered_s[name] = timestamp_s
            elif now_inside != self.inside.get(name, False):
                if now_inside:
                    entered.add(name)
                    self.entered_s[name] = timestamp_s
                else:
                    exited.add(name)
                    self.entered_s.pop(name, None)
            self.inside[name] = now_inside
        crossings: dict[str, Direction] = {}
        for line in lines:
            before = self.line_anchor.get(line.name)
            if before is not None:
                direction = crossing_direction(before, anchor, line.a, line.b, line.in_side)
                if direction is not None:
                    crossings[line.name] = direction
            if not line.holds(anchor):
                self.line_anchor[line.name] = anchor
        return TrackChange(frozenset(entered), frozenset(exited), crossings)
