"""The RTSP server fixture read by OpenCV (FFmpeg): shape, several clients, loop, restart."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import pytest

from testbed.media import probe_video
from tests.fixtures.rtsp import RtspServer, RtspServerFactory, open_rtsp_capture

logger = logging.getLogger(__name__)

pytestmark = pytest.mark.usefixtures("rtsp_capture_options")

FIRST_FRAME_TIMEOUT_S = 5.0
READ_TIMEOUT_MS = 2000
# A stopped server must show up as failed reads within this, not as a hang.
FAILURE_DETECTION_BUDGET_S = 5.0
Frame = npt.NDArray[np.uint8]


def _read_frames(capture: cv2.VideoCapture, count: int, server: RtspServer) -> list[Frame]:
    frames: list[Frame] = []
    for index in range(count):
        ok, frame = capture.read()
        assert ok, f"read {index} failed; server log:\n{server.log_tail()}"
        frames.append(np.asarray(frame, dtype=np.uint8))
    return frames


def _open_and_read_first(server: RtspServer) -> tuple[cv2.VideoCapture, Frame, float]:
    started = time.monotonic()
    capture = open_rtsp_capture(server.url, read_timeout_ms=READ_TIMEOUT_MS)
    assert capture.isOpened(), f"cannot open {server.url}; server log:\n{server.log_tail()}"
    ok, frame = capture.read()
    elapsed_s = time.monotonic() - started
    assert ok, f"no first frame from {server.url}; server log:\n{server.log_tail()}"
    assert elapsed_s < FIRST_FRAME_TIMEOUT_S
    return capture, np.asarray(frame, dtype=np.uint8), elapsed_s


def test_frames_have_the_clip_shape(rtsp_server: RtspServer, sample_clip: Path) -> None:
    info = probe_video(sample_clip)
    capture, first, first_frame_s = _open_and_read_first(rtsp_server)
    try:
        frames = [first, *_read_frames(capture, 10, rtsp_server)]
    finally:
        capture.release()

    logger.info("first frame after %.3f s", first_frame_s)
    assert {frame.shape for frame in frames} == {(info.height, info.width, 3)}
    assert {frame.dtype for frame in frames} == {np.dtype(np.uint8)}


def test_two_clients_read_at_once(rtsp_server: RtspServer) -> None:
    first, _, _ = _open_and_read_first(rtsp_server)
    second, _, _ = _open_and_read_first(rtsp_server)
    try:
        for _ in range(25):
            _read_frames(first, 1, rtsp_server)
            _read_frames(second, 1, rtsp_server)
    finally:
        first.release()
        second.release()


def test_stream_loops_past_the_end_of_the_clip(
    rtsp_server_factory: RtspServerFactory, short_sample_clip: Path
) -> None:
    clip_frames = probe_video(short_sample_clip).frame_count
    server = rtsp_server_factory(clip=short_sample_clip)
    capture, first, _ = _open_and_read_first(server)
    try:
        frames = [first, *_read_frames(capture, clip_frames + 20, server)]
    finally:
        capture.release()

    # The same encoded frames come again one clip length later, so they decode identically;
    # neighbouring frames differ (the clip has motion), so the period is the clip, not a stall.
    wrapped = [float(np.abs(frames[i].astype(np.int16) - frames[i + clip_frames]).mean())
               for i in range(len(frames) - clip_frames)]  # fmt: skip
    neighbours = [float(np.abs(frames[i].astype(np.int16) - frames[i + 1]).mean())
                  for i in range(len(frames) - 1)]  # fmt: skip
    assert max(wrapped) < 0.5, wrapped
    assert np.median(neighbours) > 0.5, neighbours


def test_stop_fails_reads_quickly_and_start_serves_again(rtsp_server: RtspServer) -> None:
    capture, _, _ = _open_and_read_first(rtsp_server)
    try:
        _read_frames(capture, 5, rtsp_server)
        rtsp_server.stop()
        stopped = time.monotonic()
        # Frames already buffered may still come out; then reads must fail, not hang.
        while capture.read()[0]:
            assert time.monotonic() - stopped < FAILURE_DETECTION_BUDGET_S, "reads still succeed"
        detected_s = time.monotonic() - stopped
    finally:
        capture.release()
    assert detected_s < FAILURE_DETECTION_BUDGET_S
    logger.info("reads failed %.3f s after the server stopped", detected_s)

    restarted = time.monotonic()
    rtsp_server.start()
    capture, _, first_frame_s = _open_and_read_first(rtsp_server)
    try:
        _read_frames(capture, 5, rtsp_server)
    finally:
        capture.release()
    logger.info(
        "after restart: first frame %.3f s (server start %.3f s)",
        time.monotonic() - restarted,
        time.monotonic() - restarted - first_frame_s,
    )
