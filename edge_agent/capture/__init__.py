"""Frame capture: one supervised reader per camera that keeps only the newest frame.

- `CapturedFrame`, `LatestFrameSlot` (frames.py): a frame stamped with its capture time, and a
  one-frame drop-oldest slot between a camera reader and a (possibly slow) consumer.
- `Backoff` (backoff.py): exponential reconnect back-off with jitter, reset on success.
- `CameraSource`, `CaptureState`, `CaptureStats` (source.py): the reader thread, its stall watchdog
  and reconnect loop, for RTSP streams and for video files replayed at their native rate.
"""

from __future__ import annotations

from edge_agent.capture.backoff import Backoff
from edge_agent.capture.frames import CapturedFrame, LatestFrameSlot
from edge_agent.capture.source import (
    CameraSource,
    CaptureState,
    CaptureStats,
    StateCallback,
    ffmpeg_capture_options,
)

__all__ = [
    "Backoff",
    "CameraSource",
    "CaptureState",
    "CaptureStats",
    "CapturedFrame",
    "LatestFrameSlot",
    "StateCallback",
    "ffmpeg_capture_options",
]
