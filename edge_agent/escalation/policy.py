"""Escalation policy: score how hard a processed frame is and decide whether, and how, to send it.

Pure: no I/O, time from an injected clock (or `now` from the caller). The caller owns the
encoding and reports its real size (`record_encoded`) and the cloud's answers (`observe_answer`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from edge_agent.config.escalation import (
    EscalationConfig,
    EscalationSignalsConfig,
    RegionEscalationConfig,
)
from edge_agent.escalation.budget import EscalationBudget
from edge_agent.escalation.roi import (
    Box,
    box_area,
    box_of,
    max_iou_with_another,
    pairwise_iou,
    regions_for,
)

logger = logging.getLogger(__name__)

Mode = Literal["frame", "regions"]

# First guesses of JPEG bytes per source pixel, before any frame of a camera was encoded; then
# replaced by a running average of what `record_encoded` reports.
_INITIAL_BYTES_PER_PIXEL: dict[Mode, float] = {"frame": 0.15, "regions": 0.3}
_BYTES_PER_PIXEL_SMOOTHING = 0.2

# Signals whose boxes can be cropped (region mode); the others need the whole frame.
BOX_SIGNALS = (
    "uncertain",
    "small_object",
    "crowding",
    "new_track",
    "tentative_track",
    "lost_track",
    "held_track",
)
FRAME_SIGNALS = ("motion_without_detections", "refresh")


class TrackLike(Protocol):
    """What the policy reads from a tracker's track (`tracking.cloud_evidence.CloudTrack`)."""

    @property
    def track_id(self) -> int:
        """The track's id (the `tracker_id` of its detections)."""
        ...

    @property
    def age(self) -> int:
        """Frames since the track started (1 on its first frame)."""
        ...

    @property
    def time_since_update(self) -> int:
        """Frames since the last matched detection."""
        ...

    @property
    def is_tentative(self) -> bool:
        """Not yet confirmed."""
        ...

    @property
    def is_held(self) -> bool:
        """Reported on the cloud's word (a confirmation's hold still running)."""
        ...

    def to_xyxy(self) -> npt.NDArray[Any]:
        """The current (predicted or corrected) box."""
        ...


@dataclass(frozen=True)
class SignalSettings:
    """What a frame's signals are computed with (`FrameSignals.from_frame`): the uncertain
    score band and `escalation.signals`."""

    uncertain_low: float
    uncertain_high: float
    signals: EscalationSignalsConfig

    @classmethod
    def from_config(cls, config: EscalationConfig) -> SignalSettings:
        """The signal settings of the `escalation:` section."""
        return cls(
            config.uncertain_confidence_low, config.uncertain_confidence_high, config.signals
        )


