"""Scene generator: determinism, exact boxes, visibility, presets, events, MOT and YOLO output."""

from __future__ import annotations

import configparser
import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from testbed.media import probe_video
from testbed.scenes.background import BackgroundSpec, load_background
from testbed.scenes.dataset import DatasetConfig, read_labels, write_dataset, yolo_labels
from testbed.scenes.events import SCRIPTED_TRACKS
from testbed.scenes.motion import TrackPlan, Waypoint
from testbed.scenes.render import Effects, FrameTruth
from testbed.scenes.scenario import ScenarioSpec, build_renderer, make_scenario
from testbed.scenes.sprites import CLASS_NAMES, PERSON, TRUCK, random_style
from testbed.scenes.writer import events_document, mot_rows, read_mot, write_scene
from tests.fixtures.rtsp import MEDIA_CACHE_DIR

pytestmark = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg not installed")

PLAIN = BackgroundSpec("plain", plain_bgr=(0, 0, 0))
NO_EFFECTS = Effects(noise_sigma_levels=0.0)


def _plain(spec: ScenarioSpec, effects: Effects = NO_EFFECTS) -> ScenarioSpec:
    return dataclasses.replace(spec, background=PLAIN, effects=effects)


def _render_all(spec: ScenarioSpec) -> list[tuple[np.ndarray, FrameTruth]]:
    renderer = build_renderer(spec, MEDIA_CACHE_DIR)
    return [renderer.render(i) for i in range(spec.n_frames)]


def _truth_table(truth: FrameTruth) -> np.ndarray:
    return np.column_stack(
        [truth.track_id, truth.class_id, truth.box_xywh, (truth.visibility * 1e4).round()]
    )


def test_same_seed_gives_identical_frames_and_truth_and_other_seeds_differ() -> None:
    first = _render_all(make_scenario("crowded", 5, n_frames=12))
    again = _render_all(make_scenario("crowded", 5, n_frames=12))
    other = _render_all(make_scenario("crowded", 6, n_frames=12))

    assert make_scenario("crowded", 5, n_frames=12) == make_scenario("crowded", 5, n_frames=12)
    for (image, truth), (image2, truth2) in zip(first, again, strict=True):
        assert np.array_equal(image, image2)
        assert np.array_equal(_truth_table(truth), _truth_table(truth2))
    assert sum(len(t) for _, t in first) > 0
    assert not np.array_equal(first[5][0], other[5][0])
    assert not all(
        np.array_equal(_truth_table(a), _truth_table(b))
        for (_, a), (_, b) in zip(first, other, strict=True)
    )


def test_a_frame_renders_the_same_alone_as_in_sequence() -> None:
    spec = make_scenario("quiet", 3, n_frames=20)
    sequence = _render_all(spec)
    alone = build_renderer(spec, MEDIA_CACHE_DIR).render(17)

    assert np.array_equal(sequence[17][0], alone[0])
    assert np.array_equal(_truth_table(sequence[17][1]), _truth_table(alone[1]))


def _overlaps(box: np.ndarray, others: np.ndarray) -> bool:
    x, y, w, h = box
    ox, oy, ow, oh = others.T
    return bool(np.any((ox < x + w) & (x < ox + ow) & (oy < y + h) & (y < oy + oh)))


@pytest.mark.parametrize("preset", ["crowded", "small_far"])
def test_boxes_are_the_tight_bounds_of_the_drawn_pixels(preset: str) -> None:
    spec = _plain(make_scenario(preset, 11, n_frames=25), Effects(noise_sigma_levels=0.0))
    checked = 0
    for image, truth in _render_all(spec):
        changed = image.any(axis=2)
        union = np.zeros_like(changed)
        for x, y, w, h in truth.box_xywh:
            union[y : y + h, x : x + w] = True
        assert not np.any(changed & ~union), "a drawn pixel lies outside every box"
        for k, box in enumerate(truth.box_xywh):
            if _overlaps(box, np.delete(truth.box_xywh, k, axis=0)):
                continue
            x, y, w, h = box
            inside = changed[y : y + h, x : x + w]
            assert inside[0].any() and inside[-1].any(), (k, box)
            assert inside[:, 0].any() and inside[:, -1].any(), (k, box)
            checked += 1
    assert checked > 20


def _standing(track_id: int, class_id: int, x_m: float, z_m: float, seed: int) -> TrackPlan:
    style = random_style(class_id, np.random.default_rng(seed))
    waypoints = (Waypoint(x_m, z_m, pause_s=60.0), Waypoint(x_m, z_m))
    return TrackPlan(track_id, style, 0, waypoints, smooth=False)


def _still_scene(*plans: TrackPlan) -> tuple[np.ndarray, FrameTruth]:
    spec = _plain(make_scenario("quiet", 0, n_frames=1))
    spec = dataclasses.replace(spec, tracks=plans)
    return build_renderer(spec, MEDIA_CACHE_DIR).render(0)


