"""Evaluator of `count_line`: crossings of a line per direction, totalled per interval.

Intervals are aligned on frame time: interval `k` is `[k * interval_s, (k + 1) * interval_s)`, so
on wall-clock timestamps a 60 s interval is a clock minute (the first one seen is partial). A
crossing (as `line_cross` sees it, both directions) of a track that passes the rule's filter and
cool-down counts in the interval of its frame. The interval closes on the first frame at or after
its end, which sends one `update` (stamped with that frame's time) before its own crossings count;
the open interval closes when the stream ends. An interval in which no frame was seen sends
nothing; one with frames and no crossings sends zeros. A class correction or cloud withdrawal does
not take back a crossing already counted.
"""

from __future__ import annotations

import math

from edge_agent.config.rules import CountLineRule
from edge_agent.rules.context import RuleContext
from edge_agent.rules.evaluator import EvaluatorBase
from edge_agent.rules.events import LineCounts, RuleEvent
from edge_agent.rules.state import TrackChange, TrackState


class CountLineEvaluator(EvaluatorBase[CountLineRule]):
    """`count_line`: per-direction totals of crossings, one `update` event per interval."""

    kind = "count_line"

    def __init__(self, rule: CountLineRule, context: RuleContext) -> None:
        """Evaluate `rule`; `ValueError` if its line is not on the camera."""
        super().__init__(rule, context)
        context.line(rule, rule.line)
        self._interval: int | None = None  # index of the open interval; None before any frame
        self._in_count = 0
        self._out_count = 0

    def begin_frame(self, timestamp_s: float) -> list[RuleEvent]:
        """Close the open interval if this frame lies past it, and open the frame's interval."""
        interval = math.floor(timestamp_s / self.rule.interval_s)
        if interval == self._interval:
            return []
        events = self._close(timestamp_s)
        self._interval = interval
        return events

    def observe_track(
        self, track: TrackState, change: TrackChange, timestamp_s: float
    ) -> list[RuleEvent]:
        """Count the track's crossing, if any, in the open interval; no event now."""
        crossed = change.crossings.get(self.rule.line)
        if (
            crossed is not None
            and self.matches(track)
            and self.context.cooled(self.rule, track.track_id, timestamp_s)
        ):
            if crossed == "in":
                self._in_count += 1
            else:
                self._out_count += 1
        return []

    def finish(self, timestamp_s: float) -> list[RuleEvent]:
        """The totals of the open interval, cut short by the end of the stream."""
        return self._close(timestamp_s)

    def _close(self, timestamp_s: float) -> list[RuleEvent]:
        if self._interval is None:
            return []
        counts = LineCounts(
            start_s=self._interval * self.rule.interval_s,
            interval_s=self.rule.interval_s,
            in_count=self._in_count,
            out_count=self._out_count,
        )
        self._interval = None
        self._in_count = self._out_count = 0
        event = self.context.event(
            self.rule,
            self.kind,
            None,
            timestamp_s,
            phase="update",
            line=self.rule.line,
            line_counts=counts,
        )
        return [event]