@dataclass(frozen=True)
class FrameSignals:
    """What the edge knows about one processed frame that bears on its difficulty.

    Box signals keep their boxes (source pixels) so that region escalation can crop them.
    """

    frame_width: int
    frame_height: int
    detection_count: int = 0
    uncertain: tuple[Box, ...] = ()
    small_objects: tuple[Box, ...] = ()
    crowded: tuple[Box, ...] = ()
    max_iou: float = 0.0
    new_tracks: tuple[Box, ...] = ()
    tentative_tracks: tuple[Box, ...] = ()
    lost_tracks: tuple[Box, ...] = ()
    held_tracks: tuple[Box, ...] = ()
    motion_score: float | None = None

    def __post_init__(self) -> None:
        if self.frame_width < 1 or self.frame_height < 1:
            raise ValueError(
                f"frame size must be positive, got {self.frame_width}x{self.frame_height}"
            )
        if self.motion_score is not None and not math.isfinite(self.motion_score):
            raise ValueError(f"motion_score must be finite, got {self.motion_score}")

    @classmethod
    def from_frame(
        cls,
        detections: Detections,
        tracks: Sequence[TrackLike],
        frame_width: int,
        frame_height: int,
        settings: SignalSettings,
        motion_score: float | None = None,
        settled: Collection[int] = frozenset(),
        settled_boxes: Sequence[Box] = (),
        asked: Collection[int] = frozenset(),
        verified_regions: Sequence[Box] = (),
    ) -> FrameSignals:
        """Signals of a frame from its detections (after tracking) and the tracker's tracks.

        `settled`: ids of the tracks the cloud verified that have not changed since, or that
        are on a frame sent and not answered yet (`VerificationMemory.settled`); their
        uncertain scores, crowding, small size, being tentative or just lost are not signals:
        the cloud resolved them or is resolving them. An untracked box overlapping one of
        `settled_boxes` (untracked boxes the cloud recently looked at), or with its centre in
        one of `verified_regions` (what recent answers looked at), is settled too. A track
        held on the cloud's word is a signal unless settled or `asked` (on a frame awaiting
        its answer): one the edge saw and lost is settled while its verification holds, one
        only the cloud ever saw while it stays where the cloud last boxed it
        (`VerificationMemory`). A track started on top of a settled one the edge still sees
        waits a frame (`_born_on_settled`).
        """
        low, high = settings.uncertain_low, settings.uncertain_high
        waiting = (
            _born_on_settled(tracks, settled, settings.signals.crowding_iou)
            if settings.signals.verification.second_box_waits
            else frozenset()
        )
        if waiting:  # no signal of theirs on this frame (see `_born_on_settled`)
            settled, asked = frozenset(settled) | waiting, frozenset(asked) | waiting
        # Boxes below the uncertain band (the tracker's low-score second pass keeps them) are
        # noise to the policy: counted, they made nearly every frame "hard"
        # (bench.hybrid.hybrid_tradeoff).
        keep = detections.confidence >= low
        xyxy = detections.xyxy[keep].astype(np.float64)
        confidence = detections.confidence[keep]
        unsettled = _unsettled(
            detections.tracker_id[keep],
            xyxy,
            settled,
            settled_boxes,
            settings.signals.verification.box_iou,
            verified_regions,
        )
        uncertain = (confidence < high) & unsettled
        areas = (xyxy[:, 2] - xyxy[:, 0]) * (xyxy[:, 3] - xyxy[:, 1])
        frame_area = float(frame_width * frame_height)
        small = areas < settings.signals.small_object_area_fraction * frame_area
        if settings.signals.verification.settle_small:
            small &= unsettled
        else:  # small objects stay hard, but not while a frame showing them awaits its answer
            small &= _unsettled(
                detections.tracker_id[keep],
                xyxy,
                asked,
                settled_boxes,
                settings.signals.verification.box_iou,
                verified_regions,
            )
        best_iou = max_iou_with_another(xyxy)
        crowded = (best_iou >= settings.signals.crowding_iou) & unsettled
        new = [t for t in tracks if t.age <= 1 and t.track_id not in waiting]
        tentative = [
            t for t in tracks if t.is_tentative and t.age > 1 and t.track_id not in settled
        ]
        lost = [
            t
            for t in tracks
            if t.time_since_update == 1 and not t.is_tentative and t.track_id not in settled
        ]
        # Held on the cloud's word: the edge misses them, so only the cloud can keep them (the
        # DDS feedback region: crops go where the last answer found what the edge missed).
        held = [
            t
            for t in tracks
            if t.time_since_update > 1
            and t.is_held
            and t.track_id not in asked
            and t.track_id not in settled
            and _centre_inside(box_of(t.to_xyxy()), frame_width, frame_height)
        ]
        return cls(
            frame_width=frame_width,
            frame_height=frame_height,
            detection_count=len(confidence),
            uncertain=_boxes(xyxy[uncertain]),
            small_objects=_boxes(xyxy[small]),
            crowded=_boxes(xyxy[crowded]),
            max_iou=float(best_iou.max()) if len(best_iou) else 0.0,
            new_tracks=tuple(box_of(t.to_xyxy()) for t in new),
            tentative_tracks=tuple(box_of(t.to_xyxy()) for t in tentative),
            lost_tracks=tuple(box_of(t.to_xyxy()) for t in lost),
            held_tracks=tuple(box_of(t.to_xyxy()) for t in held),
            motion_score=motion_score,
        )


