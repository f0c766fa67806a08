"""`DeadlineWatch`: notices when most escalated frames expire before the cloud answers them.

An edge deadline shorter than the cloud's queue plus inference makes the hybrid run as edge-only
without a word: the shipped edge example (500 ms then) escalating to the CPU cloud config (about
350 ms of inference per frame, and a queue) got 1 answer for 102 escalations on a real clip. The
watch keeps the outcomes of the last answers (answered, or expired: DEADLINE_EXCEEDED from the
cloud's queue or no answer in time at the edge) over a sliding window; when at least
`MIN_OUTCOMES` outcomes in it are `MISMATCH_SHARE` or more expired, there is a mismatch, and
`advice` says what to change. The stage logs that once per onset, shows it on the status topic
and sets `edge_agent_escalation_deadline_mismatch`.

Pure: the caller passes `now` (monotonic seconds).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

WINDOW_S = 30.0
"""Outcomes older than this are forgotten (the verdict follows the cloud's load within it)."""
MIN_OUTCOMES = 8
"""Outcomes the window must hold before it judges (a few expiries in a burst are no mismatch)."""
MISMATCH_SHARE = 0.5
"""Share of expired outcomes in the window that is a mismatch."""
CLEAR_SHARE = 0.2
"""Share under which a mismatch is over (hysteresis: no flapping log lines)."""
MAX_DEADLINE_MS = 60_000  # the bound of `escalation.deadline_ms`


@dataclass(frozen=True, slots=True)
class DeadlineVerdict:
    """What the watch makes of the recent answers."""

    mismatch: bool
    outcomes: int  # in the window
    expired_share: float | None  # None with no outcome in the window
    rtt_p90_ms: float | None  # of the answered ones in the window
    suggested_deadline_ms: int | None  # with a mismatch


class DeadlineWatch:
    """Expired against answered escalations over the last `WINDOW_S` (see the module docstring)."""

    def __init__(self, deadline_ms: int) -> None:
        if deadline_ms <= 0:
            raise ValueError(f"deadline_ms must be > 0, got {deadline_ms}")
        self.deadline_ms = deadline_ms
        self._outcomes: deque[tuple[float, bool, float | None]] = deque()
        self._mismatch = False
        self.onsets = 0  # mismatches begun so far

    def observe(self, now: float, *, expired: bool, rtt_s: float | None = None) -> bool:
        """Record one outcome at `now`; True when this outcome began a mismatch (log it)."""
        if rtt_s is not None and not math.isfinite(rtt_s):
            rtt_s = None
        self._outcomes.append((now, expired, rtt_s))
        self._trim(now)
        n = len(self._outcomes)
        share = sum(1 for _, e, _ in self._outcomes if e) / n
        if not self._mismatch and n >= MIN_OUTCOMES and share >= MISMATCH_SHARE:
            self._mismatch = True
            self.onsets += 1
            return True
        if self._mismatch and share < CLEAR_SHARE:
            self._mismatch = False
        return False

    def verdict(self, now: float) -> DeadlineVerdict:
        """The current verdict (outcomes older than the window forgotten)."""
        self._trim(now)
        n = len(self._outcomes)
        if n == 0:
            self._mismatch = False
            return DeadlineVerdict(False, 0, None, None, None)
        share = sum(1 for _, e, _ in self._outcomes if e) / n
        rtts = sorted(r for _, _, r in self._outcomes if r is not None)
        p90 = 1000.0 * rtts[min(len(rtts) - 1, int(0.9 * len(rtts)))] if rtts else None
        suggested = self._suggest(p90) if self._mismatch else None
        return DeadlineVerdict(self._mismatch, n, share, p90, suggested)

    def advice(self, now: float) -> str:
        """One line saying what is wrong and what to change (for the log)."""
        v = self.verdict(now)
        share = 0.0 if v.expired_share is None else v.expired_share
        measured = (
            f"answered round trips p90 {v.rtt_p90_ms:.0f} ms"
            if v.rtt_p90_ms is not None
            else "no frame was answered in time"
        )
        return (
            f"{100.0 * share:.0f} % of the last {v.outcomes} escalated frames expired before the "
            f"cloud answered (escalation.deadline_ms {self.deadline_ms} ms; {measured}): the "
            "hybrid is running as edge-only. Raise escalation.deadline_ms to about "
            f"{v.suggested_deadline_ms or self._suggest(v.rtt_p90_ms)} ms, or lower "
            "escalation.per_camera_frames_per_s, or give the cloud more capacity (a GPU "
            "config, more replicas)"
        )

    def _suggest(self, rtt_p90_ms: float | None) -> int:
        """Twice the measured round trip, at least four times the current deadline (only the
        fastest frames were answered: the queue that expired the others is longer than they
        show; on the CPU cloud config 500 ms answered 2 of 60 frames with a p90 of 486 ms, and
        2,000 ms answered 55 of 60 on a loaded box), rounded up to 100 ms."""
        base = max(4.0 * self.deadline_ms, 2.0 * (rtt_p90_ms or 0.0))
        return int(min(MAX_DEADLINE_MS, math.ceil(base / 100.0) * 100))

    def _trim(self, now: float) -> None:
        while self._outcomes and now - self._outcomes[0][0] > WINDOW_S:
            self._outcomes.popleft()
