"""Writes a scene folder: H.264 video, MOTChallenge ground truth, sequence info, spec, events.

```
<out>/<name>/video.mp4        H.264 (libx264), yuv420p, no B-frames, a keyframe every second
<out>/<name>/gt/gt.txt        frame,id,x,y,w,h,conf,class,visibility  (1-based frame)
<out>/<name>/seqinfo.ini      MOTChallenge sequence info
<out>/<name>/scenario.json    the spec (seed, camera, tracks, effects), class names, geometry
<out>/<name>/events.json      `events` preset only: zones, lines and the expected events
```
Boxes are 0-based pixel coordinates of the drawn object clipped to the frame (`x + w` exclusive);
`class` is the 0-based id into `class_names`; `conf` is always 1.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from testbed.scenes.events import expected_events
from testbed.scenes.render import FrameTruth
from testbed.scenes.scenario import ScenarioSpec, build_renderer
from testbed.scenes.sprites import ByteImage

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
KEYFRAME_INTERVAL_S = 1.0
X264_CRF = 20
X264_PRESET = "veryfast"
FFMPEG_CLOSE_TIMEOUT_S = 60.0
_STDERR_TAIL_CHARS = 2000

MotRow = tuple[int, int, int, int, int, int, int, int, float]


class SceneWriteError(RuntimeError):
    """ffmpeg failed or was missing while writing a scene's video."""


class VideoPipe:
    """An ffmpeg process that encodes raw BGR frames from its stdin into an H.264 MP4."""

    def __init__(self, path: Path, width_px: int, height_px: int, fps: float) -> None:
        if shutil.which("ffmpeg") is None:
            raise SceneWriteError("ffmpeg not found on PATH (apt-get install ffmpeg)")
        gop = max(1, round(KEYFRAME_INTERVAL_S * fps))
        argv = [
            "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
            "-f", "rawvideo", "-pix_fmt", "bgr24", "-s", f"{width_px}x{height_px}",
            "-framerate", f"{fps:g}", "-i", "pipe:0",
            "-an", "-c:v", "libx264", "-preset", X264_PRESET, "-crf", str(X264_CRF),
            "-profile:v", "main", "-pix_fmt", "yuv420p", "-bf", "0",
            "-g", str(gop), "-keyint_min", str(gop), "-sc_threshold", "0",
            "-movflags", "+faststart", str(path),
        ]  # fmt: skip
        self.path = path
        self._shape = (height_px, width_px, 3)
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self._process = subprocess.Popen(  # noqa: S603 - explicit argument list, no shell
            argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self._stderr
        )

    def write(self, frame: ByteImage) -> None:
        """Queue one frame (BGR uint8 of the pipe's size)."""
        if frame.shape != self._shape:
            raise ValueError(f"frame shape {frame.shape} != expected {self._shape}")
        stdin = self._process.stdin
        if stdin is None:
            raise SceneWriteError("ffmpeg has no stdin pipe")
        try:
            stdin.write(frame.tobytes())
        except BrokenPipeError as exc:
            raise SceneWriteError(f"ffmpeg stopped early: {self._stderr_tail()}") from exc

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-_STDERR_TAIL_CHARS:]

    def close(self) -> None:
        """Finish the file; raises `SceneWriteError` when ffmpeg failed."""
        try:
            if self._process.stdin is not None and not self._process.stdin.closed:
                try:
                    self._process.stdin.close()
                except BrokenPipeError:
                    pass
            code = self._process.wait(timeout=FFMPEG_CLOSE_TIMEOUT_S)
            if code != 0:
                raise SceneWriteError(f"ffmpeg exited with {code}: {self._stderr_tail()}")
        finally:
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait()
            self._stderr.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def mot_rows(frame_index: int, truth: FrameTruth) -> list[MotRow]:
    """MOTChallenge rows of one frame (`frame_index` 0-based; written 1-based)."""
    rows: list[MotRow] = []
    for k in range(len(truth)):
        x, y, w, h = (int(v) for v in truth.box_xywh[k])
        rows.append(
            (frame_index + 1, int(truth.track_id[k]), x, y, w, h, 1, int(truth.class_id[k]),
             round(float(truth.visibility[k]), 4))
        )  # fmt: skip
    return rows


