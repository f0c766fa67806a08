"""Rollback on evidence: a new model's live window against the old model's baseline window.

Pure logic on an injected clock. The updater samples the running totals the frame loop already
keeps per camera (`CameraCounters.analysed`, `.detections`, `.escalated` and the cloud's
`CloudTrust.checked` / `.seen`: see `edge_agent.fleet.live.totals_of`) once a second into an
`EvidenceLog`; a window sums the differences between its samples, so there is no second tally to
keep in step. A camera whose totals went down was restarted (a reload): its new totals count
whole.

`judge` compares the window since the swap with the window of the same length before it and says
`wait` (not enough time or frames yet), `keep`, or `roll_back` with the thresholds passed, each
test only where its signal exists on both sides (no cloud, no agreement test; a quiet camera, no
detection test).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from edge_agent.config.fleet import EvidenceConfig

__all__ = [
    "CameraTotals",
    "EvidenceLog",
    "Sample",
    "Verdict",
    "WindowStats",
    "judge",
    "window_between",
]

Decision = Literal["wait", "keep", "roll_back"]


@dataclass(frozen=True, slots=True)
class CameraTotals:
    """One camera's running totals since its pipeline started."""

    frames: int = 0
    detections: int = 0
    escalated: int = 0
    checked: int = 0  # sure edge tracks the cloud looked at
    seen: int = 0  # of them, those the cloud returned a box for


@dataclass(frozen=True, slots=True)
class Sample:
    """Every camera's totals at `at_s` (monotonic seconds)."""

    at_s: float
    cameras: Mapping[str, CameraTotals]


def _rate(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


@dataclass(frozen=True, slots=True)
class WindowStats:
    """What all cameras did between two samples."""

    seconds: float = 0.0
    frames: int = 0
    detections: int = 0
    escalated: int = 0
    checked: int = 0
    seen: int = 0

    @property
    def detections_per_frame(self) -> float | None:
        """Detector boxes per analysed frame."""
        return _rate(self.detections, self.frames)

    @property
    def escalation_rate(self) -> float | None:
        """Share of analysed frames escalated to the cloud."""
        return _rate(self.escalated, self.frames)

    @property
    def agreement(self) -> float | None:
        """Share of the sure tracks the cloud checked that it returned a box for."""
        return _rate(self.seen, self.checked)

    @property
    def fps(self) -> float | None:
        """Frames analysed per second (all cameras)."""
        return _rate(self.frames, self.seconds)

    def __add__(self, other: WindowStats) -> WindowStats:
        return WindowStats(
            self.seconds + other.seconds,
            self.frames + other.frames,
            self.detections + other.detections,
            self.escalated + other.escalated,
            self.checked + other.checked,
            self.seen + other.seen,
        )

    def document(self) -> dict[str, float | int | None]:
        """As events carry it."""

        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 4)

        return {
            "seconds": round(self.seconds, 2),
            "frames": self.frames,
            "detections_per_frame": rounded(self.detections_per_frame),
            "escalation_rate": rounded(self.escalation_rate),
            "agreement": rounded(self.agreement),
            "agreement_checks": self.checked,
            "fps": rounded(self.fps),
        }


def _increase(before: int, after: int) -> int:
    return after - before if after >= before else after  # went down: restarted from zero


def window_between(earlier: Sample, later: Sample) -> WindowStats:
    """What happened between `earlier` and `later`, summed over the cameras of `later`."""
    sums = [0, 0, 0, 0, 0]
    for name, now in later.cameras.items():
        then = earlier.cameras.get(name, CameraTotals())
        for index, (a, b) in enumerate(
            (
                (then.frames, now.frames),
                (then.detections, now.detections),
                (then.escalated, now.escalated),
                (then.checked, now.checked),
                (then.seen, now.seen),
            )
        ):
            sums[index] += _increase(a, b)
    frames, detections, escalated, checked, seen = sums
    return WindowStats(
        max(0.0, later.at_s - earlier.at_s), frames, detections, escalated, checked, seen
    )


