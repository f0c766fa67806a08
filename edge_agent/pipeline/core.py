"""`CameraPipeline`: one camera's frame loop as pure logic, the one core every driver runs.

Per analysed frame, in order: frame choice (`admit`: rate limiter, motion gate) → tracker →
rules (with the retractions of cloud-rejected tracks queued since the last frame) → escalation
decision (`Escalator`, which spends the budget) → the frame is remembered for fusing its answer.
Cloud answers come back through `fuse` (fusion into the tracks as they were at that frame).

Nothing here waits, starts a thread or touches a socket, and time comes in from outside: the
capture times of the frames, and injected `clock` / `timer` callables. The agent drives it with
live cameras (`CameraWorker` adds the capture source), the hybrid trade-off simulation with
cached detections on simulated time (`bench.hybrid._hybrid_sim`), and the benches through the agent;
so a change to tracking, rules, escalation or fusion is made once and measured where it runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from detection.slicing import Tile
from edge_agent.capture import CapturedFrame
from edge_agent.config.camera import CameraConfig
from edge_agent.config.escalation import FocusConfig, FusionConfig
from edge_agent.escalation.policy import EscalationDecision, FrameSignals, SignalSettings
from edge_agent.escalation.verification import VerificationMemory
from edge_agent.pipeline.focus import FocusPlan, merge_focus, plan_focus
from edge_agent.pipeline.motion import MotionGate
from edge_agent.pipeline.rate import FrameRateLimiter
from edge_agent.rules import RuleEngine, RuleEvent
from edge_agent.tracking import CameraTracker
from edge_agent.tracking.camera_tracker import observed
from edge_agent.tracking.flow import GrayImage, box_shifts, to_gray
from edge_agent.tracking.fusion import (
    CloudHint,
    CloudTrust,
    FusionResult,
    FusionSettings,
    FusionTally,
    fuse_answer,
)
from edge_agent.tracking.tracker import FollowFunction

Box = tuple[float, float, float, float]
ESCALATED_KEPT = 256  # frames awaiting an answer, per camera (more than any in-flight window)
HINTS_KEPT = 64  # cloud hints looked at, per camera (the newest; max_crops bounds the crops)

logger = logging.getLogger(__name__)


def _untracked(tracked: Detections, low: float) -> tuple[Box, ...]:
    """The boxes of a tracked frame scoring `low` or more that no confirmed track owns."""
    return _boxes(tracked.xyxy[(tracked.tracker_id < 0) & (tracked.confidence >= low)])


def _boxes(rows: npt.NDArray[np.floating[Any]]) -> tuple[Box, ...]:
    return tuple((float(b[0]), float(b[1]), float(b[2]), float(b[3])) for b in rows)


class Escalator(Protocol):
    """Decides whether an analysed frame goes to the cloud, spending the budget when it does.

    `EscalationStage` (the agent's: thread-safe, None while the cloud is unreachable) and
    `EscalationPolicy` (on an injected clock) implement it.
    """

    @property
    def signal_settings(self) -> SignalSettings:
        """What the frame signals it decides on are computed with."""
        ...

    def decide(self, signals: FrameSignals, camera: str) -> EscalationDecision | None:
        """The decision on one frame; None when nothing can be decided (cloud unreachable)."""
        ...


@dataclass(frozen=True, slots=True)
class FrameOutcome:
    """What one analysed frame produced, for alerts, metrics, escalation and the demo."""

    camera: str
    frame: CapturedFrame
    detections: Detections  # tracked: `tracker_id` set for confirmed tracks, -1 elsewhere
    events: list[RuleEvent]
    detect_s: float
    track_s: float
    rules_s: float
    motion_score: float | None = None
    decision: EscalationDecision | None = None  # the escalation decision, when there was one
    escalate_s: float = 0.0  # time spent on that decision

    @property
    def escalated(self) -> bool:
        """Whether the frame is to be sent to the cloud."""
        return self.decision is not None and self.decision.send


@dataclass
class CameraCounters:
    """Frames a camera's pipeline saw and what became of them."""

    analysed: int = 0
    skipped_rate: int = 0
    skipped_motion: int = 0
    failed: int = 0
    events: int = 0
    escalated: int = 0  # frames decided to be sent to the cloud
    detections: int = 0  # detector boxes scoring at least the tracker's start threshold
    focus_crops: int = 0  # crops the edge detector looked at closer (`FocusConfig`)
    fusion: FusionTally = field(default_factory=FusionTally)  # what cloud answers did
    fuse_s: float = 0.0  # time spent fusing answers


class CameraPipeline:
    """One camera's frame loop (see the module docstring).

    `fusion` defaults to the settings of a default `FusionConfig` at the camera's `target_fps`;
    `escalator` None means no escalation (the frame loop runs alone); `focus` None means no
    focus crops (see `pipeline.focus`). `clock` gives wall time
    (POSIX seconds) for ending events when no frame was ever analysed; `timer` measures stage
    times.
    """

    def __init__(
        self,
        config: CameraConfig,
        tracker: CameraTracker,
        class_names: Sequence[str],
        *,
        fusion: FusionSettings | None = None,
        escalator: Escalator | None = None,
        focus: FocusConfig | None = None,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.name = config.name
        self.tracker = tracker
        self.class_names = list(class_names)
        if fusion is None:
            fusion = FusionSettings.from_config(FusionConfig(), config.target_fps)
        self.fusion = fusion
        self.escalator = escalator
        self.focus = focus if focus is not None and focus.enabled else None
        self.limiter = FrameRateLimiter(config.target_fps)
        self.motion = MotionGate(config.motion) if config.motion.enabled else None
        self.rules: RuleEngine | None = None
        self.counters = CameraCounters()
        self.cloud_trust = CloudTrust()
        self.last_frame_time_s: float | None = None  # capture (wall) time of the last analysed
        self.last_motion_score: float | None = None
        self._clock = clock
        self._timer = timer
        self._frame_size: tuple[int, int] | None = None
        # capture frame index -> (tracker frame index, regions the cloud will look at)
        self._escalated: dict[int, tuple[int, tuple[Box, ...]]] = {}
        self._withdrawn: list[RuleEvent] = []  # retractions of cloud-rejected tracks, to send
        self._focus_plan: FocusPlan | None = None  # of the frame whose crops are being detected
        # cloud boxes no track explained, looked at closer until a tracker frame index
        self._hints: list[tuple[int, CloudHint]] = []
        self._previous_gray: GrayImage | None = None  # the last analysed frame, for optical flow
        # tracks the cloud verified, settled for the escalation policy until they change
        self.verification = (
            VerificationMemory(escalator.signal_settings.signals.verification, config.target_fps)
            if escalator is not None
            else None
        )

    # ---- the frame loop ------------------------------------------------------------------------

    def admit(self, frame: CapturedFrame) -> bool:
        """Whether `frame` is due for analysis: the rate limiter's slot, then the motion gate."""
        if not self.limiter.accept(frame.monotonic_s):
            self.counters.skipped_rate += 1
            return False
        if self.motion is not None:
            motion = self.motion.update(frame.image, frame.monotonic_s)
            self.last_motion_score = motion.changed_fraction
            if not motion.detect:
                self.counters.skipped_motion += 1
                return False
        return True

    def focus_tiles(self, frame: CapturedFrame) -> list[Tile]:
        """Crops of `frame` the detector should also look at (small cloud-vouched tracks);
        their detections go to `process` with the frame's."""
        if self.focus is None:
            return []
        height, width = frame.image.shape[:2]
        tracker = self.tracker.tracker
        # the frame about to be tracked is tracker frame `frame_index + 1`
        self._hints = [(until, h) for until, h in self._hints if until > tracker.frame_index]
        self._focus_plan = plan_focus(
            tracker.cloud_tracks,
            (width, height),
            self.focus,
            tracker.confidence_threshold,
            [h for _, h in self._hints],
        )
        return self._focus_plan.tiles

    def process(
        self,
        frame: CapturedFrame,
        detections: Detections,
        detect_s: float = 0.0,
        focus: Sequence[tuple[Tile, Detections]] = (),
    ) -> FrameOutcome:
        """Track this frame's detections (merged with those of its `focus` crops, in crop
        pixels), run the rules on the tracks, decide on escalation."""
        started = self._timer()
        plan, self._focus_plan = self._focus_plan, None
        may_start = None
        if focus and plan is not None and self.focus is not None:
            merged = merge_focus(
                detections,
                focus,
                frame.image.shape[:2],
                plan.followed,
                self.focus.new_object_min_score,
                self.focus.refine_max_px,
            )
            detections, may_start = merged.detections, merged.may_start
            self.counters.focus_crops += len(focus)
        tracked = self.tracker.update(
            frame.image, detections, may_start, self._steps(frame), self._follower(frame)
        )
        tracked_at = self._timer()
        origins = {t.track_id: t.origin for t in self.tracker.tracker.tracks}
        events = self.withdrawn() + self._rules_for(frame).update(
            observed(tracked, detections), frame.capture_time_s, origins
        )
        ruled_at = self._timer()
        decision = self._decide(frame, tracked)
        if decision is not None and decision.send:
            self._remember(frame.index, decision.regions)
            if self.verification is not None:
                tracker = self.tracker.tracker
                self.verification.sent(
                    frame.index,
                    _untracked(tracked, self.escalator_low()),
                    [t.track_id for t in tracker.tracks],
                    tracker.frame_index,
                )
            self.counters.escalated += 1
        decided_at = self._timer()
        self.counters.analysed += 1
        sure = detections.confidence >= self.tracker.tracker.confidence_threshold
        self.counters.detections += int(np.count_nonzero(sure))
        self.counters.events += len(events)
        self.last_frame_time_s = frame.capture_time_s
        return FrameOutcome(
            self.name,
            frame,
            tracked,
            events,
            detect_s,
            tracked_at - started,
            ruled_at - tracked_at,
            self.last_motion_score,
            decision,
            decided_at - ruled_at,
        )

    def fuse(self, frame_index: int, cloud: Detections) -> FusionResult | None:
        """Fold the cloud's answer for capture frame `frame_index` into the tracks; None when
        that frame was not escalated from here (or was forgotten)."""
        sent = self._escalated.pop(frame_index, None)
        if sent is None:
            return None
        started = self._timer()
        tracker_frame, regions = sent
        # boxes of classes this camera's detector drops are no evidence here (fusion, the
        # verification memory and the focus hints alike)
        cloud = self.fusion.edge_classes(cloud)
        result = fuse_answer(
            self.tracker.tracker,
            tracker_frame,
            cloud,
            regions=regions,
            settings=self.fusion,
            trust=self.cloud_trust,
        )
        self.counters.fusion.add(result)
        if self.verification is not None and not result.dropped_late:
            tracker = self.tracker.tracker
            self.verification.answered(
                frame_index, regions, tracker.frame_index, _boxes(cloud.xyxy)
            )
            self.verification.record(tracker.tracks, result.verified, tracker.frame_index)
        if self.focus is not None and self.focus.cloud_hints and result.unexplained:
            until = self.tracker.tracker.frame_index + max(
                1, round(self.focus.hint_ms / 1000.0 * self.config.target_fps)
            )
            floor = self.focus.hint_min_score
            self._hints += [(until, h) for h in result.unexplained if h.score >= floor]
            del self._hints[:-HINTS_KEPT]  # a cloud answering clutter must not grow this
        if result.rejected and self.rules is not None:
            self._withdrawn += self.rules.withdraw(result.rejected)
        self.counters.fuse_s += self._timer() - started
        return result

    def withdrawn(self) -> list[RuleEvent]:
        """Take the retractions queued since the last frame (they normally go out with the
        next frame's events)."""
        events, self._withdrawn = self._withdrawn, []
        return events

    def finish(self) -> list[RuleEvent]:
        """End the camera: its pending retractions, then its lasting events (loiter,
        occupancy) ended as it is no longer watched."""
        events = self.withdrawn()
        if self.rules is not None:
            last = self.last_frame_time_s
            events += self.rules.finish(last if last is not None else self._clock())
        self.counters.events += len(events)
        return events

    @property
    def awaiting(self) -> int:
        """Escalated frames whose answer has not been fused yet."""
        return len(self._escalated)

    # ---- internals -----------------------------------------------------------------------------

    def escalator_low(self) -> float:
        """The lower end of the escalation's uncertain band (boxes below it are no signal)."""
        return self.escalator.signal_settings.uncertain_low if self.escalator else 0.0

    def _decide(self, frame: CapturedFrame, tracked: Detections) -> EscalationDecision | None:
        if self.escalator is None:
            return None
        height, width = frame.image.shape[:2]
        tracker = self.tracker.tracker
        memory = self.verification
        settled = memory.settled(tracker.tracks, tracker.frame_index) if memory else frozenset()
        settled_boxes = memory.settled_boxes(tracker.frame_index) if memory else ()
        asked = memory.asked(tracker.frame_index) if memory else frozenset()
        regions = memory.verified_regions(tracker.frame_index) if memory else ()
        signals = FrameSignals.from_frame(
            tracked,
            tracker.cloud_tracks,
            width,
            height,
            self.escalator.signal_settings,
            self.last_motion_score,
            settled,
            settled_boxes,
            asked,
            regions,
        )
        return self.escalator.decide(signals, self.name)

    def _remember(self, frame_index: int, regions: tuple[Box, ...]) -> None:
        # The tracker's frame index right after this frame's update: fusion looks the tracks
        # up as they were then.
        self._escalated[frame_index] = (self.tracker.tracker.frame_index, regions)
        while len(self._escalated) > ESCALATED_KEPT:
            del self._escalated[next(iter(self._escalated))]

    def _steps(self, frame: CapturedFrame) -> int:
        """Frame intervals at the camera's `target_fps` since the last analysed frame, at least
        1: a slow box that skips frames moves its tracks as far as the objects went."""
        last = self.last_frame_time_s
        if last is None:
            return 1
        return max(1, round((frame.capture_time_s - last) * self.config.target_fps))

    def _follower(self, frame: CapturedFrame) -> FollowFunction | None:
        """Optical flow from the last analysed frame to this one, for the cloud-held tracks
        (`fusion.follow_flow`); None when off or on the first frame (or a new resolution)."""
        if not self.fusion.follow_flow:
            return None
        previous, current = self._previous_gray, to_gray(frame.image)
        self._previous_gray = current
        if previous is None or previous.shape != current.shape:
            return None
        return lambda boxes: box_shifts(previous, current, boxes)

    def _rules_for(self, frame: CapturedFrame) -> RuleEngine:
        height, width = frame.image.shape[:2]
        if self.rules is None or self._frame_size != (width, height):
            if self.rules is not None:
                logger.warning(
                    "camera %s: resolution changed from %s to %dx%d; rules restarted",
                    self.name,
                    "x".join(map(str, self._frame_size or ())),
                    width,
                    height,
                )
            self.rules = RuleEngine(
                self.config, frame_size=(width, height), class_names=self.class_names
            )
            self._frame_size = (width, height)
        return self.rules
