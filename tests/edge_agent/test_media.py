"""`MediaStore`: event snapshots, crops and clips off the frame loop, retention, safe lookups."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from pydantic import ValidationError

from detection.detections import Detections
from edge_agent.alerts.sinks import EventContext
from edge_agent.capture.frames import CapturedFrame
from edge_agent.config.camera import CameraConfig
from edge_agent.config.media import MediaConfig
from edge_agent.media import MediaStore
from edge_agent.media.clips import EncodedFrame, FrameSampler, PendingClip
from edge_agent.media.images import crop_box, fit_width
from edge_agent.media.paths import event_files, media_url, safe_component
from edge_agent.media.retention import StoredFile, plan_deletions, sweep
from edge_agent.pipeline.core import FrameOutcome
from tests.fixtures.events import T0, door_event

CAMERA = "cam-1"
DAY = "2025-11-30"  # of T0, UTC
WAIT_S = 10.0


class FakeClock:
    """Wall time that moves only when told to."""

    def __init__(self, now_s: float = T0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def _camera() -> CameraConfig:
    return CameraConfig.model_validate(
        {
            "name": CAMERA,
            "url": "/x.mp4",
            "zones": [{"name": "door", "units": "pixel",
                       "points": [[0, 0], [150, 0], [150, 150], [0, 150]]}],
            "rules": [{"name": "door-enter", "kind": "zone_enter", "zone": "door"}],
        }
    )  # fmt: skip


def _config(directory: Path, **fields: Any) -> MediaConfig:
    return MediaConfig.model_validate(
        {"enabled": True, "directory": str(directory), "worker_niceness": 0, **fields}
    )


def _image(gray: int = 90, size: tuple[int, int] = (320, 240)) -> np.ndarray[Any, Any]:
    width, height = size
    image = np.full((height, width, 3), gray, np.uint8)
    image[20:220, 10:110] = (30, 180, 220)  # the event's object, where `door_event` puts it
    return image


def _frame(time_s: float = T0, index: int = 0, image: Any = None) -> CapturedFrame:
    return CapturedFrame(CAMERA, index, time_s, time_s - T0, _image() if image is None else image)


def _detections() -> Detections:
    return Detections(
        xyxy=np.array([[10.0, 20.0, 110.0, 220.0]], np.float32),
        confidence=np.array([0.9], np.float32),
        class_id=np.array([0]),
        tracker_id=np.array([7]),
    )


def _context(frame: CapturedFrame | None, event_id: str = "ev-1", **fields: Any) -> EventContext:
    event = door_event(timestamp_s=frame.capture_time_s if frame else T0, label="person", **fields)
    return EventContext(event, event_id, frame, _detections(), _camera(), ("person",))


def _outcome(frame: CapturedFrame) -> FrameOutcome:
    return FrameOutcome(CAMERA, frame, _detections(), [], 0.0, 0.0, 0.0)


@pytest.fixture
def stores() -> Iterator[list[MediaStore]]:
    """Stores a test made, closed at its end even when it fails."""
    made: list[MediaStore] = []
    yield made
    for store in made:
        store.close(timeout_s=5.0)


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".tmp-")]


# ---- config ------------------------------------------------------------------------------------


def test_config_defaults() -> None:
    config = MediaConfig()
    assert not config.enabled and config.snapshot and config.crop
    assert config.directory == Path("/var/lib/edge-agent/media")
    assert (config.jpeg_quality, config.base_url, config.retention_days) == (85, None, 7.0)
    assert (config.clips.enabled, config.clips.pre_s, config.clips.post_s) == (False, 3.0, 5.0)
    assert (config.clips.fps, config.clips.max_width, config.clips.codec) == (5.0, 960, "mp4v")
    assert config.max_disk_mb == 2048.0
    for name, field in MediaConfig.model_fields.items():
        assert field.description, name


@pytest.mark.parametrize(
    ("document", "error"),
    [
        ({"jpeg_quality": 5}, "greater than or equal to 10"),
        ({"base_url": "ftp://box/media"}, "should match pattern"),
        ({"base_url": "http://box/media?x=1"}, "should match pattern"),
        ({"clips": {"fps": 0}}, "greater than 0"),
        ({"clips": {"codec": "h264"}}, "'mp4v', 'vp8' or 'mjpeg'"),
        ({"max_disk_mb": 0}, "greater than 0"),
        ({"queue_limit": 0}, "greater than or equal to 1"),
        ({"snapshots": True}, "Extra inputs are not permitted"),
    ],
)
def test_config_rejects(document: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        MediaConfig.model_validate(document)


# ---- pure pieces -------------------------------------------------------------------------------


def test_event_files_layout_and_urls() -> None:
    files = event_files(CAMERA, "ab-12", T0, ".mp4")
    assert files.snapshot == f"{CAMERA}/{DAY}/ab-12.jpg"
    assert files.crop == f"{CAMERA}/{DAY}/ab-12_crop.jpg"
    assert files.clip == f"{CAMERA}/{DAY}/ab-12_clip.mp4"
    assert event_files("../x", "../../y", T0, ".mp4").snapshot == f"_.._x/{DAY}/_.._.._y.jpg"
    assert safe_component("..") == "_.."
    assert media_url("http://box:8480/media/", files.snapshot) == (
        f"http://box:8480/media/{CAMERA}/{DAY}/ab-12.jpg"
    )
    assert media_url("/media", "cam 1/a b.jpg") == "/media/cam%201/a%20b.jpg"
    assert media_url(None, files.snapshot) is None


def test_crop_box_and_fit_width() -> None:
    image = _image()
    crop = crop_box(image, (10.0, 20.0, 110.0, 220.0), 0.25)
    assert crop is not None and crop.shape == (240, 135, 3)  # clipped at the top and left
    assert crop_box(image, (400.0, 300.0, 500.0, 400.0), 0.25) is None
    assert crop_box(image, (float("nan"), 0.0, 10.0, 10.0), 0.25) is None
    assert fit_width(image, 960) is image
    assert fit_width(image, 161).shape == (120, 160, 3)
    assert fit_width(np.zeros((11, 15, 3), np.uint8), 960).shape == (10, 14, 3)


def test_frame_sampler_keeps_the_rate_of_25_fps_thinned_to_5() -> None:
    sampler = FrameSampler(5.0)
    kept = [i for i in range(100) if sampler.due(T0 + i / 25.0)]
    assert len(kept) == 20  # 5 a second on average, never two in a row
    assert all(4 <= b - a <= 6 for a, b in zip(kept, kept[1:], strict=False))


def test_pending_clip_collects_from_pre_to_post() -> None:
    clip = PendingClip.around(
        "e", CAMERA, Path("x.mp4"), 10.0, pre_s=1.0, post_s=1.0, fps=5.0, deadline_s=99.0
    )
    clip.add_all([EncodedFrame(8.0 + i * 0.2, b"", (2, 2)) for i in range(20)])
    times = [round(f.time_s, 1) for f in clip.frames]
    assert times == [9.0, 9.2, 9.4, 9.6, 9.8, 10.0, 10.2, 10.4, 10.6, 10.8, 11.0]
    assert clip.complete


# ---- snapshots and crops -----------------------------------------------------------------------


def test_snapshot_and_crop_are_promised_at_once_then_written_atomically(
    tmp_path: Path, stores: list[MediaStore]
) -> None:
    leftover = tmp_path / CAMERA / "2025-11-29" / ".tmp-0123-old.jpg"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"half a file")
    store = MediaStore(_config(tmp_path, base_url="http://box:8480/media/"))
    stores.append(store)

    references = store.record(_context(_frame()))  # before `start`: nothing can be written yet

    snapshot, crop = f"{CAMERA}/{DAY}/ev-1.jpg", f"{CAMERA}/{DAY}/ev-1_crop.jpg"
    assert references == {
        "snapshot": {"path": snapshot, "url": f"http://box:8480/media/{snapshot}"},
        "crop": {"path": crop, "url": f"http://box:8480/media/{crop}"},
    }
    assert not (tmp_path / snapshot).exists()
    store.start()
    assert store.wait_idle(WAIT_S)
    picture = cv2.imread(str(tmp_path / snapshot))
    assert picture is not None and picture.shape == (240, 320, 3)
    assert not np.array_equal(picture, _image())  # annotated: zones, boxes
    assert store.resolve(snapshot) == (tmp_path / snapshot).resolve()
    crop_image = cv2.imread(str(tmp_path / crop))
    assert crop_image is not None and crop_image.shape == (240, 135, 3)
    clean = crop_image.astype(np.int16)
    assert np.abs(clean[100, 60] - (30, 180, 220)).max() < 12  # the object, not drawn over
    assert _temp_files(tmp_path) == []  # the crash's leftover is gone, no new one remains
    stats = store.stats()
    assert (stats.written, stats.failed, stats.dropped) == (2, 0, 0)
    assert stats.bytes_written == sum(p.stat().st_size for p in tmp_path.rglob("*.jpg"))


@pytest.mark.parametrize(
    ("frame", "fields"),
    [
        (None, {}),
        (_frame(), {"phase": "update"}),
        (_frame(), {"phase": "end"}),
        (_frame(), {"phase": "retract"}),
        (_frame(image=np.zeros((0, 0, 3), np.uint8)), {}),
    ],
    ids=["no-frame", "update", "end", "retract", "empty-image"],
)
def test_only_event_starts_with_a_frame_get_media(
    tmp_path: Path, frame: CapturedFrame | None, fields: dict[str, Any]
) -> None:
    store = MediaStore(_config(tmp_path))
    assert store.record(_context(frame, **fields)) == {}
    assert store.stats().queued == 0


def test_no_crop_for_an_event_without_a_box(tmp_path: Path) -> None:
    store = MediaStore(_config(tmp_path))
    references = store.record(_context(_frame(), box=None))
    assert set(references) == {"snapshot"}
    assert MediaStore(_config(tmp_path, enabled=False)).record(_context(_frame())) == {}


# ---- clips -------------------------------------------------------------------------------------


def _count_frames(path: Path) -> tuple[int, list[float]]:
    capture = cv2.VideoCapture(str(path))
    means: list[float] = []
    while True:
        ok, image = capture.read()
        if not ok:
            break
        means.append(float(image.mean()))
    capture.release()
    return len(means), means


@pytest.mark.parametrize(
    ("codec", "suffix"), [("mp4v", ".mp4"), ("vp8", ".webm"), ("mjpeg", ".avi")]
)
def test_clips_around_two_events_on_one_camera(
    tmp_path: Path, stores: list[MediaStore], codec: str, suffix: str
) -> None:
    clips = {"enabled": True, "pre_s": 1.0, "post_s": 1.0, "fps": 5.0, "codec": codec}
    store = MediaStore(_config(tmp_path, snapshot=False, crop=False, clips=clips))
    stores.append(store)
    store.start()
    references: dict[str, Any] = {}
    for index in range(100):  # 4 s at 25 fps; the grey level tells the time
        time_s = T0 + index / 25.0
        frame = _frame(time_s, index, np.full((120, 160, 3), 10 + 2 * index, np.uint8))
        if index in (35, 45):  # events at 1.4 s and 1.8 s: their clips overlap
            event_id = f"ev-{index}"
            context = EventContext(door_event(timestamp_s=time_s), event_id, frame)
            references[event_id] = store.record(context)
        store.observe(_outcome(frame))  # as the agent: hooks after the events are published
    assert store.wait_idle(WAIT_S)

    for index in (35, 45):
        relative = f"{CAMERA}/{DAY}/ev-{index}_clip{suffix}"
        assert references[f"ev-{index}"] == {"clip": {"path": relative}}
        count, means = _count_frames(tmp_path / relative)
        assert abs(count - (1.0 + 1.0) * 5.0) <= 2  # 1 s before and 1 s after, at 5 fps
        first_index = index - 25  # 1 s before the event
        assert abs(means[0] - (10 + 2 * first_index)) < 12  # frames from before the event
        assert means == sorted(means)  # in time order
    assert _temp_files(tmp_path) == []
    assert store.stats().pending_clips == 0


def test_close_writes_a_pending_clip_with_the_frames_it_has(tmp_path: Path) -> None:
    clips = {"enabled": True, "pre_s": 1.0, "post_s": 30.0, "fps": 5.0}
    store = MediaStore(_config(tmp_path, snapshot=False, crop=False, clips=clips))
    store.start()
    for index in range(50):
        frame = _frame(T0 + index / 25.0, index)
        if index == 30:
            references = store.record(EventContext(door_event(), "ev-x", frame))
        store.observe(_outcome(frame))
    assert store.wait_idle(WAIT_S)
    assert store.stats().pending_clips == 1
    store.close(timeout_s=WAIT_S)

    count, _ = _count_frames(tmp_path / str(references["clip"]["path"]))  # type: ignore[index]
    assert count == 9  # 1 s before (5 frames) and the 0.8 s seen from it on (4 frames)
    assert store.stats().pending_clips == 0


def test_a_clip_whose_camera_stops_is_written_after_the_stall_timeout(
    tmp_path: Path, stores: list[MediaStore]
) -> None:
    clock = FakeClock()
    clips = {"enabled": True, "pre_s": 1.0, "post_s": 30.0, "fps": 5.0, "stall_timeout_s": 5.0}
    store = MediaStore(_config(tmp_path, snapshot=False, crop=False, clips=clips), clock=clock)
    stores.append(store)
    store.start()
    for index in range(40):
        frame = _frame(T0 + index / 25.0, index)
        if index == 30:
            references = store.record(EventContext(door_event(), "ev-x", frame))
        store.observe(_outcome(frame))
    assert store.wait_idle(WAIT_S)
    clock.now_s += 4.0
    time.sleep(0.5)  # the worker looks at its clock every 0.2 s
    assert store.stats().pending_clips == 1  # frames came 4 s ago: not stalled yet
    clock.now_s += 2.0
    _wait_until(lambda: store.stats().pending_clips == 0)
    assert store.wait_idle(WAIT_S)
    path = tmp_path / str(references["clip"]["path"])  # type: ignore[index]
    assert _count_frames(path)[0] == 7  # 1 s before (5 frames) and 2 from the event on


def test_no_clip_is_promised_for_a_camera_never_observed(tmp_path: Path) -> None:
    store = MediaStore(_config(tmp_path, snapshot=False, crop=False, clips={"enabled": True}))
    assert store.record(_context(_frame())) == {}


# ---- robustness --------------------------------------------------------------------------------


def test_a_full_queue_drops_and_counts_without_blocking(tmp_path: Path) -> None:
    store = MediaStore(_config(tmp_path, queue_limit=1, clips={"enabled": True}))  # not started
    started = time.perf_counter()
    results = [store.record(_context(_frame(), event_id=f"ev-{i}")) for i in range(200)]
    for index in range(200):
        store.observe(_outcome(_frame(T0 + index / 5.0, index)))
    elapsed_s = time.perf_counter() - started

    # never waits for room: a blocking put would wait forever here (a loose bound, not a timing
    # check: 400 calls took 0.58 s on a 2-core box at load average 9)
    assert elapsed_s < 10.0
    assert results[0] != {} and all(r == {} for r in results[1:])
    stats = store.stats()
    assert (stats.dropped, stats.dropped_frames, stats.queued) == (199, 200, 1)


def test_a_corrupt_frame_does_not_stop_the_worker(tmp_path: Path, stores: list[MediaStore]) -> None:
    clips = {"enabled": True, "pre_s": 1.0, "post_s": 0.4, "fps": 5.0}
    store = MediaStore(_config(tmp_path, clips=clips))
    stores.append(store)
    store.start()
    bad: list[Any] = [None, np.zeros((10, 10), np.uint8), np.zeros((10, 10, 3), np.float32), "jpeg"]
    for index, image in enumerate(bad):
        store.observe(_outcome(CapturedFrame(CAMERA, index, T0 + index, index, image)))
    assert store.wait_idle(WAIT_S)
    assert store.stats().failed == len(bad)

    for index in range(10, 40):
        frame = _frame(T0 + 10.0 + index / 5.0, index)  # after the bad ones
        if index == 20:
            references = store.record(_context(frame))
        store.observe(_outcome(frame))
    assert store.wait_idle(WAIT_S)
    assert set(references) == {"snapshot", "crop", "clip"}
    for reference in references.values():
        assert store.resolve(reference["path"]) is not None  # type: ignore[index]
    assert store.stats().failed == len(bad)


@pytest.mark.parametrize(
    "relative",
    [
        "../outside.jpg",
        f"{CAMERA}/../../outside.jpg",
        f"{CAMERA}/{DAY}/../../../outside.jpg",
        "/etc/passwd",
        "",
        ".",
        f"{CAMERA}//{DAY}/a.jpg",
        f"{CAMERA}\\{DAY}\\a.jpg",
        f"{CAMERA}/{DAY}/a.jpg\x00",
        f"{CAMERA}/{DAY}/.tmp-1-a.jpg",
        f"{CAMERA}/{DAY}/missing.jpg",
        f"{CAMERA}/{DAY}",
        f"{CAMERA}/{DAY}/escape.jpg",
    ],
)
def test_resolve_refuses_anything_but_a_file_inside(tmp_path: Path, relative: str) -> None:
    root = tmp_path / "media"
    folder = root / CAMERA / DAY
    folder.mkdir(parents=True)
    (folder / "a.jpg").write_bytes(b"jpeg")
    (folder / ".tmp-1-a.jpg").write_bytes(b"half")
    (tmp_path / "outside.jpg").write_bytes(b"secret")
    (folder / "escape.jpg").symlink_to(tmp_path / "outside.jpg")
    store = MediaStore(_config(root))
    assert store.resolve(f"{CAMERA}/{DAY}/a.jpg") == (folder / "a.jpg").resolve()
    assert store.resolve(relative) is None


# ---- retention ---------------------------------------------------------------------------------


def _stored(name: str, size: int, age_days: float) -> StoredFile:
    return StoredFile(Path(name), size, T0 - age_days * 86_400.0)


@pytest.mark.parametrize(
    ("max_age_days", "max_bytes", "deleted"),
    [
        (7.0, 10_000, ["old"]),  # by age only
        (30.0, 10_000, []),  # nothing to do
        (30.0, 250, ["old", "mid"]),  # by size: the oldest first, until it fits
        (7.0, 100, ["old", "mid", "new"]),  # by age, then by size
        (30.0, 0, ["old", "mid", "new", "newest"]),
    ],
)
def test_plan_deletions(max_age_days: float, max_bytes: int, deleted: list[str]) -> None:
    files = [
        _stored("new", 100, 1.0),
        _stored("old", 100, 8.0),
        _stored("newest", 100, 0.0),
        _stored("mid", 100, 3.0),
    ]
    planned = plan_deletions(files, T0, max_age_days * 86_400.0, max_bytes)
    assert [str(f.path) for f in planned] == deleted


def _aged_file(root: Path, relative: str, size: int, mtime_s: float) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (mtime_s, mtime_s))
    return path


def test_sweep_deletes_by_age_then_size_and_removes_empty_folders(tmp_path: Path) -> None:
    old = _aged_file(tmp_path, f"{CAMERA}/2025-11-20/a.jpg", 1000, T0 - 10 * 86_400)
    older = _aged_file(tmp_path, f"{CAMERA}/{DAY}/b.jpg", 1000, T0 - 60)
    newer = _aged_file(tmp_path, f"{CAMERA}/{DAY}/c.jpg", 1000, T0 - 30)
    temp = _aged_file(tmp_path, f"{CAMERA}/{DAY}/.tmp-1-d.jpg", 1000, T0 - 30 * 86_400)

    result = sweep(tmp_path, T0, 7 * 86_400.0, 1500)

    assert (result.deleted, result.deleted_bytes, result.kept_bytes) == (2, 2000, 1000)
    assert not old.exists() and not old.parent.exists()
    assert not older.exists() and newer.exists() and temp.exists()


def test_the_worker_sweeps_on_its_clock(tmp_path: Path, stores: list[MediaStore]) -> None:
    clock = FakeClock(T0)
    _aged_file(tmp_path, f"{CAMERA}/2025-11-20/a.jpg", 4000, T0 - 3 * 86_400)
    _aged_file(tmp_path, f"{CAMERA}/{DAY}/b.jpg", 4000, T0 - 3600)
    _aged_file(tmp_path, f"{CAMERA}/{DAY}/c.jpg", 4000, T0 - 60)
    config = _config(tmp_path, retention_days=2, max_disk_mb=0.01, sweep_interval_s=60)
    store = MediaStore(config, clock=clock)
    stores.append(store)

    store.start()  # the first sweep: a.jpg by age; b and c (8000 B) fit in 0.01 MiB (10485 B)
    _wait_until(lambda: store.stats().deleted >= 1)
    assert sorted(p.name for p in tmp_path.rglob("*.jpg")) == ["b.jpg", "c.jpg"]
    _aged_file(tmp_path, f"{CAMERA}/{DAY}/d.jpg", 4000, T0)  # 12000 B > 10485 B
    time.sleep(0.5)
    assert store.stats().deleted == 1  # not due yet on the fake clock
    clock.now_s += 61.0
    _wait_until(lambda: store.stats().deleted >= 2)
    assert sorted(p.name for p in tmp_path.rglob("*.jpg")) == ["c.jpg", "d.jpg"]
    assert store.stats().deleted_bytes == 8000


def _wait_until(condition: Any, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