class EvidenceLog:
    """Samples of the last `keep_s` seconds, oldest first."""

    def __init__(self, keep_s: float) -> None:
        if keep_s <= 0:
            raise ValueError(f"keep_s must be > 0, got {keep_s}")
        self.keep_s = keep_s
        self._samples: deque[Sample] = deque()

    def observe(self, sample: Sample) -> None:
        """Add `sample` (times must not go backwards); forget what is older than `keep_s`."""
        if self._samples and sample.at_s < self._samples[-1].at_s:
            raise ValueError(
                f"sample at {sample.at_s} is older than the last one ({self._samples[-1].at_s})"
            )
        self._samples.append(sample)
        while len(self._samples) > 2 and sample.at_s - self._samples[1].at_s >= self.keep_s:
            self._samples.popleft()

    def latest(self) -> Sample | None:
        """The newest sample."""
        return self._samples[-1] if self._samples else None

    def at_or_before(self, at_s: float) -> Sample | None:
        """The newest sample taken at or before `at_s`; else the oldest kept."""
        found = None
        for sample in self._samples:
            if sample.at_s > at_s:
                break
            found = sample
        if found is None and self._samples:
            return self._samples[0]
        return found

    def window(self, start_s: float, end_s: float) -> WindowStats | None:
        """The stats from the sample at (or before) `start_s` to the one at (or before) `end_s`,
        summed sample to sample (so a camera restarted between two samples counts right);
        None with fewer than two samples in it."""
        first, last = self.at_or_before(start_s), self.at_or_before(end_s)
        if first is None or last is None or last.at_s <= first.at_s:
            return None
        total = WindowStats()
        previous = first
        for sample in self._samples:
            if sample.at_s <= first.at_s:
                continue
            if sample.at_s > last.at_s:
                break
            total = total + window_between(previous, sample)
            previous = sample
        return total


@dataclass(frozen=True)
class Verdict:
    """`judge`'s answer: the decision, why, and both windows."""

    decision: Decision
    reasons: tuple[str, ...] = ()
    baseline: WindowStats | None = None
    live: WindowStats | None = None
    evidence: dict[str, object] = field(default_factory=dict)

    def reason(self) -> str:
        """The reasons in one line."""
        return "; ".join(self.reasons)


def judge(
    baseline: WindowStats | None, live: WindowStats, settings: EvidenceConfig, *, waited_s: float
) -> Verdict:
    """Keep, roll back, or wait, on `live` (since the swap, `waited_s` ago) against `baseline`.

    The verdict waits until the live window spans `settings.window_s` with at least
    `settings.min_frames` frames; a box with too few frames for four windows keeps the model (no
    evidence against it), as does one with no usable baseline.
    """
    evidence: dict[str, object] = {
        "baseline": baseline.document() if baseline is not None else None,
        "live": live.document(),
    }
    if live.seconds < settings.window_s or live.frames < settings.min_frames:
        if waited_s >= 4 * settings.window_s:
            return Verdict(
                "keep",
                (f"only {live.frames} frames in {waited_s:.0f} s",),
                baseline,
                live,
                evidence,
            )
        return Verdict("wait", (), baseline, live, evidence)
    if baseline is None or baseline.frames < settings.min_frames:
        frames = baseline.frames if baseline is not None else 0
        reason = f"no baseline to compare with ({frames} frames of the old model)"
        return Verdict("keep", (reason,), baseline, live, evidence)
    reasons = _worse(baseline, live, settings)
    return Verdict("roll_back" if reasons else "keep", tuple(reasons), baseline, live, evidence)


def _worse(base: WindowStats, live: WindowStats, s: EvidenceConfig) -> list[str]:
    reasons: list[str] = []
    before, after = base.detections_per_frame, live.detections_per_frame
    if before is not None and after is not None and before >= s.min_baseline_detections:
        drop = 1.0 - after / before
        if drop > s.max_detection_drop:
            reasons.append(
                f"detections per frame fell {drop:.0%} ({before:.2f} -> {after:.2f}; "
                f"limit {s.max_detection_drop:.0%})"
            )
    if base.checked >= s.min_agreement_checks and live.checked >= s.min_agreement_checks:
        a, b = base.agreement, live.agreement
        if a is not None and b is not None and a - b > s.max_agreement_drop:
            reasons.append(
                f"cloud agreement with sure tracks fell {a - b:.2f} ({a:.2f} -> {b:.2f}; "
                f"limit {s.max_agreement_drop:.2f})"
            )
    e0, e1 = base.escalation_rate, live.escalation_rate
    if e0 is not None and e1 is not None and e1 - e0 > s.max_escalation_rise:
        reasons.append(
            f"escalation rate rose {e1 - e0:.2f} ({e0:.2f} -> {e1:.2f}; "
            f"limit {s.max_escalation_rise:.2f})"
        )
    f0, f1 = base.fps, live.fps
    if f0 is not None and f1 is not None and f0 > 0 and 1.0 - f1 / f0 > s.max_fps_drop:
        reasons.append(
            f"frame rate fell {1.0 - f1 / f0:.0%} ({f0:.1f} -> {f1:.1f} frames/s; "
            f"limit {s.max_fps_drop:.0%})"
        )
    return reasons
