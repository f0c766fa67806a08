"""`RuleEngine`: turns one camera's tracked detections, frame by frame, into rule events.

Each tracked object is anchored at the bottom-centre of its box (where it touches the ground).
Conventions follow the scene generator's ground truth (`testbed.scenes.events`):

* `zone_enter` / `zone_exit` fire on the first frame the anchor is seen on the other side of the
  zone's boundary; a track first seen inside raises no enter, one that vanishes inside no exit.
* `line_cross` fires when the path from the last anchor strictly on one side of the line to the
  new anchor, strictly on the other side, meets the line segment; `in` is toward `in_side`.
* `retract` withdraws an instantaneous event (same id and time as its `start`) when the track's
  class changes, within `retract_window_s`, to one its rule does not accept (a cloud answer
  corrected the edge), or when the cloud found no object where the track was (`withdraw`); an
  active loiter of such a track ends.
* `loiter` starts once the anchor has been inside for `dwell_s` (counted from the enter, or from
  the first sighting for a track first seen inside) and ends when the track leaves the zone or is
  forgotten.
* `zone_occupancy` starts when the number of matching tracks inside reaches `min_objects`, sends
  `update` when that number changes while it holds, and ends when it drops below.

Rule filters are checked when an event fires: `classes` on the class of that frame's detection
(the tracker reports its track's voted class), `min_confidence` on the track's best confidence so
far (as Frigate's top score), so a crossing seen on a frame where an occluded object scores low is
not lost. The geometric state of a track is kept regardless, so a filtered frame never hides a
later crossing. `cooldown_s` holds back `start` events of a rule for the same track (per zone for
occupancy); `end` events are never held back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from detection.detections import Detections
from edge_agent.config.camera import CameraConfig
from edge_agent.config.geometry import LineConfig, Point, ZoneConfig
from edge_agent.config.rules import (
    LineCrossRule,
    LoiterRule,
    RuleBase,
    ZoneEnterRule,
    ZoneExitRule,
    ZoneOccupancyRule,
)
from edge_agent.rules.geometry import bottom_centres, crossing_direction, points_in_polygon

RuleKind = Literal["zone_enter", "zone_exit", "zone_occupancy", "line_cross", "loiter"]
Phase = Literal["start", "update", "end", "retract"]
Direction = Literal["in", "out"]
Box = tuple[float, float, float, float]

_RAISED_KEPT = 32  # `start` events remembered per track, for retraction

NO_TRACK = -1
"""`track_id` / `class_id` of events that concern a zone rather than one object (occupancy)."""


@dataclass(frozen=True)
class RuleEvent:
    """One event of a rule.

    `phase` is `start` for instantaneous events (enter, exit, cross) and for the start of a
    lasting one (loiter, occupancy), which later sends `end` (occupancy also `update`). `box` is
    the object's `(x1, y1, x2, y2)` in pixels (its last box for `end` events; `None` for
    occupancy) of a frame `frame_size` `(width, height)` pixels large. `label` is the name of
    `class_id` (from the detector's class names; `None` where it has none, or for occupancy).
    `zone` or `line` names the place; `direction` is set for crossings and `count` (objects
    inside) for occupancy.
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


@dataclass(frozen=True)
class _Zone:
    name: str
    points: tuple[Point, ...]


@dataclass(frozen=True)
class _Line:
    name: str
    a: Point
    b: Point
    in_side: Literal["left", "right"]


@dataclass
class _Track:
    """What the engine remembers of one track between frames."""

    track_id: int
    class_id: int
    confidence: float  # the best seen so far
    box: Box
    last_seen_s: float
    inside: dict[str, bool] = field(default_factory=dict)
    entered_s: dict[str, float] = field(default_factory=dict)
    line_anchor: dict[str, Point] = field(default_factory=dict)  # last point strictly off line
    loitering: set[str] = field(default_factory=set)  # names of loiter rules started
    raised: list[RuleEvent] = field(default_factory=list)  # recent `start` events, oldest first


def _resolve(points: Sequence[Point], units: str, frame_size: tuple[int, int]) -> list[Point]:
    if units == "pixel":
        return [(float(x), float(y)) for x, y in points]
    width, height = frame_size
    return [(float(x) * width, float(y) * height) for x, y in points]


class RuleEngine:
    """Rules of one camera, fed once per frame with its tracked detections.

    `frame_size` is `(width, height)` in pixels, used to resolve normalised zones and lines;
    `class_names` maps `class_id` to the names rules filter on; tracks not seen for more than
    `track_timeout_s` are forgotten (ending their loiter events).
    """

    def __init__(
        self,
        camera: CameraConfig,
        *,
        frame_size: tuple[int, int],
        class_names: Sequence[str],
        track_timeout_s: float = 2.0,
        retract_window_s: float = 30.0,
    ) -> None:
        width, height = frame_size
        if width <= 0 or height <= 0:
            raise ValueError(f"frame size must be positive, got {width}x{height}")
        if track_timeout_s < 0:
            raise ValueError(f"track_timeout_s must be >= 0, got {track_timeout_s}")
        self.camera = camera.name
        self.frame_size = (width, height)
        self.class_names = tuple(class_names)
        self.track_timeout_s = track_timeout_s
        self.retract_window_s = retract_window_s
        self._zones = {z.name: self._zone(z, frame_size) for z in camera.zones}
        self._lines = {line.name: self._line(line, frame_size) for line in camera.lines}
        self._rules = list(camera.rules)
        for rule in self._rules:
            if isinstance(rule, LineCrossRule):
                if rule.line not in self._lines:
                    raise ValueError(f"rule {rule.name!r} refers to unknown line {rule.line!r}")
            elif rule.zone not in self._zones:
                raise ValueError(f"rule {rule.name!r} refers to unknown zone {rule.zone!r}")
        self._tracks: dict[int, _Track] = {}
        self._last_fired: dict[tuple[str, int], float] = {}  # (rule, track) -> time
        self._occupancy: dict[str, int] = {}  # occupancy rule -> count while it holds
        self._last_timestamp_s: float | None = None

    @staticmethod
    def _zone(zone: ZoneConfig, frame_size: tuple[int, int]) -> _Zone:
        return _Zone(zone.name, tuple(_resolve(zone.points, zone.units, frame_size)))

    @staticmethod
    def _line(line: LineConfig, frame_size: tuple[int, int]) -> _Line:
        a, b = _resolve(line.points, line.units, frame_size)
        return _Line(line.name, a, b, line.in_side)

    @property
    def track_ids(self) -> list[int]:
        """Ids of the tracks currently remembered."""
        return sorted(self._tracks)

    def _matches(self, rule: RuleBase, class_id: int, confidence: float) -> bool:
        if confidence < rule.min_confidence:
            return False
        if not rule.classes:
            return True
        if 0 <= class_id < len(self.class_names):
            return self.class_names[class_id] in rule.classes
        return False

    def _label(self, class_id: int) -> str | None:
        """The name of `class_id`, None where the class names do not cover it."""
        return self.class_names[class_id] if 0 <= class_id < len(self.class_names) else None

    def _cooled(self, rule: RuleBase, key: int, timestamp_s: float) -> bool:
        """Whether `rule` may fire for `key` now; records the firing if so."""
        last = self._last_fired.get((rule.name, key))
        if last is not None and timestamp_s - last < rule.cooldown_s:
            return False
        self._last_fired[(rule.name, key)] = timestamp_s
        return True

    def _event(
        self,
        rule: RuleBase,
        kind: RuleKind,
        track: _Track | None,
        timestamp_s: float,
        *,
        phase: Phase = "start",
        zone: str | None = None,
        line: str | None = None,
        direction: Direction | None = None,
        count: int | None = None,
    ) -> RuleEvent:
        return RuleEvent(
            rule=rule.name,
            kind=kind,
            camera=self.camera,
            track_id=track.track_id if track else NO_TRACK,
            class_id=track.class_id if track else NO_TRACK,
            timestamp_s=timestamp_s,
            box=track.box if track else None,
            phase=phase,
            direction=direction,
            zone=zone,
            line=line,
            count=count,
            label=self._label(track.class_id) if track else None,
            frame_size=self.frame_size,
        )

    def update(self, detections: Detections, timestamp_s: float) -> list[RuleEvent]:
        """Events raised by one frame; detections without a track (`tracker_id < 0`) are ignored.

        Timestamps must not go backwards. A track id seen twice in one frame keeps its first box.
        """
        if self._last_timestamp_s is not None and timestamp_s < self._last_timestamp_s:
            raise ValueError(
                f"timestamp went backwards: {timestamp_s} after {self._last_timestamp_s}"
            )
        self._last_timestamp_s = timestamp_s
        events: list[RuleEvent] = []
        tracked = np.flatnonzero(detections.tracker_id >= 0)
        _, first = np.unique(detections.tracker_id[tracked], return_index=True)
        rows = tracked[np.sort(first)]
        anchors = bottom_centres(detections.xyxy[rows])
        inside = {
            name: points_in_polygon(anchors, zone.points) if len(rows) else np.zeros(0, bool)
            for name, zone in self._zones.items()
        }
        for k, row in enumerate(rows):
            anchor = (float(anchors[k, 0]), float(anchors[k, 1]))
            in_zones = {name: bool(flags[k]) for name, flags in inside.items()}
            events += self._update_track(detections, int(row), anchor, in_zones, timestamp_s)
        events += self._forget(timestamp_s)
        events += self._occupancy_events(timestamp_s)
        return events

    def _update_track(
        self,
        detections: Detections,
        row: int,
        anchor: Point,
        in_zones: dict[str, bool],
        timestamp_s: float,
    ) -> list[RuleEvent]:
        track_id = int(detections.tracker_id[row])
        x1, y1, x2, y2 = (float(v) for v in detections.xyxy[row])
        box = (x1, y1, x2, y2)
        class_id = int(detections.class_id[row])
        confidence = float(detections.confidence[row])
        track = self._tracks.get(track_id)
        is_new = track is None
        if track is None:
            track = _Track(track_id, class_id, confidence, box, timestamp_s)
            self._tracks[track_id] = track
        changed_class = [] if is_new else self._class_changed(track, class_id, timestamp_s)
        track.class_id, track.box = class_id, box
        track.confidence = max(track.confidence, confidence)
        track.last_seen_s = timestamp_s

        entered: set[str] = set()
        exited: set[str] = set()
        for name, now_inside in in_zones.items():
            if is_new:
                if now_inside:
                    track.entered_s[name] = timestamp_s
            elif now_inside != track.inside.get(name, False):
                if now_inside:
                    entered.add(name)
                    track.entered_s[name] = timestamp_s
                else:
                    exited.add(name)
                    track.entered_s.pop(name, None)
            track.inside[name] = now_inside

        crossings: dict[str, Direction] = {}
        for name, line in self._lines.items():
            before = track.line_anchor.get(name)
            if before is not None:
                direction = crossing_direction(before, anchor, line.a, line.b, line.in_side)
                if direction is not None:
                    crossings[name] = direction
            if not _on_line(anchor, line):
                track.line_anchor[name] = anchor

        events: list[RuleEvent] = []
        for rule in self._rules:
            matches = self._matches(rule, class_id, track.confidence)
            if isinstance(rule, ZoneEnterRule | ZoneExitRule):
                changed = entered if isinstance(rule, ZoneEnterRule) else exited
                if rule.zone in changed and matches and self._cooled(rule, track_id, timestamp_s):
                    events.append(self._event(rule, rule.kind, track, timestamp_s, zone=rule.zone))
            elif isinstance(rule, LineCrossRule):
                crossed = crossings.get(rule.line)
                if (
                    crossed is not None
                    and rule.direction in (crossed, "both")
                    and matches
                    and self._cooled(rule, track_id, timestamp_s)
                ):
                    events.append(
                        self._event(
                            rule, rule.kind, track, timestamp_s, line=rule.line, direction=crossed
                        )
                    )
            elif isinstance(rule, LoiterRule):
                events += self._loiter(rule, track, matches, timestamp_s)
        track.raised += [e for e in events if e.phase == "start"]
        del track.raised[:-_RAISED_KEPT]
        return changed_class + events

    def _class_changed(self, track: _Track, class_id: int, timestamp_s: float) -> list[RuleEvent]:
        """Withdraw what the track raised under a class its rule no longer accepts.

        The tracker reports a track's voted class, which a cloud answer can overturn: a recent
        instantaneous event is sent again as `retract` (same id and time as its `start`), an
        active loiter ends now.
        """
        return self._retract(
            track,
            timestamp_s,
            lambda rule: self._matches(rule, class_id, track.confidence),
            class_id,
        )

    def _retract(
        self,
        track: _Track,
        timestamp_s: float,
        still_holds: Callable[[RuleBase], bool],
        class_id: int,
    ) -> list[RuleEvent]:
        """Retract the track's recent `start`s whose rule no longer `still_holds` (an active
        loiter of such a rule ends instead); the track's class becomes `class_id`."""
        by_name = {rule.name: rule for rule in self._rules}
        events: list[RuleEvent] = []
        kept: list[RuleEvent] = []
        for raised in track.raised:
            rule = by_name[raised.rule]
            recent = timestamp_s - raised.timestamp_s <= self.retract_window_s
            if still_holds(rule) or not recent:
                kept.append(raised)
            elif isinstance(rule, LoiterRule):
                if rule.name in track.loitering:
                    track.loitering.discard(rule.name)
                    track.class_id = class_id
                    events.append(
                        self._event(
                            rule, rule.kind, track, timestamp_s, zone=rule.zone, phase="end"
                        )
                    )
            else:
                events.append(
                    replace(raised, phase="retract", class_id=class_id, label=self._label(class_id))
                )
        track.raised = kept
        return events

    def withdraw(self, track_ids: Iterable[int]) -> list[RuleEvent]:
        """The cloud found no object where these tracks were: retract their recent
        instantaneous events, end their loiters and forget them (zone occupancy is recounted
        on the next frame). Stamped with the last frame's time; unknown ids are ignored."""
        timestamp_s = self._last_timestamp_s
        if timestamp_s is None:
            return []
        events: list[RuleEvent] = []
        for track_id in track_ids:
            track = self._tracks.get(int(track_id))
            if track is None:
                continue
            events += self._retract(track, timestamp_s, lambda _rule: False, track.class_id)
            events += self._drop([track], timestamp_s)
        return events

    def _loiter(
        self, rule: LoiterRule, track: _Track, matches: bool, timestamp_s: float
    ) -> list[RuleEvent]:
        since = track.entered_s.get(rule.zone)
        if rule.name in track.loitering:
            if since is None:  # left the zone
                track.loitering.discard(rule.name)
                return [
                    self._event(rule, rule.kind, track, timestamp_s, zone=rule.zone, phase="end")
                ]
            return []
        if (
            since is not None
            and matches
            and timestamp_s - since >= rule.dwell_s
            and self._cooled(rule, track.track_id, timestamp_s)
        ):
            track.loitering.add(rule.name)
            return [self._event(rule, rule.kind, track, timestamp_s, zone=rule.zone)]
        return []

    def _forget(self, timestamp_s: float) -> list[RuleEvent]:
        stale = [
            t for t in self._tracks.values() if timestamp_s - t.last_seen_s > self.track_timeout_s
        ]
        return self._drop(stale, timestamp_s)

    def _drop(self, tracks: list[_Track], timestamp_s: float) -> list[RuleEvent]:
        events: list[RuleEvent] = []
        for track in tracks:
            for rule in self._rules:
                if isinstance(rule, LoiterRule) and rule.name in track.loitering:
                    events.append(
                        self._event(
                            rule, rule.kind, track, timestamp_s, zone=rule.zone, phase="end"
                        )
                    )
            del self._tracks[track.track_id]
            for key in [k for k in self._last_fired if k[1] == track.track_id]:
                del self._last_fired[key]
        return events

    def _occupancy_events(self, timestamp_s: float) -> list[RuleEvent]:
        events: list[RuleEvent] = []
        for rule in self._rules:
            if not isinstance(rule, ZoneOccupancyRule):
                continue
            count = sum(
                1
                for t in self._tracks.values()
                if t.inside.get(rule.zone, False) and self._matches(rule, t.class_id, t.confidence)
            )
            active = self._occupancy.get(rule.name)
            phase: Phase | None = None
            if active is None:
                if count >= rule.min_objects and self._cooled(rule, NO_TRACK, timestamp_s):
                    phase = "start"
            elif count < rule.min_objects:
                phase = "end"
            elif count != active:
                phase = "update"
            if phase is None:
                continue
            if phase == "end":
                self._occupancy.pop(rule.name)
            else:
                self._occupancy[rule.name] = count
            events.append(
                self._event(
                    rule, rule.kind, None, timestamp_s, zone=rule.zone, phase=phase, count=count
                )
            )
        return events

    def finish(self, timestamp_s: float) -> list[RuleEvent]:
        """End every lasting event (stream over): forget all tracks, end loiter and occupancy."""
        events = self._drop(list(self._tracks.values()), timestamp_s)
        events += self._occupancy_events(timestamp_s)
        return events


def _on_line(point: Point, line: _Line) -> bool:
    (ax, ay), (bx, by) = line.a, line.b
    return (bx - ax) * (point[1] - ay) - (by - ay) * (point[0] - ax) == 0.0
