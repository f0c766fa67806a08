"""Capture: newest-frame slot, back-off, file replay pacing, and a real RTSP server outage."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_agent.capture import (
    Backoff,
    CameraSource,
    CapturedFrame,
    CaptureState,
    LatestFrameSlot,
)
from edge_agent.capture.source import ffmpeg_capture_options, ffmpeg_options_env
from edge_agent.config.camera import CaptureConfig
from tests.fixtures.processes import free_tcp_port
from tests.fixtures.rtsp import RtspServer

logger = logging.getLogger(__name__)

STOP_BOUND_S = 3.0
NATIVE_FPS = 25.0


def _frame(index: int) -> CapturedFrame:
    return CapturedFrame("cam", index, time.time(), time.monotonic(), np.zeros((2, 2, 3), np.uint8))


class StateLog:
    """Records state changes and lets a test wait for one."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.changes: list[tuple[CaptureState, float]] = []

    def __call__(self, camera: str, old: CaptureState, new: CaptureState, reason: str) -> None:
        with self.cond:
            self.changes.append((new, time.monotonic()))
            self.cond.notify_all()

    def wait_for(self, states: set[CaptureState], *, after: int = 0, timeout_s: float) -> float:
        """Monotonic time of the first change into `states` at position >= `after`."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while True:
                for state, at in self.changes[after:]:
                    if state in states:
                        return at
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no {states} within {timeout_s} s: {self.changes}")
                self.cond.wait(remaining)


@pytest.fixture
def make_source() -> Iterator[Callable[..., tuple[CameraSource, StateLog]]]:
    """Build started sources; each is stopped (within the bound) after the test."""
    sources: list[CameraSource] = []

    def make(url: str, config: CaptureConfig, **kwargs: object) -> tuple[CameraSource, StateLog]:
        log = StateLog()
        source = CameraSource("cam", url, config, on_state_change=log, **kwargs)  # type: ignore[arg-type]
        sources.append(source)
        source.start()
        return source, log

    yield make
    for source in sources:
        source.stop(join_timeout_s=STOP_BOUND_S)


def _fast_config(**overrides: object) -> CaptureConfig:
    values: dict[str, object] = {
        "stall_timeout_ms": 2000,
        "reconnect_min_backoff_ms": 100,
        "reconnect_max_backoff_ms": 800,
        "reconnect_jitter_fraction": 0.2,
    }
    values.update(overrides)
    return CaptureConfig.model_validate(values)


# ---- pure ------------------------------------------------------------------------------------


def test_slot_keeps_only_newest_and_counts_drops() -> None:
    slot = LatestFrameSlot()
    assert slot.get(timeout_s=0.0) is None
    for index in range(5):
        slot.put(_frame(index))
    got = slot.get(timeout_s=0.0)
    assert got is not None and got.index == 4
    assert slot.drops == 4 and slot.puts == 5
    assert slot.get(timeout_s=0.01) is None  # nothing unseen: never the same frame twice
    slot.put(_frame(5))
    got = slot.get(timeout_s=0.0)
    assert got is not None and got.index == 5
    assert slot.drops == 4  # taken before being replaced: not a drop


def test_slot_get_wakes_on_put_and_close() -> None:
    slot = LatestFrameSlot()
    threading.Timer(0.05, slot.put, args=(_frame(7),)).start()
    got = slot.get(timeout_s=2.0)
    assert got is not None and got.index == 7
    threading.Timer(0.05, slot.close).start()
    started = time.monotonic()
    assert slot.get(timeout_s=2.0) is None
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize(
    ("min_s", "max_s", "jitter", "rng_value", "expected"),
    [
        (0.5, 30.0, 0.0, 0.9, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]),
        (0.5, 30.0, 0.2, 0.5, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]),  # mid-point: no spread
        (1.0, 4.0, 0.2, 0.0, [0.8, 1.6, 3.2, 3.2, 3.2]),  # lowest draw: -20 %
        (1.0, 4.0, 0.2, 1.0, [1.2, 2.4, 4.0, 4.0]),  # highest draw: +20 %, capped at max
        (0.0, 1.0, 0.5, 0.0, [0.0, 0.0, 0.0]),
        (2.0, 2.0, 1.0, 0.0, [0.0, 0.0]),
    ],
)
def test_backoff_sequence(
    min_s: float, max_s: float, jitter: float, rng_value: float, expected: list[float]
) -> None:
    backoff = Backoff(min_s, max_s, jitter, rng=lambda: rng_value)
    assert [backoff.next_delay_s() for _ in expected] == pytest.approx(expected)


def test_backoff_resets_and_reads_config() -> None:
    config = CaptureConfig(
        reconnect_min_backoff_ms=200, reconnect_max_backoff_ms=1000, reconnect_jitter_fraction=0.0
    )
    backoff = Backoff.from_config(config)
    assert [backoff.next_delay_s() for _ in range(3)] == pytest.approx([0.2, 0.4, 0.8])
    backoff.reset()
    assert backoff.attempt == 0
    assert backoff.next_delay_s() == pytest.approx(0.2)
    with pytest.raises(ValueError, match="min_s"):
        Backoff(2.0, 1.0, 0.1)


# ---- file source -----------------------------------------------------------------------------


def test_file_source_replays_at_native_fps(
    make_source: Callable[..., tuple[CameraSource, StateLog]], short_sample_clip: Path
) -> None:
    source, log = make_source(str(short_sample_clip), _fast_config())
    log.wait_for({CaptureState.STREAMING}, timeout_s=5.0)
    frames: list[CapturedFrame] = []
    started = time.monotonic()
    while time.monotonic() - started < 2.0:
        frame = source.slot.get(timeout_s=1.0)
        assert frame is not None
        frames.append(frame)
    elapsed = frames[-1].monotonic_s - frames[0].monotonic_s
    fps = (len(frames) - 1) / elapsed
    assert fps == pytest.approx(NATIVE_FPS, rel=0.15)
    assert source.slot.drops <= 2  # a fast consumer takes every frame
    indexes = [frame.index for frame in frames]
    assert indexes == sorted(indexes)
    for frame in frames:
        assert frame.camera == "cam"
        assert frame.image.shape == (272, 640, 3)
        # Wall-clock stamp matches the monotonic stamp (same moment, both clocks).
        offset = frame.capture_time_s - frame.monotonic_s
        assert offset == pytest.approx(time.time() - time.monotonic(), abs=0.05)
    stats = source.stats()
    assert stats.state is CaptureState.STREAMING and stats.reconnects == 0


def test_file_source_without_loop_stops_at_end(
    make_source: Callable[..., tuple[CameraSource, StateLog]], short_sample_clip: Path
) -> None:
    source, log = make_source(str(short_sample_clip), _fast_config(), loop_file=False)
    log.wait_for({CaptureState.STOPPED}, timeout_s=5.0)
    assert source.stats().frames == 50
    assert source.stats().reconnects == 0


def test_slow_consumer_never_sees_stale_frames(
    make_source: Callable[..., tuple[CameraSource, StateLog]], short_sample_clip: Path
) -> None:
    source, log = make_source(str(short_sample_clip), _fast_config())
    log.wait_for({CaptureState.STREAMING}, timeout_s=5.0)
    ages: list[float] = []
    drops: list[int] = []
    for _ in range(8):
        time.sleep(0.2)  # a detector slower than the camera
        frame = source.slot.get(timeout_s=1.0)
        assert frame is not None
        ages.append(frame.age_s())
        drops.append(source.slot.drops)
    # Never more than about one frame period old, however far behind the consumer is.
    assert max(ages) < 2.0 / NATIVE_FPS, ages
    assert drops == sorted(drops) and drops[-1] - drops[0] >= 25  # ~4 of each 5 frames dropped


def test_every_frame_replay_waits_for_a_slow_consumer_and_keeps_the_clip_clock(
    make_source: Callable[..., tuple[CameraSource, StateLog]], short_sample_clip: Path
) -> None:
    source, log = make_source(
        str(short_sample_clip),
        _fast_config(stall_timeout_ms=300),
        loop_file=False,
        every_frame=True,
    )
    frames: list[CapturedFrame] = []
    while (frame := source.slot.get(timeout_s=3.0)) is not None:
        frames.append(frame)
        # slower than the clip, once past the stall timeout: waiting for analysis is no stall
        time.sleep(0.6 if len(frames) == 5 else 0.1 if len(frames) < 10 else 0.0)
        if len(frames) == 50:
            break
    log.wait_for({CaptureState.STOPPED}, timeout_s=5.0)
    assert [f.index for f in frames] == list(range(50))
    assert source.slot.drops == 0 and source.stats().reconnects == 0
    # Stamped on the clip's clock (frame i at first + i / fps) on both clocks, not when read.
    walls = np.array([f.capture_time_s - frames[0].capture_time_s for f in frames])
    monos = np.array([f.monotonic_s - frames[0].monotonic_s for f in frames])
    np.testing.assert_allclose(walls, np.arange(50) / NATIVE_FPS, atol=1e-6)
    np.testing.assert_allclose(monos, np.arange(50) / NATIVE_FPS, atol=1e-6)


def test_a_file_never_opens_under_another_cameras_stream_options(
    make_source: Callable[..., tuple[CameraSource, StateLog]], short_sample_clip: Path
) -> None:
    # A stream camera opening at the same moment holds its RTSP options in the environment
    # (OpenCV reads them at each open). A file opened under them lost its first GOP: every rule
    # of the clip fired a second early (a CI flake with a dead RTSP camera beside a file one).
    holding = threading.Event()
    release = threading.Event()

    def stream_open() -> None:
        with ffmpeg_options_env(ffmpeg_capture_options("tcp")):
            holding.set()
            release.wait(5.0)

    opener = threading.Thread(target=stream_open)
    opener.start()
    try:
        assert holding.wait(5.0)
        source, log = make_source(
            str(short_sample_clip), _fast_config(), loop_file=False, every_frame=True
        )
        time.sleep(0.3)  # the file's open is waiting for the stream's to finish
    finally:
        release.set()
        opener.join(5.0)
    count = 0
    while source.slot.get(timeout_s=3.0) is not None:
        count += 1
    log.wait_for({CaptureState.STOPPED}, timeout_s=5.0)
    assert count == 50  # the whole clip, from its first frame


def test_missing_file_reports_error_and_keeps_retrying(
    make_source: Callable[..., tuple[CameraSource, StateLog]], tmp_path: Path
) -> None:
    source, log = make_source(str(tmp_path / "nope.mp4"), _fast_config())
    log.wait_for({CaptureState.RECONNECTING}, timeout_s=3.0)
    time.sleep(0.5)
    assert source.stats().reconnects >= 1
    assert any("not found" in line for line in source.error_lines())


class _HangingCapture:
    """A capture whose `read()` gives a few frames, then blocks (past any read timeout)."""

    def __init__(self, frames: int, release: threading.Event) -> None:
        self.frames = frames
        self.release_event = release
        self.released = False

    def isOpened(self) -> bool:  # noqa: N802 - OpenCV's name
        return True

    def read(self) -> tuple[bool, np.ndarray]:
        if self.frames > 0:
            self.frames -= 1
            time.sleep(0.01)
            return True, np.zeros((4, 4, 3), np.uint8)
        self.release_event.wait(30.0)
        return False, np.zeros((0,), np.uint8)

    def release(self) -> None:
        self.released = True


def test_watchdog_abandons_a_hung_read_and_reconnects(
    make_source: Callable[..., tuple[CameraSource, StateLog]], monkeypatch: pytest.MonkeyPatch
) -> None:
    unblock = threading.Event()
    captures: list[_HangingCapture] = []

    def fake_open(self: CameraSource) -> _HangingCapture:
        captures.append(_HangingCapture(3, unblock))
        return captures[-1]

    monkeypatch.setattr(CameraSource, "_open", fake_open)
    try:
        source, log = make_source(
            "rtsp://camera.invalid/stream", _fast_config(stall_timeout_ms=300)
        )
        log.wait_for({CaptureState.STREAMING}, timeout_s=2.0)
        stalled = log.wait_for({CaptureState.STALLED}, timeout_s=2.0)
        assert "watchdog" in " ".join(source.error_lines())
        log.wait_for({CaptureState.STREAMING}, after=3, timeout_s=2.0)  # a fresh connection
        assert stalled > 0 and len(captures) >= 2 and source.stats().frames >= 4
        assert not captures[0].released  # still stuck in read(), abandoned, not waited for
        started = time.monotonic()
        source.stop(join_timeout_s=0.5)
        assert time.monotonic() - started < 1.0
        assert source.state is CaptureState.STOPPED
    finally:
        unblock.set()
    time.sleep(0.1)
    assert captures[0].released  # the abandoned thread cleaned up once read() returned


# ---- real RTSP -------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_rtsp_outage_stalls_then_recovers(
    make_source: Callable[..., tuple[CameraSource, StateLog]],
    rtsp_server: RtspServer,
    record_property: Callable[[str, object], None],
) -> None:
    source, log = make_source(rtsp_server.url, _fast_config())
    log.wait_for({CaptureState.STREAMING}, timeout_s=10.0)
    first = source.slot.get(timeout_s=3.0)
    assert first is not None and first.image.shape == (272, 640, 3)
    time.sleep(0.5)
    assert source.stats().frames >= 5

    mark = len(log.changes)
    rtsp_server.stop()
    log.wait_for({CaptureState.STALLED, CaptureState.RECONNECTING}, after=mark, timeout_s=5.0)
    assert source.state in (CaptureState.STALLED, CaptureState.RECONNECTING)
    assert source.error_lines()
    time.sleep(1.5)  # a real outage: the back-off grows to its cap

    mark = len(log.changes)
    restarted = time.monotonic()
    rtsp_server.start()
    back = log.wait_for({CaptureState.STREAMING}, after=mark, timeout_s=8.0)
    recovery_s = back - restarted
    frames_before = source.stats().frames
    fresh = source.slot.get(timeout_s=3.0)
    time.sleep(0.5)
    assert fresh is not None and fresh.monotonic_s > restarted
    assert source.stats().frames > frames_before
    assert source.stats().reconnects >= 1
    assert recovery_s < 4.0, recovery_s
    logger.info("RTSP recovery: streaming %.2f s after the server restart began", recovery_s)
    record_property("rtsp_recovery_s", round(recovery_s, 3))

    started = time.monotonic()
    assert source.stop(join_timeout_s=STOP_BOUND_S)
    assert time.monotonic() - started < STOP_BOUND_S
    assert source.stats().state is CaptureState.STOPPED


@pytest.mark.timeout(60)
def test_frozen_rtsp_server_is_detected_as_stalled(
    make_source: Callable[..., tuple[CameraSource, StateLog]],
    rtsp_server: RtspServer,
    record_property: Callable[[str, object], None],
) -> None:
    """A server that keeps the connection open but sends nothing: only the watchdog sees it."""
    source, log = make_source(rtsp_server.url, _fast_config(stall_timeout_ms=1000))
    log.wait_for({CaptureState.STREAMING}, timeout_s=10.0)
    mark = len(log.changes)
    frozen = time.monotonic()
    rtsp_server.process.suspend()
    try:
        stalled = log.wait_for({CaptureState.STALLED}, after=mark, timeout_s=5.0)
    finally:
        rtsp_server.process.resume()
    assert stalled - frozen < 2.5
    mark = len(log.changes)
    resumed = time.monotonic()
    back = log.wait_for({CaptureState.STREAMING}, after=mark, timeout_s=10.0)
    fresh = source.slot.get(timeout_s=3.0)
    assert fresh is not None and fresh.monotonic_s > resumed
    logger.info(
        "RTSP freeze: stalled after %.2f s, streaming %.2f s after resume",
        stalled - frozen,
        back - resumed,
    )
    record_property("rtsp_freeze_recovery_s", round(back - resumed, 3))
    started = time.monotonic()
    source.stop(join_timeout_s=STOP_BOUND_S)
    assert time.monotonic() - started <= STOP_BOUND_S + 0.1


def test_bad_rtsp_url_keeps_reconnecting(
    make_source: Callable[..., tuple[CameraSource, StateLog]],
) -> None:
    url = f"rtsp://127.0.0.1:{free_tcp_port('127.0.0.1')}/nothing"
    source, log = make_source(url, _fast_config(reconnect_max_backoff_ms=200))
    log.wait_for({CaptureState.RECONNECTING}, timeout_s=5.0)
    time.sleep(1.5)
    stats = source.stats()
    assert stats.reconnects >= 2, stats
    assert stats.frames == 0 and source.running
    assert stats.last_error is not None and "cannot open" in stats.last_error
    started = time.monotonic()
    assert source.stop(join_timeout_s=STOP_BOUND_S)
    assert time.monotonic() - started < STOP_BOUND_S