def _born_on_settled(
    tracks: Sequence[TrackLike], settled: Collection[int], min_iou: float
) -> frozenset[int]:
    """Ids of the tracks started on this frame on top of a settled track the edge still sees
    (IoU >= `min_iou`, the crowding threshold): they wait a frame before they are a signal.

    On the busy real demo clip, 41 of the 92 new tracks on sent frames started on a verified
    track matched on the same frame, and 31 of those 41 were gone on the next frame: a second
    box on one person, sent for with a crowding signal. A real second object is still there a
    frame later, and its crowding and uncertain score are signals then (it is new to the
    memory, so not settled).
    """
    born = [t for t in tracks if t.age <= 1 and t.track_id not in settled]
    if not born or not settled:
        return frozenset()
    seen = [t for t in tracks if t.track_id in settled and t.time_since_update == 0 and t.age > 1]
    if not seen:
        return frozenset()
    best = pairwise_iou(
        np.asarray([box_of(t.to_xyxy()) for t in born], dtype=np.float64),
        np.asarray([box_of(t.to_xyxy()) for t in seen], dtype=np.float64),
    ).max(axis=1)
    return frozenset(t.track_id for t, v in zip(born, best, strict=True) if v >= min_iou)


def _unsettled(
    tracker_id: npt.NDArray[np.int64],
    xyxy: npt.NDArray[np.float64],
    settled: Collection[int],
    settled_boxes: Sequence[Box],
    box_iou: float,
    verified_regions: Sequence[Box] = (),
) -> npt.NDArray[np.bool_]:
    """Per box: not settled by the verification memory (see `FrameSignals.from_frame`)."""
    done = np.isin(tracker_id, np.fromiter(settled, dtype=np.int64, count=len(settled)))
    untracked = tracker_id < 0
    if settled_boxes and untracked.any():
        others = np.asarray(settled_boxes, dtype=np.float64).reshape(-1, 4)
        done[untracked] = pairwise_iou(xyxy[untracked], others).max(axis=1) >= box_iou
    if verified_regions and untracked.any():
        cx, cy = (xyxy[:, 0] + xyxy[:, 2]) / 2.0, (xyxy[:, 1] + xyxy[:, 3]) / 2.0
        for x1, y1, x2, y2 in verified_regions:
            done |= untracked & (cx >= x1) & (cx <= x2) & (cy >= y1) & (cy <= y2)
    return ~done


def _boxes(xyxy: npt.NDArray[np.float64]) -> tuple[Box, ...]:
    return tuple((float(b[0]), float(b[1]), float(b[2]), float(b[3])) for b in xyxy)


def _centre_inside(box: Box, width: int, height: int) -> bool:
    cx, cy = (box[0] + box[2]) / 2.0, (box[1] + box[3]) / 2.0
    return 0.0 <= cx <= width and 0.0 <= cy <= height


@dataclass(frozen=True)
class EscalationDecision:
    """Whether to send a frame, why, and how (whole frame or crops of `regions`).

    `send` is False for easy frames (`reasons` empty) and for hard ones the budget refused
    (`refused_by_budget`). `estimated_bytes` is what the budget was charged.
    """

    send: bool
    score: float
    reasons: tuple[str, ...] = ()
    mode: Mode = "frame"
    regions: tuple[Box, ...] = ()
    estimated_bytes: int = 0
    refused_by_budget: bool = False

    def __post_init__(self) -> None:
        # `regions` is what gets cropped and sent: only region mode has any.
        if (self.mode == "regions") != bool(self.regions):
            raise ValueError(
                f"mode {self.mode!r} with {len(self.regions)} region(s): region mode needs "
                "regions, frame mode has none"
            )


@dataclass
class _CameraState:
    last_sent: float  # when a whole frame was last sent (crops do not refresh the view)
    bytes_per_pixel: dict[Mode, float] = field(
        default_factory=lambda: dict(_INITIAL_BYTES_PER_PIXEL)
    )


