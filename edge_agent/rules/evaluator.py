"""`RuleEvaluator`: the hooks through which the engine drives one rule, and a base with defaults.

Per frame the engine calls, in order: `begin_frame`; `observe_track` for each tracked object
(after moving it, so `TrackChange` says what it entered, left or crossed); `forget_track` for each
track gone longer than the timeout; `end_frame`. `retract_start` is called for a recent `start`
of the rule whose track no longer passes the rule (a class correction, or the cloud saw nothing
there). When the stream ends, every track is forgotten, then `end_frame` and `finish` run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar, Generic, Protocol, TypeVar

from edge_agent.config.rules import RuleBase
from edge_agent.rules.context import RuleContext
from edge_agent.rules.events import RuleEvent, RuleKind
from edge_agent.rules.state import TrackChange, TrackState

RuleT = TypeVar("RuleT", bound=RuleBase)


class RuleEvaluator(Protocol):
    """Turns what the engine saw into the events of one rule; holds that rule's own state."""

    @property
    def rule(self) -> RuleBase:
        """The rule's config."""
        ...

    def begin_frame(self, timestamp_s: float) -> list[RuleEvent]:
        """A frame at `timestamp_s` begins, before any track is observed."""
        ...

    def observe_track(
        self, track: TrackState, change: TrackChange, timestamp_s: float
    ) -> list[RuleEvent]:
        """`track` was seen on this frame; `change` says what it entered, left or crossed."""
        ...

    def retract_start(
        self, track: TrackState, raised: RuleEvent, class_id: int, timestamp_s: float
    ) -> list[RuleEvent]:
        """Withdraw `raised`, a recent `start` of this rule for `track`; `class_id` is the class
        the track now has."""
        ...

    def forget_track(self, track: TrackState, timestamp_s: float) -> list[RuleEvent]:
        """`track` is forgotten (timed out, withdrawn, or the stream ended)."""
        ...

    def end_frame(self, timestamp_s: float) -> list[RuleEvent]:
        """Every track of the frame was observed and the stale ones forgotten."""
        ...

    def finish(self, timestamp_s: float) -> list[RuleEvent]:
        """The stream is over (every track already forgotten)."""
        ...


class EvaluatorBase(Generic[RuleT]):
    """A `RuleEvaluator` whose hooks do nothing, and whose `start` events retract as they are.

    Subclasses set `kind` (the config's `kind`, the registry key) and override the hooks they
    need.
    """

    kind: ClassVar[RuleKind]

    def __init__(self, rule: RuleT, context: RuleContext) -> None:
        """Evaluate `rule` on the camera of `context`."""
        self.rule = rule
        self.context = context

    def begin_frame(self, timestamp_s: float) -> list[RuleEvent]:
        """Nothing by default."""
        return []

    def observe_track(
        self, track: TrackState, change: TrackChange, timestamp_s: float
    ) -> list[RuleEvent]:
        """Nothing by default."""
        return []

    def retract_start(
        self, track: TrackState, raised: RuleEvent, class_id: int, timestamp_s: float
    ) -> list[RuleEvent]:
        """`raised` again as `retract` (same time, hence id), with the track's class now."""
        label = self.context.label(class_id)
        return [replace(raised, phase="retract", class_id=class_id, label=label)]

    def forget_track(self, track: TrackState, timestamp_s: float) -> list[RuleEvent]:
        """Nothing by default."""
        return []

    def end_frame(self, timestamp_s: float) -> list[RuleEvent]:
        """Nothing by default."""
        return []

    def finish(self, timestamp_s: float) -> list[RuleEvent]:
        """Nothing by default."""
        return []

    def matches(self, track: TrackState) -> bool:
        """Whether `track`, with its class now and best confidence, passes the rule's filter."""
        return self.context.matches(self.rule, track.class_id, track.confidence)
