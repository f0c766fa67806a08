"""`CameraWorker`: a `CameraPipeline` fed by a live camera.

The worker adds the camera's capture source to the pure per-camera core (`pipeline.core`). The
agent asks each worker for a frame to analyse (`next_frame`: the newest one, if due), runs the
shared detector on the frames of all cameras at once, and hands each result back (`process`).
Nothing here waits: a camera with no new frame simply has nothing to offer this round.
"""

from __future__ import annotations

from collections.abc import Sequence

from edge_agent.capture import CameraSource, CapturedFrame, CaptureState
from edge_agent.config.camera import CameraConfig
from edge_agent.config.escalation import FocusConfig
from edge_agent.pipeline.core import CameraCounters, CameraPipeline, Escalator, FrameOutcome
from edge_agent.tracking import CameraTracker
from edge_agent.tracking.fusion import FusionSettings

__all__ = ["CameraCounters", "CameraWorker", "FrameOutcome"]


class CameraWorker(CameraPipeline):
    """One camera's pipeline with its capture source (see the module docstring)."""

    def __init__(
        self,
        config: CameraConfig,
        source: CameraSource,
        tracker: CameraTracker,
        class_names: Sequence[str],
        *,
        fusion: FusionSettings | None = None,
        escalator: Escalator | None = None,
        focus: FocusConfig | None = None,
    ) -> None:
        super().__init__(
            config, tracker, class_names, fusion=fusion, escalator=escalator, focus=focus
        )
        self.source = source

    @property
    def state(self) -> CaptureState:
        """The capture state of the camera."""
        return self.source.state

    def next_frame(self) -> CapturedFrame | None:
        """The camera's newest frame if it is due for analysis; None when there is none."""
        frame = self.source.slot.get(timeout_s=0.0)
        if frame is None or not self.admit(frame):
            return None
        return frame