def format_mot(rows: Iterable[MotRow]) -> str:
    """`gt.txt` text for `rows`."""
    return "".join(
        f"{f},{i},{x},{y},{w},{h},{c},{k},{v:.4f}\n" for f, i, x, y, w, h, c, k, v in rows
    )


def read_mot(path: Path) -> list[MotRow]:
    """Parse a `gt.txt` written by `format_mot`."""
    rows: list[MotRow] = []
    for line in path.read_text().splitlines():
        f, i, x, y, w, h, c, k, v = line.split(",")
        rows.append((int(f), int(i), int(x), int(y), int(w), int(h), int(c), int(k), float(v)))
    return rows


def _seqinfo(spec: ScenarioSpec) -> str:
    return (
        "[Sequence]\n"
        f"name={spec.name}\n"
        "; frames are in video.mp4; imDir is named for MOTChallenge tools that expect it\n"
        "imDir=img1\n"
        f"frameRate={spec.fps:g}\n"
        f"seqLength={spec.n_frames}\n"
        f"imWidth={spec.width_px}\n"
        f"imHeight={spec.height_px}\n"
        "imExt=.jpg\n"
    )


def _normalized(points: Iterable[tuple[float, float]], spec: ScenarioSpec) -> list[list[float]]:
    return [[round(x / spec.width_px, 6), round(y / spec.height_px, 6)] for x, y in points]


def events_document(spec: ScenarioSpec, rows: Iterable[MotRow]) -> dict[str, Any]:
    """`events.json` content: geometry in pixel and normalized units plus expected events."""
    if spec.loiter_dwell_s is None:
        raise ValueError(f"scenario {spec.name} has no loiter dwell (not an events scene)")
    events = expected_events(
        rows, spec.zones, spec.lines, loiter_dwell_s=spec.loiter_dwell_s, fps=spec.fps
    )
    return {
        "format_version": FORMAT_VERSION,
        "fps": spec.fps,
        "frame_base": 1,
        "point": "bottom-centre of the ground-truth box",
        "loiter_dwell_s": spec.loiter_dwell_s,
        "zones": [
            {
                "name": z.name,
                "points": [list(p) for p in z.points],
                "points_normalized": _normalized(z.points, spec),
            }
            for z in spec.zones
        ],  # fmt: skip
        "lines": [
            {
                "name": ln.name,
                "points": [list(p) for p in ln.points],
                "in_side": ln.in_side,
                "points_normalized": _normalized(ln.points, spec),
            }
            for ln in spec.lines
        ],  # fmt: skip
        "events": events,
    }


@dataclass(frozen=True)
class SceneFolder:
    """Paths of a written scene."""

    root: Path
    video: Path | None
    gt: Path
    events: Path | None


def write_scene(
    spec: ScenarioSpec, out_dir: Path, cache_dir: Path, *, write_video: bool = True
) -> SceneFolder:
    """Render `spec` into `out_dir/<spec.name>/` (see the module docstring for the layout)."""
    root = out_dir / spec.name
    (root / "gt").mkdir(parents=True, exist_ok=True)
    renderer = build_renderer(spec, cache_dir)
    rows: list[MotRow] = []
    video = root / "video.mp4" if write_video else None
    pipe = VideoPipe(video, spec.width_px, spec.height_px, spec.fps) if video else None
    try:
        for index in range(spec.n_frames):
            image, truth = renderer.render(index)
            rows += mot_rows(index, truth)
            if pipe is not None:
                pipe.write(image)
    finally:
        if pipe is not None:
            pipe.close()
    gt = root / "gt" / "gt.txt"
    gt.write_text(format_mot(rows))
    (root / "seqinfo.ini").write_text(_seqinfo(spec))
    document = {
        "format_version": FORMAT_VERSION,
        "class_names": list(spec.class_names),
        "box_format": "x,y,w,h in 0-based pixels, x+w exclusive, clipped to the frame",
        "seed": spec.seed,
        "spec": spec.to_json(),
    }
    (root / "scenario.json").write_text(json.dumps(document, indent=1))
    events = None
    if spec.preset == "events":
        events = root / "events.json"
        events.write_text(json.dumps(events_document(spec, rows), indent=1))
    logger.info("scene %s: %d frames, %d boxes -> %s", spec.name, spec.n_frames, len(rows), root)
    return SceneFolder(root, video, gt, events)
