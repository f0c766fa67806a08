"""Evaluators of the zone, line, loiter and occupancy rule kinds.

* `zone_enter` / `zone_exit` fire on the first frame the anchor is seen on the other side of the
  zone's boundary; a track first seen inside raises no enter, one that vanishes inside no exit.
* `line_cross` fires when the path from the last anchor strictly on one side of the line to the
  new anchor, strictly on the other side, meets the line segment; `in` is toward `in_side`.
* A crossing (enter, exit, line) by a track whose best confidence is still under the rule's
  `min_confidence` is held for `confirm_within_s`: it fires, stamped at the crossing, on the first
  frame the track passes the filter while still on the side the crossing took it to. A box that
  analyses a fraction of the camera's frames samples each object's score less often, so the score
  that passes the filter may come a frame or two after the crossing; without this the crossing
  was lost for good (the object is already across).
* `loiter` starts once the anchor has been inside for `dwell_s` (counted from the enter, or from
  the first sighting for a track first seen inside) and ends when the track leaves the zone or is
  forgotten, or when a recent start is withdrawn.
* `zone_occupancy` starts when the number of matching tracks inside reaches `min_objects`, sends
  `update` when that number changes while it holds, and ends when it drops below.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import TypeVar

from edge_agent.config.rules import (
    CrossingRuleBase,
    LineCrossRule,
    LoiterRule,
    ZoneEnterRule,
    ZoneExitRule,
    ZoneOccupancyRule,
)
from edge_agent.rules.context import RuleContext
from edge_agent.rules.evaluator import EvaluatorBase
from edge_agent.rules.events import NO_TRACK, Direction, Phase, RuleEvent
from edge_agent.rules.geometry import side_of_line
from edge_agent.rules.state import TrackChange, TrackState

ZoneRuleT = TypeVar("ZoneRuleT", bound=ZoneEnterRule | ZoneExitRule)
CrossingRuleT = TypeVar("CrossingRuleT", bound=CrossingRuleBase)


class _CrossingEvaluator(EvaluatorBase[CrossingRuleT]):
    """Fires once per crossing; holds a crossing by a track not yet sure enough (see the
    module docstring) until it passes the filter, goes back, or `confirm_within_s` ends."""

    def __init__(self, rule: CrossingRuleT, context: RuleContext) -> None:
        super().__init__(rule, context)
        # track id -> (crossing time, line direction or None), held for `confirm_within_s`
        self._held: dict[int, tuple[float, Direction | None]] = {}

    def _still_across(self, track: TrackState, direction: Direction | None) -> bool:
        """Whether the track is still where its held crossing took it."""
        raise NotImplementedError

    def _fire(
        self, track: TrackState, timestamp_s: float, direction: Direction | None
    ) -> RuleEvent:
        raise NotImplementedError

    def _crossed(
        self, track: TrackState, crossed: bool, direction: Direction | None, timestamp_s: float
    ) -> list[RuleEvent]:
        """The events of a frame on which the track `crossed` (or not) the watched way."""
        if crossed:
            self._held.pop(track.track_id, None)
            if self.matches(track):
                return self._fire_cooled(track, timestamp_s, direction)
            if self._class_passes(track) and self.rule.confirm_within_s > 0.0:
                self._held[track.track_id] = (timestamp_s, direction)
            return []
        held = self._held.get(track.track_id)
        if held is None:
            return []
        crossed_s, held_direction = held
        if timestamp_s - crossed_s > self.rule.confirm_within_s or not self._still_across(
            track, held_direction
        ):
            del self._held[track.track_id]
            return []
        if not self.matches(track):
            return []
        del self._held[track.track_id]
        return self._fire_cooled(track, crossed_s, held_direction)

    def _fire_cooled(
        self, track: TrackState, timestamp_s: float, direction: Direction | None
    ) -> list[RuleEvent]:
        if not self.context.cooled(self.rule, track.track_id, timestamp_s):
            return []
        return [self._fire(track, timestamp_s, direction)]

    def _class_passes(self, track: TrackState) -> bool:
        """The class filter alone: a held crossing waits for confidence, not for a class."""
        return self.context.matches(self.rule, track.class_id, self.rule.min_confidence)

    def forget_track(self, track: TrackState, timestamp_s: float) -> list[RuleEvent]:
        """A held crossing of a forgotten track is dropped."""
        self._held.pop(track.track_id, None)
        return []


class _ZoneCrossingEvaluator(_CrossingEvaluator[ZoneRuleT]):
    """A `start` on the frame a matching track's anchor moves into (or out of) the zone."""

    entering: bool  # which way this kind watches

    def __init__(self, rule: ZoneRuleT, context: RuleContext) -> None:
        """Evaluate `rule`; `ValueError` if its zone is not on the camera."""
        super().__init__(rule, context)
        context.zone(rule, rule.zone)

    def _moved(self, change: TrackChange) -> AbstractSet[str]:
        """The zones the track moved into or out of, whichever this kind watches."""
        return change.entered if self.entering else change.exited

    def observe_track(
        self, track: TrackState, change: TrackChange, timestamp_s: float
    ) -> list[RuleEvent]:
        """A `start` on the frame the track crosses the zone's edge the watched way."""
        return self._crossed(track, self.rule.zone in self._moved(change), None, timestamp_s)

    def _still_across(self, track: TrackState, direction: Direction | None) -> bool:
        return track.inside.get(self.rule.zone, False) == self.entering

    def _fire(
        self, track: TrackState, timestamp_s: float, direction: Direction | None
    ) -> RuleEvent:
        return self.context.event(self.rule, self.kind, track, timestamp_s, zone=self.rule.zone)


