"""Evaluators of the zone, line, loiter and occupancy rule kinds.

* `zone_enter` / `zone_exit` fire on the first frame the anchor is seen on the other side of the
  zone's boundary; a track first seen inside raises no enter, one that vanishes inside no exit.
* `line_cross` fires when the path from the last anchor strictly on one side of the line to the
  new anchor, strictly on the other side, meets the line segment; `in` is toward `in_side`.
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
    LineCrossRule,
    LoiterRule,
    ZoneEnterRule,
    ZoneExitRule,
    ZoneOccupancyRule,
)
from edge_agent.rules.context import RuleContext
from edge_agent.rules.evaluator import EvaluatorBase
from edge_agent.rules.events import NO_TRACK, Phase, RuleEvent
from edge_agent.rules.state import TrackChange, TrackState

ZoneRuleT = TypeVar("ZoneRuleT", bound=ZoneEnterRule | ZoneExitRule)


class _ZoneCrossingEvaluator(EvaluatorBase[ZoneRuleT]):
    """A `start` on the frame a matching track's anchor moves into (or out of) the zone."""

    def __init__(self, rule: ZoneRuleT, context: RuleContext) -> None:
        """Evaluate `rule`; `ValueError` if its zone is not on the camera."""
        super().__init__(rule, context)
        context.zone(rule, rule.zone)

    def _moved(self, change: TrackChange) -> AbstractSet[str]:
        """The zones the track moved into or out of, whichever this kind watches."""
        raise NotImplementedError

    def observe_track(
        self, track: TrackState, change: TrackChange, timestamp_s: float
    ) -> list[RuleEvent]:
        """A `start` on the frame the track crosses the zone's edge the watched way."""
        if (
            self.rule.zone in self._moved(change)
            and self.matches(track)
            and self.context.cooled(self.rule, track.track_id, timestamp_s)
        ):
            return [
                self.context.event(self.rule, self.kind, track, timestamp_s, zone=self.rule.zone)
            ]
        return []


class ZoneEnterEvaluator(_ZoneCrossingEvaluator[ZoneEnterRule]):
    """`zone_enter`: a matching track's anchor moves into the zone."""

    kind = "zone_enter"

    def _moved(self, change: TrackChange) -> AbstractSet[str]:
        return change.entered


class ZoneExitEvaluator(_ZoneCrossingEvaluator[ZoneExitRule]):
    """`zone_exit`: a matching track's anchor moves out of the zone."""

    kind = "zone_exit"

    def _moved(self, change: TrackChange) -> AbstractSet[str]:
        return change.exited


class LineCrossEvaluator(EvaluatorBase[LineCrossRule]):
    """`line_cross`: a matching track crosses the line in a wanted direction."""

    kind = "line_cross"

    def __init__(self, rule: LineCrossRule, context: RuleContext) -> None:
        """Evaluate `rule`; `ValueError` if its line is not on the camera."""
        super().__init__(rule, context)
        context.line(rule, rule.line)

    def observe_track(
        self, track: TrackState, change: TrackChange, timestamp_s: float
    ) -> list[RuleEvent]:
        """A `start` with the crossing's direction on the frame the track crosses."""
        crossed = change.crossings.get(self.rule.line)
        if (
            crossed is not None
            and self.rule.direction in (crossed, "both")
            and self.matches(track)
            and self.context.cooled(self.rule, track.track_id, timestamp_s)
        ):
            event = self.context.event(
                self.rule, self.kind, track, timestamp_s, line=self.rule.line, direction=crossed
            )
            return [event]
        return []


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
