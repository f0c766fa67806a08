"""`CameraSource`: a supervised reader thread per camera with a stall watchdog and reconnects.

A supervisor thread starts one *connection* thread at a time. The connection thread opens the
stream (RTSP through OpenCV's FFmpeg backend, a GStreamer pipeline, or a video file replayed at
its native frame rate) and puts each decoded frame into a `LatestFrameSlot`. The supervisor is the
watchdog: when the connection ends, fails, or brings no frame for `stall_timeout_ms`, the state
goes to `stalled`, then `reconnecting` after an exponential back-off with jitter. A connection
thread stuck inside FFmpeg (a stalled server can block `read()` past its read timeout) is
abandoned, not waited for: it releases its capture and exits whenever the call returns, and can
no longer publish frames or change the state.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edge_agent.capture.backoff import Backoff
from edge_agent.capture.frames import CapturedFrame, LatestFrameSlot
from edge_agent.capture.urls import redact_url
from edge_agent.config.camera import CaptureConfig

logger = logging.getLogger(__name__)

_MS_PER_S = 1000.0
_FFMPEG_OPTIONS_ENV = "OPENCV_FFMPEG_CAPTURE_OPTIONS"
# OpenCV reads the options from the environment at each open: every FFmpeg open holds this lock,
# so a file never opens under a stream's options (see `ffmpeg_options_env`).
_OPEN_ENV_LOCK = threading.Lock()
_DEFAULT_FILE_FPS = 25.0


class CaptureState(StrEnum):
    """Where a camera source stands."""

    CONNECTING = "connecting"
    STREAMING = "streaming"
    STALLED = "stalled"
    RECONNECTING = "reconnecting"
    STOPPED = "stopped"


StateCallback = Callable[[str, CaptureState, CaptureState, str], None]
"""`callback(camera, old_state, new_state, reason)`, called from the source's threads."""


@dataclass(frozen=True, slots=True)
class CaptureStats:
    """A snapshot of a source's counters."""

    camera: str
    state: CaptureState
    frames: int
    drops: int
    reconnects: int
    last_error: str | None


def ffmpeg_capture_options(rtsp_transport: str) -> str:
    """`OPENCV_FFMPEG_CAPTURE_OPTIONS` for low-latency RTSP over `rtsp_transport`.

    No long probing (the SDP carries the parameter sets) and no input buffering.
    """
    return f"rtsp_transport;{rtsp_transport}|analyzeduration;0|probesize;32|fflags;nobuffer"


@contextmanager
def ffmpeg_options_env(options: str | None) -> Iterator[None]:
    """Hold the FFmpeg open lock with `OPENCV_FFMPEG_CAPTURE_OPTIONS` set to `options`.

    `None` leaves the variable as the process had it (a user's own options still apply). Every
    FFmpeg open, of a stream or a file, goes through here: a video file opened while another
    camera's RTSP options were set (`analyzeduration;0|probesize;32`) lost its first GOP, one
    second of the clip, so every rule fired a second early (seen as a CI flake).
    """
    with _OPEN_ENV_LOCK:
        previous = os.environ.get(_FFMPEG_OPTIONS_ENV)
        if options is not None:
            os.environ[_FFMPEG_OPTIONS_ENV] = options
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(_FFMPEG_OPTIONS_ENV, None)
            else:
                os.environ[_FFMPEG_OPTIONS_ENV] = previous


def is_stream_url(url: str) -> bool:
    """Whether `url` is a network stream (has a scheme) rather than a file path."""
    return "://" in url


class _Connection:
    """One attempt: a thread's capture and what the supervisor needs to watch it."""

    def __init__(self, deadline_mono: float) -> None:
        self.abandoned = threading.Event()
        self.done = threading.Event()
        self.deadline_mono = deadline_mono  # the watchdog fires past this; moved on by progress
        self.frames = 0
        self.error: str | None = None
        self.finished = False  # a file ended and is not looped: stop, do not reconnect
        self.thread: threading.Thread | None = None


