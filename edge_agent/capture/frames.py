"""A captured frame and the newest-frame slot that keeps latency from building up."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class CapturedFrame:
    """One decoded BGR frame of a camera, stamped when it was read.

    `capture_time_s` is wall-clock (Unix) time, for payloads and for matching cloud answers;
    `monotonic_s` is `time.monotonic()` at the same moment, for ages and latencies.
    """

    camera: str
    index: int
    capture_time_s: float
    monotonic_s: float
    image: npt.NDArray[np.uint8]

    def age_s(self, now_monotonic_s: float | None = None) -> float:
        """Seconds since the frame was read (monotonic clock)."""
        now = time.monotonic() if now_monotonic_s is None else now_monotonic_s
        return now - self.monotonic_s


class LatestFrameSlot:
    """Holds only the newest frame (drop-oldest); a consumer never gets a stale frame.

    `put` replaces a frame nobody has taken yet and counts it as dropped; `get` returns the
    newest frame not yet returned, waiting up to `timeout_s` for one. Thread-safe.
    """

    def __init__(self, notify: threading.Event | None = None) -> None:
        """`notify`, if given, is set on every `put` (one event can watch many slots)."""
        self._notify = notify
        self._cond = threading.Condition()
        self._frame: CapturedFrame | None = None
        self._unseen = False
        self._closed = False
        self._puts = 0
        self._drops = 0

    @property
    def drops(self) -> int:
        """Frames replaced before any consumer took them."""
        with self._cond:
            return self._drops

    @property
    def puts(self) -> int:
        """Frames ever put into the slot."""
        with self._cond:
            return self._puts

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        with self._cond:
            return self._closed

    def put(self, frame: CapturedFrame) -> None:
        """Store `frame` as the newest one; an untaken older frame is dropped and counted."""
        with self._cond:
            if self._unseen:
                self._drops += 1
            self._frame = frame
            self._unseen = True
            self._puts += 1
            self._cond.notify_all()
        if self._notify is not None:
            self._notify.set()

    def get(self, timeout_s: float | None = None) -> CapturedFrame | None:
        """The newest unreturned frame; None on timeout or close (`timeout_s` None: no limit)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._unseen or self._closed, timeout=timeout_s):
                return None
            if not self._unseen:
                return None
            self._unseen = False
            self._cond.notify_all()  # wakes `wait_taken`
            return self._frame

    def wait_taken(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` until no put frame is left untaken (or the slot is closed);
        whether that is so. A producer that must not drop frames calls it before each `put`."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._unseen or self._closed, timeout=timeout_s)

    def peek(self) -> CapturedFrame | None:
        """The newest frame, seen or not, without taking it."""
        with self._cond:
            return self._frame

    def close(self) -> None:
        """Wake every waiting `get` (they return None unless a frame is still unseen)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