def test_visibility_counts_occlusion_by_nearer_objects() -> None:
    camera = make_scenario("quiet", 0, n_frames=1).camera
    near_truck = _standing(1, TRUCK, camera.x_at_column(320, 12.0), 12.0, seed=1)
    hidden_person = _standing(2, PERSON, camera.x_at_column(250, 20.0), 20.0, seed=2)
    far_person = _standing(3, PERSON, camera.x_at_column(460, 22.0), 22.0, seed=3)

    _, truth = _still_scene(near_truck, hidden_person, far_person)
    alone_far, _ = _still_scene(far_person)
    alone_truck, _ = _still_scene(near_truck)

    vis = dict(zip(truth.track_id.tolist(), truth.visibility.tolist(), strict=True))
    assert vis[1] == 1.0  # nearest: never occluded
    assert vis[2] == 0.0  # wholly behind the truck, yet still in the ground truth
    far_mask, truck_mask = alone_far.any(axis=2), alone_truck.any(axis=2)
    expected = 1.0 - np.count_nonzero(far_mask & truck_mask) / np.count_nonzero(far_mask)
    assert 0.0 < vis[3] < 1.0
    assert vis[3] == pytest.approx(expected, abs=0.08)


def test_small_far_preset_has_mostly_small_boxes() -> None:
    spec = _plain(make_scenario("small_far", 4, n_frames=30))
    boxes = np.vstack([t.box_xywh for _, t in _render_all(spec)])

    small = (boxes[:, 2] < 32) & (boxes[:, 3] < 32)
    assert len(boxes) > 100
    assert small.mean() >= 0.8


def _px_per_frame(row_px: float, speed_mps: float) -> float:
    # events camera: horizon 0.2 * 360 = 72 px, camera 6 m high, 25 fps
    return speed_mps * (row_px - 72.0) / 6.0 / 25.0


def _first_frame_past(track_id: int, u_target: float, leg: int = 0) -> int:
    """1-based frame at which a scripted track first passes column `u_target` on leg `leg`."""
    track = next(t for t in SCRIPTED_TRACKS if t.track_id == track_id)
    u, frames = track.from_u_px, float(track.start_frame)
    for i, move in enumerate(track.legs):
        step = _px_per_frame(track.row_px, move.speed_mps)
        if i >= leg and min(u, move.to_u_px) < u_target < max(u, move.to_u_px):
            # first 0-based frame strictly past the target, plus one for 1-based frames
            return math.floor(frames + abs(u_target - u) / step) + 2
        frames += abs(move.to_u_px - u) / step + move.pause_s * 25.0
        u = move.to_u_px
    raise AssertionError("target not on the path")


def _zone_edge(row: float, side: str) -> float:
    # zone (60,230) (300,230) (320,330) (40,330): each side leans 20 px per 100 rows
    lean = (row - 230.0) * 0.2
    return 60.0 - lean if side == "left" else 300.0 + lean


def test_events_preset_raises_the_hand_computed_events() -> None:
    spec = _plain(make_scenario("events", 7))
    rows = [row for i, (_, t) in enumerate(_render_all(spec)) for row in mot_rows(i, t)]
    loiter_start = _first_frame_past(3, _zone_edge(280, "left"))
    expected = [
        # (track, kind, place, direction, frame)
        (1, "zone_enter", "zone-a", None, _first_frame_past(1, _zone_edge(300, "left"))),
        (1, "zone_exit", "zone-a", None, _first_frame_past(1, _zone_edge(300, "right"))),
        (1, "line_cross", "line-a", "in", _first_frame_past(1, 480.0)),
        (2, "line_cross", "line-a", "out", _first_frame_past(2, 480.0)),
        (3, "zone_enter", "zone-a", None, loiter_start),
        (3, "loiter", "zone-a", None, loiter_start + 125),  # 5 s dwell at 25 fps
        # back out after a 7 s stop: the return leg crosses the left edge again
        (3, "zone_exit", "zone-a", None, _first_frame_past(3, _zone_edge(280, "left"), leg=1)),
        (4, "line_cross", "line-a", "out", _first_frame_past(4, 480.0)),
        (4, "line_cross", "line-a", "in", _first_frame_past(4, 480.0, leg=1)),
        (6, "line_cross", "line-a", "out", _first_frame_past(6, 480.0)),
        (6, "zone_enter", "zone-a", None, _first_frame_past(6, _zone_edge(250, "right"))),
        (6, "zone_exit", "zone-a", None, _first_frame_past(6, _zone_edge(250, "left"))),
    ]  # fmt: skip

    events = events_document(spec, rows)["events"]
    got = sorted(
        (e["track_id"], e["kind"], e.get("zone", e.get("line")), e.get("direction"), e["frame"])
        for e in events
    )
    assert [g[:4] for g in got] == sorted(e[:4] for e in expected)
    for g, e in zip(got, sorted(expected), strict=True):
        assert abs(g[4] - e[4]) <= 1, (g, e)  # boxes are placed on whole pixels
    assert not any(e["track_id"] == 5 for e in events)  # passes above the line's end