class CameraSource:
    """Reads one camera in the background into a `LatestFrameSlot`.

    `url` is an `rtsp://`/`rtsps://` URL (credentials, if any, already in it) or a video file
    path; files are replayed at their native frame rate, looping when `loop_file`. With
    `every_frame`, a file's frames are never dropped: the reader waits until the slot's frame is
    taken, and stamps each frame on the clip's clock (first frame's time + position / fps), so a
    recording is analysed completely and its rules see the clip's own time. Call `start()` once
    and `stop()` at the end; frames come from `slot.get(timeout_s)`.
    """

    def __init__(
        self,
        camera: str,
        url: str,
        config: CaptureConfig | None = None,
        *,
        slot: LatestFrameSlot | None = None,
        loop_file: bool = True,
        every_frame: bool = False,
        on_state_change: StateCallback | None = None,
        rng: Callable[[], float] | None = None,
        watchdog_interval_s: float = 0.05,
        error_lines: int = 20,
    ) -> None:
        self.camera = camera
        self.url = url
        self.config = config if config is not None else CaptureConfig()
        self.slot = slot if slot is not None else LatestFrameSlot()
        self.loop_file = loop_file
        self.every_frame = every_frame
        self._on_state_change = on_state_change
        self._backoff = Backoff.from_config(self.config, rng)
        self._watchdog_interval_s = watchdog_interval_s
        self._stall_timeout_s = self.config.stall_timeout_ms / _MS_PER_S
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._state = CaptureState.STOPPED
        self._frames = 0
        self._reconnects = 0
        self._next_index = 0
        self._errors: deque[str] = deque(maxlen=error_lines)
        self._current: _Connection | None = None
        self._supervisor: threading.Thread | None = None

    # ---- public API -------------------------------------------------------------------------

    @property
    def state(self) -> CaptureState:
        """The current state."""
        with self._lock:
            return self._state

    @property
    def running(self) -> bool:
        """Whether the supervisor thread is alive."""
        return self._supervisor is not None and self._supervisor.is_alive()

    def stats(self) -> CaptureStats:
        """Counters: frames read, frames dropped in the slot, reconnect attempts, last error."""
        with self._lock:
            return CaptureStats(
                camera=self.camera,
                state=self._state,
                frames=self._frames,
                drops=self.slot.drops,
                reconnects=self._reconnects,
                last_error=self._errors[-1] if self._errors else None,
            )

    def error_lines(self) -> list[str]:
        """The last error lines (oldest first), for the log and for status reports."""
        with self._lock:
            return list(self._errors)

    def start(self) -> None:
        """Start the supervisor thread (once)."""
        if self._supervisor is not None:
            raise RuntimeError(f"camera {self.camera!r}: source already started")
        self._set_state(CaptureState.CONNECTING, "start", None)
        self._supervisor = threading.Thread(
            target=self._supervise, name=f"capture:{self.camera}", daemon=True
        )
        self._supervisor.start()

    def stop(self, *, join_timeout_s: float = 2.0) -> bool:
        """Stop reading and wait up to `join_timeout_s` for the threads; True if all ended.

        A connection thread blocked inside FFmpeg past the bound is left behind (a daemon
        thread); it releases its capture and exits when the call returns.
        """
        deadline = time.monotonic() + join_timeout_s
        self._stop.set()
        with self._lock:
            current = self._current
        if current is not None:
            current.abandoned.set()
        ended = True
        for thread in (self._supervisor, current.thread if current is not None else None):
            if thread is None:
                continue
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            ended = ended and not thread.is_alive()
        self._set_state(CaptureState.STOPPED, "stopped", None)
        self.slot.close()
        if not ended:
            logger.warning(
                "camera %s: a capture thread did not end within %.1f s", self.camera, join_timeout_s
            )
        return ended

    # ---- supervisor -------------------------------------------------------------------------

    def _supervise(self) -> None:
        first = True
        while not self._stop.is_set():
            if not first:
                with self._lock:
                    self._reconnects += 1
            conn = self._launch(reconnect=not first)
            first = False
            reason = self._watch(conn)
            if reason is None:  # stop requested
                break
            if conn.frames > 0:
                self._backoff.reset()  # that connection worked: start the back-off afresh
            if conn.finished:
                self._set_state(CaptureState.STOPPED, reason, None)
                self._stop.set()
                break
            self._record_error(reason)
            self._set_state(CaptureState.STALLED, reason, None)
            delay_s = self._backoff.next_delay_s()
            self._set_state(
                CaptureState.RECONNECTING, f"retry in {delay_s * _MS_PER_S:.0f} ms", None
            )
            if self._stop.wait(delay_s):
                break

    def _launch(self, *, reconnect: bool) -> _Connection:
        open_budget_s = self._stall_timeout_s  # the open timeout, then a stall timeout
        conn = _Connection(time.monotonic() + open_budget_s + self._stall_timeout_s)
        with self._lock:
            self._current = conn
        if reconnect:
            self._set_state(CaptureState.RECONNECTING, "opening", None)
        conn.thread = threading.Thread(
            target=self._read_loop, args=(conn,), name=f"capture-read:{self.camera}", daemon=True
        )
        conn.thread.start()
        return conn

    def _watch(self, conn: _Connection) -> str | None:
        """Wait until `conn` ends or stalls; the reason, or None when stopping."""
        while not self._stop.wait(self._watchdog_interval_s):
            if conn.done.is_set():
                return conn.error or "stream ended"
            if time.monotonic() > conn.deadline_mono:
                conn.abandoned.set()
                what = "frame" if conn.frames == 0 else "new frame"
                return f"no {what} for {self.config.stall_timeout_ms} ms (watchdog)"
        conn.abandoned.set()
        return None

    # ---- connection thread ------------------------------------------------------------------

    def _open(self) -> Any:
        timeout_ms = self.config.stall_timeout_ms
        params = [
            cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
            timeout_ms,
            cv2.CAP_PROP_READ_TIMEOUT_MSEC,
            timeout_ms,
        ]
        if self.config.gstreamer_pipeline is not None:
            return cv2.VideoCapture(self.config.gstreamer_pipeline, cv2.CAP_GSTREAMER)
        if not is_stream_url(self.url):
            if not Path(self.url).is_file():
                raise OSError(f"video file not found: {self.url}")
            # No FFmpeg read timeout on a file: a read starved of CPU past it is cut short, and
            # the decoder then skips to the next keyframe (a whole GOP of the clip lost; seen
            # as events 1 s early under load). A file that truly hangs is the watchdog's job.
            with ffmpeg_options_env(None):
                return cv2.VideoCapture(self.url, cv2.CAP_FFMPEG)
        with ffmpeg_options_env(ffmpeg_capture_options(self.config.rtsp_transport)):
            return cv2.VideoCapture(self.url, cv2.CAP_FFMPEG, params)

    def _read_loop(self, conn: _Connection) -> None:
        capture: Any = None
        try:
            capture = self._open()
            if not capture.isOpened():
                conn.error = f"cannot open {self._describe()}"
                return
            conn.deadline_mono = time.monotonic() + self._stall_timeout_s
            if is_stream_url(self.url) or self.config.gstreamer_pipeline is not None:
                self._read_stream(conn, capture)
            else:
                self._replay_file(conn, capture)
        except Exception as error:  # an OpenCV or OS error ends this attempt, not the source
            conn.error = f"{type(error).__name__}: {error}"
        finally:
            if capture is not None:
                capture.release()
            conn.done.set()

    def _read_stream(self, conn: _Connection, capture: Any) -> None:
        while not conn.abandoned.is_set():
            before = time.monotonic()
            ok, image = capture.read()
            if not ok:
                conn.error = f"read failed on {self._describe()} (stream ended or timed out)"
                return
            if time.monotonic() - before >= self._stall_timeout_s:
                # FFmpeg's read timeout fired, yet OpenCV may still hand back a (stale) frame
                # drained from the decoder: a stalled stream, not a live one.
                conn.error = (
                    f"read on {self._describe()} took over {self.config.stall_timeout_ms} ms"
                )
                return
            self._publish(conn, image)

    def _replay_file(self, conn: _Connection, capture: Any) -> None:
        fps = float(capture.get(cv2.CAP_PROP_FPS))
        period_s = 1.0 / (fps if fps > 0 else _DEFAULT_FILE_FPS)
        due = start = time.monotonic()
        start_wall = time.time()
        position = 0  # frames replayed on this connection, across loops
        while not conn.abandoned.is_set():
            ok, image = capture.read()
            if not ok:
                if not self.loop_file:
                    if self.every_frame:
                        self._wait_taken(conn)  # the last frame too is analysed before the end
                    conn.finished = True
                    conn.error = "end of file"
                    return
                if conn.frames == 0 or not capture.set(cv2.CAP_PROP_POS_FRAMES, 0):
                    conn.error = f"cannot read or rewind {self.url}"
                    return
                ok, image = capture.read()
                if not ok:
                    conn.error = f"cannot read {self.url} after rewinding"
                    return
            if self.every_frame:
                if not self._wait_taken(conn):
                    return
                due = start + position * period_s  # never ahead of the clip's clock
            # Pace like a camera: never ahead of the clip's clock; late frames go out at once.
            wait_s = due - time.monotonic()
            if wait_s > 0 and conn.abandoned.wait(wait_s):
                return
            if self.every_frame:
                self._publish(conn, image, (start_wall + position * period_s, due))
            else:
                due = max(due + period_s, time.monotonic() - period_s)
                self._publish(conn, image)
            position += 1

    def _wait_taken(self, conn: _Connection) -> bool:
        """Wait until analysis took the last frame, keeping the watchdog fed; False if abandoned."""
        while not self.slot.wait_taken(self._watchdog_interval_s):
            if conn.abandoned.is_set():
                return False
            conn.deadline_mono = time.monotonic() + self._stall_timeout_s
        return not conn.abandoned.is_set()

    def _publish(
        self, conn: _Connection, image: Any, stamp: tuple[float, float] | None = None
    ) -> None:
        """Put `image` in the slot, stamped now or at `stamp` (wall, monotonic seconds)."""
        wall_s, monotonic_s = (time.time(), time.monotonic()) if stamp is None else stamp
        with self._lock:
            if conn.abandoned.is_set() or self._current is not conn:
                return
            index = self._next_index
            self._next_index += 1
            self._frames += 1
        conn.frames += 1
        conn.deadline_mono = time.monotonic() + self._stall_timeout_s
        frame = CapturedFrame(
            self.camera, index, wall_s, monotonic_s, np.asarray(image, dtype=np.uint8)
        )
        self.slot.put(frame)
        if conn.frames == 1:
            self._set_state(CaptureState.STREAMING, "first frame", conn)

    # ---- state and errors -------------------------------------------------------------------

    def _describe(self) -> str:
        if self.config.gstreamer_pipeline is not None:
            return "GStreamer pipeline"
        return redact_url(self.url)

    def _record_error(self, line: str) -> None:
        stamped = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}"
        with self._lock:
            self._errors.append(stamped)
        logger.warning("camera %s: %s", self.camera, line)

    def _set_state(self, new: CaptureState, reason: str, conn: _Connection | None) -> None:
        """Change state; a connection's change applies only while it is current and not stopped."""
        with self._lock:
            if conn is not None and (conn.abandoned.is_set() or self._current is not conn):
                return
            if self._stop.is_set() and new is not CaptureState.STOPPED:
                return
            old = self._state
            if old is new:
                return
            self._state = new
        logger.info("camera %s: %s -> %s (%s)", self.camera, old, new, reason)
        if self._on_state_change is not None:
            try:
                self._on_state_change(self.camera, old, new, reason)
            except Exception:
                logger.exception("camera %s: state-change callback failed", self.camera)
