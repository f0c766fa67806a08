"""Event clips: a per-camera ring of recent JPEG frames, clips that collect frames until their
end, and the video writer.

Frames enter the ring already encoded (one JPEG per kept frame, shared by every clip that holds
it), so a camera costs `pre_s * fps` small JPEGs of memory and a clip never decodes the camera
stream again. A clip starts with the ring's frames from `pre_s` before its event and takes the
camera's next frames until `post_s` after it. `FrameSampler`, `FrameRing` and `PendingClip` are
pure (times in, decisions out); `write_clip` is the I/O: it decodes the JPEGs and encodes them
as `mp4v` or `vp8` video, or (`mjpeg`) puts the JPEGs as they are into an AVI file.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from edge_agent.config.media import ClipCodec
from edge_agent.media.files import commit_temp, temp_path_for
from edge_agent.media.images import Image, MediaError

__all__ = [
    "CLIP_FORMATS",
    "ClipFormat",
    "EncodedFrame",
    "FrameRing",
    "FrameSampler",
    "PendingClip",
    "write_clip",
]


@dataclass(frozen=True, slots=True)
class ClipFormat:
    """How OpenCV writes a codec: its FourCC, the container's extension, and whether the
    JPEGs go in as they are (no decoding, no encoding)."""

    fourcc: str
    suffix: str
    passthrough: bool = False


CLIP_FORMATS: dict[ClipCodec, ClipFormat] = {
    "mp4v": ClipFormat("mp4v", ".mp4"),
    "vp8": ClipFormat("VP80", ".webm"),
    "mjpeg": ClipFormat("MJPG", ".avi", passthrough=True),
}


@dataclass(frozen=True, slots=True)
class EncodedFrame:
    """One kept frame: its capture time (Unix seconds), its JPEG bytes and its size (width,
    height) in pixels."""

    time_s: float
    jpeg: bytes
    size: tuple[int, int]


class FrameSampler:
    """Picks frames at `fps` on average from their capture times (as the agent's rate
    limiter): a frame is due once its time reaches the next slot; after a gap the schedule
    restarts from the frame, and a frame up to a fifth of a period early counts as on time."""

    def __init__(self, fps: float) -> None:
        if not fps > 0.0:
            raise ValueError(f"fps must be positive, got {fps}")
        self.period_s = 1.0 / fps
        self._next_s: float | None = None

    def due(self, time_s: float) -> bool:
        """Whether the frame captured at `time_s` is kept."""
        if self._next_s is not None and time_s < self._next_s - 0.2 * self.period_s:
            return False
        if self._next_s is None or time_s - self._next_s >= self.period_s:
            self._next_s = time_s + self.period_s
        else:
            self._next_s += self.period_s
        return True


class FrameRing:
    """The last `keep_s` seconds of one camera's kept frames (by capture time)."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._frames: deque[EncodedFrame] = deque()

    def __len__(self) -> int:
        return len(self._frames)

    def add(self, frame: EncodedFrame) -> None:
        """Keep `frame`; forget those more than `keep_s` older than it."""
        self._frames.append(frame)
        while self._frames and self._frames[0].time_s < frame.time_s - self.keep_s:
            self._frames.popleft()

    def since(self, start_s: float) -> list[EncodedFrame]:
        """The kept frames captured at or after `start_s`, oldest first."""
        return [f for f in self._frames if f.time_s >= start_s]


@dataclass
class PendingClip:
    """A clip collecting frames: those from `start_s` to `end_s` (capture times), with a
    tolerance of a fifth of a frame period. It is complete when a frame at or past `end_s` came,
    when it holds `max_frames`, or when the clock passes `deadline_s`, which its owner moves on
    while the camera's frames keep coming (so a camera that stops ends its clips)."""

    event_id: str
    camera: str
    path: Path
    start_s: float
    end_s: float
    deadline_s: float
    period_s: float
    max_frames: int
    frames: list[EncodedFrame] = field(default_factory=list)
    complete: bool = False

    @classmethod
    def around(
        cls,
        event_id: str,
        camera: str,
        path: Path,
        event_s: float,
        *,
        pre_s: float,
        post_s: float,
        fps: float,
        deadline_s: float,
    ) -> PendingClip:
        """A clip of `pre_s` before and `post_s` after an event at `event_s`, at `fps`."""
        return cls(
            event_id,
            camera,
            path,
            event_s - pre_s,
            event_s + post_s,
            deadline_s,
            1.0 / fps,
            math.ceil((pre_s + post_s) * fps) + 2,
        )

    def add(self, frame: EncodedFrame) -> None:
        """Take `frame` if it falls in the clip; mark the clip complete once past its end."""
        slack_s = 0.2 * self.period_s
        if self.complete or frame.time_s < self.start_s - slack_s:
            return
        if frame.time_s <= self.end_s + slack_s:
            self.frames.append(frame)
        if frame.time_s >= self.end_s - slack_s or len(self.frames) >= self.max_frames:
            self.complete = True

    def add_all(self, frames: Sequence[EncodedFrame]) -> None:
        """`add` each of `frames`, oldest first."""
        for frame in frames:
            self.add(frame)


def write_clip(path: Path, frames: Sequence[EncodedFrame], fps: float, codec: ClipCodec) -> int:
    """Write the JPEG `frames` as a video at `fps` to `path`, atomically; the bytes written.
    Frames of another size than the first (a resolution change) are scaled, or left out when
    the JPEGs go in as they are."""
    if not frames:
        raise MediaError(f"no frames for clip {path.name}")
    form = CLIP_FORMATS[codec]
    size = frames[0].size
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_path_for(path)
    params = [cv2.VIDEOWRITER_PROP_RAW_VIDEO, 1] if form.passthrough else []
    fourcc = cv2.VideoWriter.fourcc(*form.fourcc)
    writer = cv2.VideoWriter(str(temp), cv2.CAP_FFMPEG, fourcc, fps, size, params)
    try:
        if not writer.isOpened():
            raise MediaError(f"OpenCV cannot write {form.fourcc} to {form.suffix} here")
        for frame in frames:
            if form.passthrough:
                if frame.size == size:  # a stream of one size: players would misdraw others
                    writer.write(np.frombuffer(frame.jpeg, dtype=np.uint8).reshape(1, -1))
                continue
            image = _decode(frame)
            if (image.shape[1], image.shape[0]) != size:
                image = np.asarray(
                    cv2.resize(image, size, interpolation=cv2.INTER_AREA), dtype=np.uint8
                )
            writer.write(image)
    except BaseException:
        writer.release()
        temp.unlink(missing_ok=True)
        raise
    writer.release()
    return commit_temp(temp, path)


def _decode(frame: EncodedFrame) -> Image:
    image = cv2.imdecode(np.frombuffer(frame.jpeg, dtype=np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise MediaError(f"cannot decode the clip frame of {frame.time_s:.3f}")
    return np.asarray(image, dtype=np.uint8)
