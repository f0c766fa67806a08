"""`CameraWorker`: one camera's share of the frame loop — frame choice, tracking and rules.

The worker owns the camera's capture source, frame-rate limiter, motion gate, tracker and rule
engine. The agent asks each worker for a frame to analyse (`next_frame`), runs the shared
detector on the frames of all cameras at once, and hands each result back (`process`). Nothing
here waits: a camera with no new frame simply has nothing to offer this round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from detection.detections import Detections
from edge_agent.capture import CameraSource, CapturedFrame, CaptureState
from edge_agent.config.camera import CameraConfig
from edge_agent.pipeline.motion import MotionGate
from edge_agent.pipeline.rate import FrameRateLimiter
from edge_agent.rules import RuleEngine, RuleEvent
from edge_agent.tracking import CameraTracker
from edge_agent.tracking.camera_tracker import observed
from edge_agent.tracking.fusion import (
    CloudTrust,
    FusionResult,
    FusionSettings,
    FusionTally,
    fuse_answer,
)

Box = tuple[float, float, float, float]
_ESCALATED_KEPT = 256  # frames awaiting an answer, per camera (more than any in-flight window)

logger = logging.getLogger(__name__)


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
    escalated: bool = False  # sent to the cloud (set after the escalation decision)


@dataclass
class CameraCounters:
    """Frames a worker saw and what became of them."""

    analysed: int = 0
    skipped_rate: int = 0
    skipped_motion: int = 0
    failed: int = 0
    events: int = 0
    fusion: FusionTally = field(default_factory=FusionTally)  # what cloud answers did


class CameraWorker:
    """The per-camera part of the frame loop (see the module docstring)."""

    def __init__(
        self,
        config: CameraConfig,
        source: CameraSource,
        tracker: CameraTracker,
        class_names: Sequence[str],
    ) -> None:
        self.config = config
        self.name = config.name
        self.source = source
        self.tracker = tracker
        self.class_names = list(class_names)
        self.limiter = FrameRateLimiter(config.target_fps)
        self.motion = MotionGate(config.motion) if config.motion.enabled else None
        self.rules: RuleEngine | None = None
        self._frame_size: tuple[int, int] | None = None
        self.counters = CameraCounters()
        self.last_frame_time_s: float | None = None  # capture (wall) time of the last analysed
        self.last_motion_score: float | None = None
        # capture frame index -> (tracker frame index, regions the cloud will look at)
        self._escalated: dict[int, tuple[int, tuple[Box, ...]]] = {}
        self.cloud_trust = CloudTrust()
        self._withdrawn: list[RuleEvent] = []  # retractions of cloud-rejected tracks, to send

    @property
    def state(self) -> CaptureState:
        """The capture state of the camera."""
        return self.source.state

    def next_frame(self) -> CapturedFrame | None:
        """The camera's newest frame if it is due for analysis; None when there is none."""
        frame = self.source.slot.get(timeout_s=0.0)
        if frame is None:
            return None
        if not self.limiter.accept(frame.monotonic_s):
            self.counters.skipped_rate += 1
            return None
        if self.motion is not None:
            motion = self.motion.update(frame.image, frame.monotonic_s)
            self.last_motion_score = motion.changed_fraction
            if not motion.detect:
                self.counters.skipped_motion += 1
                return None
        return frame

    def process(
        self, frame: CapturedFrame, detections: Detections, detect_s: float
    ) -> FrameOutcome:
        """Track this frame's detections and run the rules on the tracks."""
        started = time.perf_counter()
        tracked = self.tracker.update(frame.image, detections)
        tracked_at = time.perf_counter()
        events = self._withdrawn + self._rules_for(frame).update(
            observed(tracked, detections), frame.capture_time_s
        )
        self._withdrawn = []
        done = time.perf_counter()
        self.counters.analysed += 1
        self.counters.events += len(events)
        self.last_frame_time_s = frame.capture_time_s
        return FrameOutcome(
            self.name,
            frame,
            tracked,
            events,
            detect_s,
            tracked_at - started,
            done - tracked_at,
            self.last_motion_score,
        )

    def escalated(self, frame_index: int, regions: tuple[Box, ...]) -> None:
        """Remember that the frame just processed went to the cloud (for fusing the answer)."""
        self._escalated[frame_index] = (self.tracker.tracker.frame_index, regions)
        while len(self._escalated) > _ESCALATED_KEPT:
            del self._escalated[next(iter(self._escalated))]

    def fuse(
        self, frame_index: int, cloud: Detections, settings: FusionSettings
    ) -> FusionResult | None:
        """Fold the cloud's answer for capture frame `frame_index` into the tracks."""
        sent = self._escalated.pop(frame_index, None)
        if sent is None:
            return None  # not ours, or forgotten: nothing to match it against
        tracker_frame, regions = sent
        result = fuse_answer(
            self.tracker.tracker,
            tracker_frame,
            cloud,
            regions=regions,
            settings=settings,
            trust=self.cloud_trust,
        )
        self.counters.fusion.add(result)
        if result.rejected and self.rules is not None:
            self._withdrawn += self.rules.withdraw(result.rejected)
        return result

    def finish(self) -> list[RuleEvent]:
        """End the camera's lasting events (loiter, occupancy): it is no longer watched."""
        if self.rules is None:
            return []
        timestamp = self.last_frame_time_s if self.last_frame_time_s is not None else time.time()
        events = self.rules.finish(timestamp)
        self.counters.events += len(events)
        return events

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