class EscalationPolicy:
    """Scores frames, picks frame or region mode, and spends the budget for the ones it sends,
    on `clock` (monotonic seconds; injected in simulations and tests).

    One policy per agent (the budget is per agent and per camera). A camera's refresh clock
    starts the first time one of its frames is decided on. `signal_settings` are what the
    pipeline computes the frame signals it decides on with (the `Escalator` protocol).
    """

    def __init__(
        self,
        signal_settings: SignalSettings,
        regions: RegionEscalationConfig,
        refresh_interval_s: float,
        budget: EscalationBudget,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.signal_settings = signal_settings
        self._signals = signal_settings.signals
        self._regions = regions
        self._refresh_interval_s = refresh_interval_s
        self.budget = budget
        self._clock = clock
        self._cameras: dict[str, _CameraState] = {}

    @classmethod
    def from_config(
        cls, config: EscalationConfig, clock: Callable[[], float] = time.monotonic
    ) -> EscalationPolicy:
        """The policy of the `escalation:` settings with its budget, on `clock`."""
        return cls(
            SignalSettings.from_config(config),
            config.regions,
            config.refresh_interval_s,
            EscalationBudget.from_config(config, clock()),
            clock,
        )

    def observe_answer(
        self,
        *,
        rtt_s: float | None = None,
        queue_time_ms: float | None = None,
        overloaded: bool = False,
        answered: bool = False,
    ) -> None:
        """One answer (or failure) came back now: feeds the budget's back-off and window
        (`answered`: with detections)."""
        self.budget.observe(
            self._clock(),
            rtt_s=rtt_s,
            queue_time_ms=queue_time_ms,
            overloaded=overloaded,
            answered=answered,
        )

    def score(self, signals: FrameSignals) -> tuple[float, tuple[str, ...]]:
        """The weighted score of a frame's signals and the names of the signals that scored."""
        weights = self._signals.weights
        cap = self._signals.max_count_per_signal
        counts = {
            "uncertain": len(signals.uncertain),
            "small_object": len(signals.small_objects),
            "crowding": len(signals.crowded),
            "new_track": len(signals.new_tracks),
            "tentative_track": len(signals.tentative_tracks),
            "lost_track": len(signals.lost_tracks),
            "held_track": len(signals.held_tracks),
            "motion_without_detections": int(self._motion_without_detections(signals)),
        }
        total, reasons = 0.0, []
        for name, count in counts.items():
            part = float(getattr(weights, name)) * min(count, cap)
            if part > 0.0:
                total += part
                reasons.append(name)
        return total, tuple(reasons)

    def _motion_without_detections(self, signals: FrameSignals) -> bool:
        motion = signals.motion_score
        threshold = self._signals.motion_threshold
        return signals.detection_count == 0 and motion is not None and motion >= threshold

    def decide(
        self,
        signals: FrameSignals,
        camera: str,
        now: float | None = None,
        estimated_bytes: int | None = None,
        in_flight: int = 0,
    ) -> EscalationDecision:
        """Decide on one frame of `camera` at `now` (default: the clock's now); a send is
        charged to the budget.

        `estimated_bytes` overrides the policy's own estimate of the encoded size; `in_flight`
        is how many of the agent's frames are unanswered (the budget's window).
        """
        now = self._clock() if now is None else now
        state = self._cameras.setdefault(camera, _CameraState(last_sent=now))
        score, reasons = self.score(signals)
        hard = score >= self._signals.score_threshold
        interval = self._refresh_interval_s
        if interval > 0.0 and now - state.last_sent >= interval:
            reasons = (*reasons, "refresh")
            hard = True
        if not hard:
            return EscalationDecision(send=False, score=score, reasons=())
        if self.budget.refuses_frame(camera, now, in_flight):  # skip the crop planning
            logger.debug("camera %s: hard frame (%s) refused by the budget", camera, reasons)
            return EscalationDecision(
                send=False, score=score, reasons=reasons, refused_by_budget=True
            )
        mode, regions = self._mode(signals, reasons, crops=self._regions.enabled)
        if estimated_bytes is None:
            estimated_bytes = self._estimate_bytes(state, signals, mode, regions)
            if mode == "frame" and self._bytes_short(camera, estimated_bytes, now):
                mode, regions = self._mode(signals, reasons, crops=True)
                estimated_bytes = self._estimate_bytes(state, signals, mode, regions)
        granted = self.budget.try_acquire(camera, estimated_bytes, now)
        if granted and mode == "frame":
            state.last_sent = now
        else:
            logger.debug("camera %s: hard frame (%s) refused by the budget", camera, reasons)
        return EscalationDecision(
            send=granted,
            score=score,
            reasons=reasons,
            mode=mode,
            regions=regions,
            estimated_bytes=estimated_bytes,
            refused_by_budget=not granted,
        )

    def _bytes_short(self, camera: str, frame_bytes: int, now: float) -> bool:
        """Whole frames are preferred (crops off) but the byte budget cannot pay for this one:
        crops may (`regions.crops_when_bytes_short`)."""
        config = self._regions
        return (
            not config.enabled
            and config.crops_when_bytes_short
            and not self.budget.affords(camera, frame_bytes, now)
        )

    def _mode(
        self, signals: FrameSignals, reasons: tuple[str, ...], *, crops: bool
    ) -> tuple[Mode, tuple[Box, ...]]:
        """Region mode (where `crops`) when only box signals fired and their padded crops are
        few and small."""
        config = self._regions
        if not crops or any(r in FRAME_SIGNALS for r in reasons):
            return "frame", ()
        boxes = [box for name in reasons for box in self._signal_boxes(signals, name)]
        if not boxes:
            return "frame", ()
        width, height = signals.frame_width, signals.frame_height
        regions = regions_for(boxes, config.padding_fraction, config.min_size_px, width, height)
        if not regions:  # every box outside the frame (a held track that left it)
            return "frame", ()
        share = sum(box_area(r) for r in regions) / float(width * height)
        if len(regions) > config.max_regions or share > config.max_area_fraction:
            return "frame", ()
        return "regions", tuple(regions)

    @staticmethod
    def _signal_boxes(signals: FrameSignals, name: str) -> tuple[Box, ...]:
        return {
            "uncertain": signals.uncertain,
            "small_object": signals.small_objects,
            "crowding": signals.crowded,
            "new_track": signals.new_tracks,
            "tentative_track": signals.tentative_tracks,
            "lost_track": signals.lost_tracks,
            "held_track": signals.held_tracks,
        }.get(name, ())

    @staticmethod
    def _estimate_bytes(
        state: _CameraState, signals: FrameSignals, mode: Mode, regions: tuple[Box, ...]
    ) -> int:
        if mode == "frame":
            pixels = float(signals.frame_width * signals.frame_height)
        else:
            pixels = sum(box_area(r) for r in regions)
        return max(1, round(pixels * state.bytes_per_pixel[mode]))

    def record_encoded(
        self, camera: str, decision: EscalationDecision, n_bytes: int, pixels: int
    ) -> None:
        """Report the real JPEG size of a sent decision (`pixels`: source pixels encoded), to
        correct the budget's charge and learn this camera's bytes per pixel."""
        if not decision.send:
            return
        self.budget.adjust_bytes(camera, n_bytes - decision.estimated_bytes)
        state = self._cameras.get(camera)
        if state is None or pixels <= 0:
            return
        observed = n_bytes / pixels
        previous = state.bytes_per_pixel[decision.mode]
        alpha = _BYTES_PER_PIXEL_SMOOTHING
        state.bytes_per_pixel[decision.mode] = (1.0 - alpha) * previous + alpha * observed

    def forget(self, camera: str) -> None:
        """Drop a camera's refresh clock and size estimate (camera removed or restarted)."""
        self._cameras.pop(camera, None)
