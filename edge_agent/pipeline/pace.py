"""`FocusBudget`: how many focus crops fit in the camera's frame period, so that looking closer
never makes the box fall behind its cameras.

Each focus crop is one more detector input (upscaled to the model's input: about the cost of a
whole frame), or a share of one when crops are packed into mosaics (`focus.mosaic`,
`edge_agent.pipeline.mosaic`). On a box that keeps up, the crops use the time left in the
frame period; on one that is behind, they cost frames: on the real-footage demo (NanoDet INT8,
six crops allowed) the crops took 72 % of the frame loop and the edge analysed 3 of the
camera's 10 frames/s. Frames lost that way lose tracks and alerts, while a missed crop only
delays a small object's refinement, so the crops get only the spare time: the period, less what
the rest of a step took (smoothed), over what one detector run on crops took (smoothed), times
the crops a run holds, at most what the plan asked for.

Pure: the agent feeds it the durations it measured (`observe`) and asks before each step
(`allowed`).
"""

from __future__ import annotations

import math

from edge_agent.pipeline.mosaic import packing


class FocusBudget:
    """Smoothed step and crop costs, and the crops that fit in a period (see the module).

    `smoothing` is the weight of the newest measurement in the running averages.
    """

    def __init__(self, smoothing: float = 0.2) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.smoothing = smoothing
        self.step_s: float | None = None  # a step's time without its crops
        self.run_s: float | None = None  # one detector run on crops (one crop, or one mosaic)
        self.skipped = 0  # crops planned but left out for time

    def observe(self, step_s: float, focus_s: float, runs: int) -> None:
        """One step took `step_s` seconds in all, `focus_s` of them on `runs` detector runs on
        crops."""
        if not (math.isfinite(step_s) and math.isfinite(focus_s)) or step_s < 0 or focus_s < 0:
            return
        self.step_s = self._smooth(self.step_s, max(0.0, step_s - focus_s))
        if runs > 0:
            self.run_s = self._smooth(self.run_s, focus_s / runs)

    def runs(self, period_s: float) -> int | None:
        """Detector runs on crops that fit in `period_s` after the rest of the step; None
        (no limit) until both costs have been measured once."""
        if self.step_s is None or self.run_s is None or self.run_s <= 0.0:
            return None
        spare = period_s - self.step_s
        return max(0, math.floor(spare / self.run_s)) if spare > 0 else 0

    def allowed(self, period_s: float, wanted: int, max_side: int = 1) -> tuple[int, int]:
        """How to look at `wanted` crops in `period_s`: (crops a side of one run, crops looked
        at), each crop alone while the runs that fit suffice and packed up to `max_side` a
        side when they do not (`edge_agent.pipeline.mosaic.packing`)."""
        side, granted = packing(wanted, self.runs(period_s), max_side)
        self.skipped += max(0, wanted) - granted
        return side, granted

    def _smooth(self, average: float | None, value: float) -> float:
        if average is None:
            return value
        return (1.0 - self.smoothing) * average + self.smoothing * value
