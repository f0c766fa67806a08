"""Annotated video of an edge agent's run: boxes, track ids, zones, lines, escalated frames.

`FrameAnnotator.draw` paints one analysed frame (pure: returns a new image): zones and lines of
the camera, every detection (tracked ones coloured by track id and labelled `#id class conf`,
untracked ones thin and grey), an info bar (frame, time, counts, latency), a red border and an
`ESCALATED` tag on frames sent to the cloud, and a banner for the rule events of the last moments.

`AnnotatedVideoWriter` does the drawing and H.264 encoding (ffmpeg, `VideoPipe`) in its own
thread, so the frame loop only hands frames over; when it falls behind, frames are dropped and
counted rather than slowing the loop.
"""

from __future__ import annotations

import colorsys
import logging
import queue
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from testbed.scenes.writer import VideoPipe

logger = logging.getLogger(__name__)

ByteImage = npt.NDArray[np.uint8]
Color = tuple[int, int, int]
Points = Sequence[tuple[float, float]]

_FONT = cv2.FONT_HERSHEY_SIMPLEX
_ZONE_COLOR: Color = (0, 200, 255)
_LINE_COLOR: Color = (255, 0, 255)
_UNTRACKED_COLOR: Color = (160, 160, 160)
_ESCALATED_COLOR: Color = (0, 0, 255)
_TEXT_COLOR: Color = (255, 255, 255)
_BAR_COLOR: Color = (0, 0, 0)


@dataclass(frozen=True)
class SceneOverlay:
    """The camera's geometry to draw, in normalised coordinates (0..1), as in the agent config."""

    zones: Sequence[tuple[str, Points]] = ()
    lines: Sequence[tuple[str, Points]] = ()


@dataclass(frozen=True)
class FrameInfo:
    """What the info bar says about one analysed frame."""

    index: int
    time_s: float  # since the start of the run
    escalated: bool = False
    escalated_so_far: int = 0  # frames sent to the cloud up to and including this one
    latency_ms: float | None = None  # capture to results
    events: Sequence[str] = ()  # rule events raised on this frame, short text


def track_color(track_id: int) -> Color:
    """A stable, well-separated BGR colour per track id."""
    hue = (track_id * 0.61803398875) % 1.0  # golden-ratio steps spread neighbouring ids
    r, g, b = colorsys.hsv_to_rgb(hue, 0.85, 1.0)
    return int(b * 255), int(g * 255), int(r * 255)


def _pixels(points: Points, width: int, height: int) -> npt.NDArray[np.int32]:
    return np.array([[round(x * width), round(y * height)] for x, y in points], dtype=np.int32)


def draw_label(
    image: ByteImage, text: str, x: int, y: int, color: Color, scale: float = 0.4
) -> None:
    """Text on a filled box whose bottom-left corner is at (x, y)."""
    (w, h), base = cv2.getTextSize(text, _FONT, scale, 1)
    y = max(y, h + base)
    cv2.rectangle(image, (x, y - h - base), (x + w + 2, y), color, -1)
    cv2.putText(image, text, (x + 1, y - base), _FONT, scale, (0, 0, 0), 1, cv2.LINE_AA)


