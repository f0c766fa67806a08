"""Per-camera status: what the retained MQTT status topic and `STATUS=` to systemd say."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from edge_agent.alerts.payload import iso_utc
from edge_agent.capture import CaptureState

_FPS_WINDOW_S = 5.0


@dataclass
class CameraStatus:
    """The state of one camera as last seen, and a short window of analysed-frame times."""

    camera: str
    state: str = CaptureState.CONNECTING.value
    reason: str = "starting"
    since_s: float = field(default_factory=time.time)
    last_error: str | None = None
    _recent: deque[float] = field(default_factory=deque, repr=False)

    def changed(self, state: str, reason: str, now_s: float | None = None) -> None:
        """Record a state change."""
        self.state, self.reason = state, reason
        self.since_s = time.time() if now_s is None else now_s

    def analysed(self, monotonic_s: float) -> None:
        """Record one analysed frame (for the frame rate)."""
        self._recent.append(monotonic_s)
        while self._recent and monotonic_s - self._recent[0] > _FPS_WINDOW_S:
            self._recent.popleft()

    def fps(self, now_monotonic_s: float | None = None) -> float:
        """Analysed frames per second over the last few seconds."""
        now = time.monotonic() if now_monotonic_s is None else now_monotonic_s
        while self._recent and now - self._recent[0] > _FPS_WINDOW_S:
            self._recent.popleft()
        return len(self._recent) / _FPS_WINDOW_S

    def document(
        self, *, agent: str, frames: int, dropped: int, reconnects: int, now_s: float | None = None
    ) -> dict[str, object]:
        """The JSON object published (retained) on the camera's status topic."""
        return {
            "schema": "edge-camera-status/v1",
            "agent": agent,
            "camera": self.camera,
            "state": self.state,
            "reason": self.reason,
            "since": iso_utc(self.since_s),
            "fps": round(self.fps(), 2),
            "frames_analysed": frames,
            "frames_dropped": dropped,
            "reconnects": reconnects,
            "last_error": self.last_error,
            "updated": iso_utc(time.time() if now_s is None else now_s),
        }