def test_scene_folder_has_h264_video_and_mot_ground_truth(tmp_path: Path) -> None:
    spec = make_scenario("quiet", 2, n_frames=30)
    folder = write_scene(spec, tmp_path, MEDIA_CACHE_DIR)

    assert folder.root == tmp_path / "quiet-s2" and folder.video is not None
    info = probe_video(folder.video)
    assert (info.codec, info.pix_fmt, info.width, info.height) == ("h264", "yuv420p", 640, 360)
    assert (info.frame_count, info.fps, info.has_b_frames) == (30, 25.0, False)
    lines = folder.gt.read_text().splitlines()
    assert lines and all(len(line.split(",")) == 9 for line in lines)
    rows = read_mot(folder.gt)
    assert [r[:2] for r in rows] == sorted(r[:2] for r in rows)  # by frame, then id
    for frame, track_id, x, y, w, h, conf, cls, vis in rows:
        assert 1 <= frame <= 30 and track_id >= 1 and conf == 1
        assert 0 <= x and 0 <= y and w >= 1 and h >= 1 and x + w <= 640 and y + h <= 360
        assert cls in range(len(CLASS_NAMES)) and 0.0 <= vis <= 1.0
    seqinfo = configparser.ConfigParser()
    seqinfo.read(folder.root / "seqinfo.ini")
    assert seqinfo["Sequence"]["seqLength"] == "30"
    assert seqinfo["Sequence"]["imWidth"] == "640"
    scenario = json.loads((folder.root / "scenario.json").read_text())
    assert scenario["class_names"] == ["person", "car", "truck", "forklift"]
    assert scenario["seed"] == 2 and scenario["spec"]["preset"] == "quiet"
    assert folder.events is None


def test_yolo_labels_are_normalised_and_drop_hidden_objects() -> None:
    truth = FrameTruth(
        track_id=np.array([1, 2, 3]),
        class_id=np.array([0, 3, 1]),
        box_xywh=np.array([[0, 0, 64, 36], [320, 180, 320, 180], [10, 10, 20, 20]]),
        visibility=np.array([1.0, 0.5, 0.1], np.float32),
    )

    lines = yolo_labels(truth, 640, 360, min_visibility=0.25, min_side_px=2)

    assert lines == [
        "0 0.050000 0.050000 0.100000 0.100000",
        "3 0.750000 0.750000 0.500000 0.500000",
    ]


def test_dataset_has_disjoint_splits_and_valid_labels(tmp_path: Path) -> None:
    config = DatasetConfig(scenes_per_split=(2, 1, 1), frames_per_scene=20, every_n_frames=10)
    data_yaml = write_dataset(config, tmp_path / "ds", MEDIA_CACHE_DIR)

    data = yaml.safe_load(data_yaml.read_text())
    assert Path(data["path"]).is_absolute() and Path(data["path"]) == (tmp_path / "ds").resolve()
    assert data["names"] == dict(enumerate(CLASS_NAMES))
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    seeds = {split: {s["seed"] for s in scenes} for split, scenes in manifest["splits"].items()}
    assert not (
        seeds["train"] & seeds["val"]
        or seeds["train"] & seeds["test"]
        or seeds["val"] & seeds["test"]
    )
    stems: dict[str, set[str]] = {}
    n_boxes = 0
    for split in ("train", "val", "test"):
        images = sorted((tmp_path / "ds" / "images" / split).glob("*.jpg"))
        stems[split] = {p.stem for p in images}
        assert len(images) == 2 * len(seeds[split])  # frames 0 and 10 of each scene
        for image in images:
            labels = read_labels(tmp_path / "ds" / "labels" / split / f"{image.stem}.txt")
            n_boxes += len(labels)
            assert np.all(np.isin(labels[:, 0], range(len(CLASS_NAMES))))
            assert np.all((labels[:, 1:] >= 0.0) & (labels[:, 1:] <= 1.0))
            assert np.all(labels[:, 3:] > 0.0)
    assert not (stems["train"] & stems["val"] or stems["train"] & stems["test"])
    assert n_boxes > 0


def test_static_camera_variant_holds_the_background_and_keeps_the_rest() -> None:
    panning = make_scenario("crowded", 980001, n_frames=30)
    static = make_scenario("crowded", 980001, n_frames=30, static_camera=True)

    assert static.name == "crowded-s980001-static"
    assert static.background == dataclasses.replace(panning.background, still=True)
    assert (static.tracks, static.effects, static.camera) == (
        panning.tracks,
        panning.effects,
        panning.camera,
    )
    # specs from before `still` existed keep their JSON, so scene caches stay valid
    assert "still" not in panning.to_json()["background"]
    assert static.to_json()["background"]["still"] is True

    size = (panning.width_px, panning.height_px)
    moving = load_background(panning.background, *size, MEDIA_CACHE_DIR)
    held = load_background(static.background, *size, MEDIA_CACHE_DIR)
    assert not np.array_equal(moving.frame(0), moving.frame(20))  # the clip pans
    for index in (1, 20, 29):
        assert np.array_equal(held.frame(index), held.frame(0))
    assert np.array_equal(held.frame(0), moving.frame(0))