@dataclass
class FrameAnnotator:
    """Draws analysed frames; keeps the recent events for a banner (see the module docstring)."""

    class_names: Sequence[str]
    overlay: SceneOverlay = field(default_factory=SceneOverlay)
    banner_s: float = 2.0
    _recent: deque[tuple[float, str]] = field(default_factory=deque)

    def draw(self, image: ByteImage, detections: Detections, info: FrameInfo) -> ByteImage:
        """A copy of `image` with everything drawn on it."""
        out = image.copy()
        height, width = out.shape[:2]
        self._draw_geometry(out, width, height)
        self._draw_detections(out, detections)
        self._draw_info(out, detections, info, width)
        self._draw_banner(out, info, height)
        if info.escalated:
            cv2.rectangle(out, (0, 0), (width - 1, height - 1), _ESCALATED_COLOR, 4)
            draw_label(out, "ESCALATED", width - 86, 40, _ESCALATED_COLOR, 0.45)
        return out

    def _draw_geometry(self, out: ByteImage, width: int, height: int) -> None:
        for name, points in self.overlay.zones:
            polygon = _pixels(points, width, height)
            shade = out.copy()
            cv2.fillPoly(shade, [polygon], _ZONE_COLOR)
            cv2.addWeighted(shade, 0.15, out, 0.85, 0.0, dst=out)
            cv2.polylines(out, [polygon], True, _ZONE_COLOR, 1, cv2.LINE_AA)
            x, y = polygon.min(axis=0)
            cv2.putText(out, name, (int(x) + 3, int(y) + 14), _FONT, 0.4, _ZONE_COLOR, 1)
        for name, points in self.overlay.lines:
            line = _pixels(points, width, height)
            cv2.polylines(out, [line], False, _LINE_COLOR, 2, cv2.LINE_AA)
            x, y = line[0]
            cv2.putText(out, name, (int(x) + 3, int(y) - 4), _FONT, 0.4, _LINE_COLOR, 1)

    def _draw_detections(self, out: ByteImage, detections: Detections) -> None:
        for xyxy, confidence, class_id, tracker_id in detections:
            x1, y1, x2, y2 = (round(float(v)) for v in xyxy)
            name = self.class_names[class_id] if 0 <= class_id < len(self.class_names) else class_id
            if tracker_id < 0:
                cv2.rectangle(out, (x1, y1), (x2, y2), _UNTRACKED_COLOR, 1)
                continue
            color = track_color(tracker_id)
            cv2.rectangle(out, (x1, y1), (x2, y2), color, 2)
            draw_label(out, f"#{tracker_id} {name} {confidence:.2f}", x1, y1 - 1, color)

    def _draw_info(
        self, out: ByteImage, detections: Detections, info: FrameInfo, width: int
    ) -> None:
        tracked = int(np.count_nonzero(detections.tracker_id >= 0))
        latency = f"  latency {info.latency_ms:.0f} ms" if info.latency_ms is not None else ""
        text = (
            f"frame {info.index}  t={info.time_s:4.1f}s  det {len(detections)}  tracked {tracked}"
            f"  escalated {info.escalated_so_far}{latency}"
        )
        cv2.rectangle(out, (0, 0), (width, 20), _BAR_COLOR, -1)
        cv2.putText(out, text, (5, 14), _FONT, 0.42, _TEXT_COLOR, 1, cv2.LINE_AA)

    def _draw_banner(self, out: ByteImage, info: FrameInfo, height: int) -> None:
        self._recent.extend((info.time_s, text) for text in info.events)
        while self._recent and info.time_s - self._recent[0][0] > self.banner_s:
            self._recent.popleft()
        for row, (_, text) in enumerate(reversed(self._recent)):
            draw_label(out, text, 5, height - 6 - row * 18, (0, 220, 255), 0.45)


class AnnotatedVideoWriter:
    """Draws and encodes frames in a background thread (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        annotator: FrameAnnotator,
        fps: float,
        *,
        max_queued_frames: int = 64,
    ) -> None:
        self.path = path
        self.annotator = annotator
        self.fps = fps
        self.frames_written = 0
        self.frames_dropped = 0
        self.error: str | None = None
        self._queue: queue.Queue[tuple[ByteImage, Detections, FrameInfo] | None] = queue.Queue(
            maxsize=max_queued_frames
        )
        self._thread = threading.Thread(target=self._run, name="annotated-video", daemon=True)
        self._thread.start()

    def submit(self, image: ByteImage, detections: Detections, info: FrameInfo) -> None:
        """Queue one frame; never blocks (a full queue drops the frame and counts it)."""
        try:
            self._queue.put_nowait((image, detections, info))
        except queue.Full:
            self.frames_dropped += 1

    def close(self, timeout_s: float = 60.0) -> None:
        """Finish the queued frames and the file."""
        self._queue.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self.error = f"video writer still busy after {timeout_s} s"

    def _run(self) -> None:
        pipe: VideoPipe | None = None
        try:
            while (item := self._queue.get()) is not None:
                image, detections, info = item
                if pipe is None:
                    height, width = image.shape[:2]
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    pipe = VideoPipe(self.path, width, height, self.fps)
                pipe.write(self.annotator.draw(image, detections, info))
                self.frames_written += 1
        except Exception as exc:  # the run goes on without its video; the summary says why
            logger.exception("annotated video failed")
            self.error = str(exc)
            while self._queue.get() is not None:  # keep `submit` from filling up
                pass
        finally:
            if pipe is not None:
                try:
                    pipe.close()
                except Exception as exc:
                    self.error = self.error or str(exc)
