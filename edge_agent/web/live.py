"""`LiveView`: the newest frame of every camera and the recent events, for the status page.

The frame loop only hands over references (`observe`, an agent hook; `deliver`, an alert sink):
one dictionary store under a lock, no copy, drawing or encoding, so a page left open costs the
loop nothing. Drawing (zones, lines, tracks) and JPEG encoding happen in the HTTP thread that
asks for a frame, once per frame: the result is cached until the camera has a newer one.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from detection.detections import Detections
from edge_agent.alerts.sinks import EventContext
from edge_agent.capture.frames import CapturedFrame
from edge_agent.config.camera import CameraConfig
from edge_agent.config.web import WebConfig
from edge_agent.escalation.encode import encode_jpeg
from edge_agent.media.draw import annotate
from edge_agent.pipeline.core import FrameOutcome

__all__ = ["FrameInfo", "JpegFrame", "LiveView"]


@dataclass(frozen=True, slots=True)
class FrameInfo:
    """Which frame a camera last analysed (for the page: has it moved on, how old is it)."""

    index: int
    capture_time_s: float
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class JpegFrame:
    """An annotated frame, JPEG-encoded."""

    info: FrameInfo
    data: bytes


@dataclass(frozen=True, slots=True)
class _Observed:
    frame: CapturedFrame
    detections: Detections


def _info(frame: CapturedFrame) -> FrameInfo:
    height, width = frame.image.shape[:2]
    return FrameInfo(frame.index, frame.capture_time_s, int(width), int(height))


class LiveView:
    """Latest frame + tracked boxes per camera and the last `recent_events` event payloads.

    Thread-safe: `observe` and `deliver` run in the frame loop, the readers in HTTP threads.
    `max_width_px` scales wider frames down after drawing (None: never).
    """

    def __init__(
        self, recent_events: int = 50, jpeg_quality: int = 80, max_width_px: int | None = 1280
    ) -> None:
        """Keep `recent_events` payloads; encode frames at `jpeg_quality` (1-100)."""
        if recent_events < 1:
            raise ValueError(f"recent_events must be >= 1, got {recent_events}")
        if not 1 <= jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be in 1..100, got {jpeg_quality}")
        if max_width_px is not None and max_width_px < 1:
            raise ValueError(f"max_width_px must be >= 1 or None, got {max_width_px}")
        self._jpeg_quality = jpeg_quality
        self._max_width_px = max_width_px
        self._lock = threading.Lock()
        self._configs: dict[str, CameraConfig] = {}
        self._class_names: tuple[str, ...] = ()
        self._latest: dict[str, _Observed] = {}
        self._events: deque[Mapping[str, object]] = deque(maxlen=recent_events)
        # one encoder at a time per camera, so concurrent viewers share one encoding per frame
        self._encode_locks: dict[str, threading.Lock] = {}
        self._encoded: dict[str, tuple[_Observed, JpegFrame]] = {}

    @classmethod
    def from_config(cls, config: WebConfig) -> LiveView:
        """A view with the `web:` section's event count, JPEG quality and frame width."""
        return cls(config.recent_events, config.jpeg_quality, config.frame_max_width_px)

    # ---- writers (the frame loop) ------------------------------------------------------------

    def set_cameras(self, configs: Sequence[CameraConfig], class_names: Sequence[str]) -> None:
        """The cameras to show (their zones and lines are drawn) and the detector's class names."""
        with self._lock:
            self._configs = {config.name: config for config in configs}
            self._class_names = tuple(class_names)

    def observe(self, outcome: FrameOutcome) -> None:
        """Agent hook: remember `outcome`'s frame and tracked boxes as its camera's latest."""
        observed = _Observed(outcome.frame, outcome.detections)
        with self._lock:
            self._latest[outcome.camera] = observed

    def deliver(self, context: EventContext, payload: Mapping[str, object]) -> None:
        """Alert sink: keep the event's payload among the recent ones."""
        with self._lock:
            self._events.append(payload)

    # ---- readers (HTTP threads) --------------------------------------------------------------

    def cameras(self) -> list[str]:
        """Every camera known: configured ones in config order, then any only observed."""
        with self._lock:
            return [*self._configs, *(name for name in self._latest if name not in self._configs)]

    def knows(self, camera: str) -> bool:
        """Whether `camera` is configured or has been observed."""
        with self._lock:
            return camera in self._configs or camera in self._latest

    def frame_info(self, camera: str) -> FrameInfo | None:
        """The camera's latest frame, or None before its first one."""
        with self._lock:
            observed = self._latest.get(camera)
        return None if observed is None else _info(observed.frame)

    def recent_events(self) -> list[Mapping[str, object]]:
        """The recent event payloads, newest first."""
        with self._lock:
            return list(reversed(self._events))

    def frame_jpeg(self, camera: str) -> JpegFrame | None:
        """The camera's latest frame annotated and encoded (cached per frame); None before its
        first frame. A camera without a config (not in `set_cameras`) is shown as captured."""
        with self._lock:
            observed = self._latest.get(camera)
            config = self._configs.get(camera)
            names = self._class_names
            encode_lock = self._encode_locks.setdefault(camera, threading.Lock())
        if observed is None:
            return None
        with encode_lock:
            cached = self._encoded.get(camera)
            if cached is not None and cached[0] is observed:
                return cached[1]
            jpeg = JpegFrame(_info(observed.frame), self._render(observed, config, names))
            self._encoded[camera] = (observed, jpeg)
            return jpeg

    def _render(
        self, observed: _Observed, config: CameraConfig | None, names: Sequence[str]
    ) -> bytes:
        image = observed.frame.image
        if config is not None:
            image = annotate(image, config, observed.detections, names)
        width = image.shape[1]
        if self._max_width_px is not None and width > self._max_width_px:
            height = round(image.shape[0] * self._max_width_px / width)
            size = (self._max_width_px, height)
            image = np.asarray(cv2.resize(image, size, interpolation=cv2.INTER_AREA), np.uint8)
        return encode_jpeg(image, self._jpeg_quality)