class ZoneEnterEvaluator(_ZoneCrossingEvaluator[ZoneEnterRule]):
    """`zone_enter`: a matching track's anchor moves into the zone."""

    kind = "zone_enter"
    entering = True


class ZoneExitEvaluator(_ZoneCrossingEvaluator[ZoneExitRule]):
    """`zone_exit`: a matching track's anchor moves out of the zone."""

    kind = "zone_exit"
    entering = False


class LineCrossEvaluator(_CrossingEvaluator[LineCrossRule]):
    """`line_cross`: a matching track crosses the line in a wanted direction."""

    kind = "line_cross"

    def __init__(self, rule: LineCrossRule, context: RuleContext) -> None:
        """Evaluate `rule`; `ValueError` if its line is not on the camera."""
        super().__init__(rule, context)
        self._line = context.line(rule, rule.line)

    def observe_track(
        self, track: TrackState, change: TrackChange, timestamp_s: float
    ) -> list[RuleEvent]:
        """A `start` with the crossing's direction on the frame the track crosses."""
        crossed = change.crossings.get(self.rule.line)
        wanted = crossed is not None and self.rule.direction in (crossed, "both")
        if crossed is not None and not wanted:
            self._held.pop(track.track_id, None)  # crossed back: a held crossing is undone
        return self._crossed(track, wanted, crossed, timestamp_s)

    def _still_across(self, track: TrackState, direction: Direction | None) -> bool:
        anchor = track.line_anchor.get(self.rule.line)
        if anchor is None or direction is None:
            return False
        line = self._line
        left = float(side_of_line([anchor], line.a, line.b)[0]) < 0.0
        return (left == (line.in_side == "left")) == (direction == "in")

    def _fire(
        self, track: TrackState, timestamp_s: float, direction: Direction | None
    ) -> RuleEvent:
        return self.context.event(
            self.rule, self.kind, track, timestamp_s, line=self.rule.line, direction=direction
        )


class LoiterEvaluator(EvaluatorBase[LoiterRule]):
    """`loiter`: a matching track stays in the zone for `dwell_s` (lasts until it leaves)."""

    kind = "loiter"

    def __init__(self, rule: LoiterRule, context: RuleContext) -> None:
        """Evaluate `rule`; `ValueError` if its zone is not on the camera."""
        super().__init__(rule, context)
        context.zone(rule, rule.zone)
        self._loitering: set[int] = set()  # tracks whose loiter started and has not ended

    def observe_track(
        self, track: TrackState, change: TrackChange, timestamp_s: float
    ) -> list[RuleEvent]:
        """`start` once the dwell time is reached, `end` on the frame the track leaves."""
        since = track.entered_s.get(self.rule.zone)
        if track.track_id in self._loitering:
            return self._end(track, timestamp_s) if since is None else []
        if (
            since is not None
            and self.matches(track)
            and timestamp_s - since >= self.rule.dwell_s
            and self.context.cooled(self.rule, track.track_id, timestamp_s)
        ):
            self._loitering.add(track.track_id)
            return [
                self.context.event(self.rule, self.kind, track, timestamp_s, zone=self.rule.zone)
            ]
        return []

    def retract_start(
        self, track: TrackState, raised: RuleEvent, class_id: int, timestamp_s: float
    ) -> list[RuleEvent]:
        """A lasting event is not retracted: an active loiter ends now, under `class_id`."""
        if track.track_id not in self._loitering:
            return []
        track.class_id = class_id  # the end carries the class that ended it
        return self._end(track, timestamp_s)

    def forget_track(self, track: TrackState, timestamp_s: float) -> list[RuleEvent]:
        """An active loiter of a forgotten track ends with its last box."""
        return self._end(track, timestamp_s) if track.track_id in self._loitering else []

    def _end(self, track: TrackState, timestamp_s: float) -> list[RuleEvent]:
        self._loitering.discard(track.track_id)
        return [
            self.context.event(
                self.rule, self.kind, track, timestamp_s, zone=self.rule.zone, phase="end"
            )
        ]


class ZoneOccupancyEvaluator(EvaluatorBase[ZoneOccupancyRule]):
    """`zone_occupancy`: at least `min_objects` matching tracks inside (lasts while it holds)."""

    kind = "zone_occupancy"

    def __init__(self, rule: ZoneOccupancyRule, context: RuleContext) -> None:
        """Evaluate `rule`; `ValueError` if its zone is not on the camera."""
        super().__init__(rule, context)
        context.zone(rule, rule.zone)
        self._active: int | None = None  # the count last sent while the event holds

    def end_frame(self, timestamp_s: float) -> list[RuleEvent]:
        """Count the matching tracks inside; `start`, `update` or `end` as the count moves."""
        rule = self.rule
        count = sum(
            1
            for track in self.context.tracks.values()
            if track.inside.get(rule.zone, False) and self.matches(track)
        )
        phase: Phase | None = None
        if self._active is None:
            if count >= rule.min_objects and self.context.cooled(rule, NO_TRACK, timestamp_s):
                phase = "start"
        elif count < rule.min_objects:
            phase = "end"
        elif count != self._active:
            phase = "update"
        if phase is None:
            return []
        self._active = None if phase == "end" else count
        event = self.context.event(
            rule, self.kind, None, timestamp_s, zone=rule.zone, phase=phase, count=count
        )
        return [event]
