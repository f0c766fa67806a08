"""Drawing the demo's annotated frames (pure) and writing them as H.264."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

from detection.detections import Detections
from testbed.annotate import (
    AnnotatedVideoWriter,
    FrameAnnotator,
    FrameInfo,
    SceneOverlay,
    track_color,
)

NAMES = ["person", "car"]
OVERLAY = SceneOverlay(
    zones=[("zone-a", [(0.1, 0.5), (0.5, 0.5), (0.5, 0.9), (0.1, 0.9)])],
    lines=[("line-a", [(0.75, 0.1), (0.75, 0.9)])],
)


def _detections() -> Detections:
    return Detections(
        xyxy=np.array([[100, 100, 160, 200], [300, 150, 380, 210]], np.float32),
        confidence=np.array([0.9, 0.4], np.float32),
        class_id=np.array([0, 1]),
        tracker_id=np.array([7, -1]),
    )


def test_draw_marks_tracks_zones_and_escalated_frames_without_touching_the_input() -> None:
    image = np.zeros((360, 640, 3), np.uint8)
    annotator = FrameAnnotator(NAMES, OVERLAY)
    plain = annotator.draw(image, _detections(), FrameInfo(index=1, time_s=0.04))
    escalated = annotator.draw(image, _detections(), FrameInfo(2, 0.08, escalated=True))
    assert not image.any()  # drawn on a copy
    assert tuple(int(v) for v in plain[150, 100]) == track_color(7)  # the track's box edge
    assert tuple(int(v) for v in plain[200, 480]) != (0, 0, 0)  # the line
    assert plain[359, 320].sum() == 0 and escalated[359, 320].tolist() == [0, 0, 255]  # border


def test_track_colors_differ_for_neighbouring_ids() -> None:
    assert len({track_color(i) for i in range(20)}) == 20


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg not installed")
def test_writer_encodes_every_submitted_frame(tmp_path: Path) -> None:
    writer = AnnotatedVideoWriter(tmp_path / "out.mp4", FrameAnnotator(NAMES, OVERLAY), fps=25.0)
    image = np.full((120, 160, 3), 90, np.uint8)
    for i in range(10):
        writer.submit(image, Detections.empty(), FrameInfo(i, i / 25.0))
    writer.close()
    assert writer.error is None and writer.frames_written == 10
    capture = cv2.VideoCapture(str(tmp_path / "out.mp4"))
    assert int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) == 10
