"""Focus crops: the edge follows small objects the cloud vouched for at native resolution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np

from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from detection.runtimes.config import OnnxRuntimeConfig
from detection.slicing import Tile
from edge_agent.config.escalation import FocusConfig
from edge_agent.pipeline.focus import detect_crops, merge_focus, plan_focus
from edge_agent.tracking import FusedTracker
from edge_agent.tracking.cloud_evidence import CloudTrack

REPO_ROOT = Path(__file__).resolve().parents[2]
FRAME = (640, 360)
SEEN = 0.3  # the tracker's threshold for starting tracks


def _tracks(*boxes: tuple[float, float, float, float], vouched: bool = True) -> list[CloudTrack]:
    tracker = FusedTracker(n_init=1)
    for box in boxes:
        track = tracker.spawn_track(np.array(box), 0, 0)
        track.confirm()
        if vouched:
            track.cloud.confirmed(0.8)
    return tracker.cloud_tracks  # spawn_track added them


def test_small_vouched_tracks_get_a_crop_inside_the_frame() -> None:
    tracks = _tracks((630.0, 350.0, 638.0, 359.0), (100.0, 100.0, 110.0, 120.0))
    plan = plan_focus(tracks, FRAME, FocusConfig(crop_px=160), SEEN)
    assert len(plan.tiles) == 2 and plan.followed.shape == (2, 4)
    corner = plan.tiles[0]
    assert (corner.width, corner.height) == (160, 160)
    assert corner.xyxy[2:] == (640, 360)  # shifted inside the frame
    assert (corner.inner_right, corner.inner_bottom, corner.inner_left) == (False, False, True)


def test_large_unvouched_or_nearby_tracks_need_no_crop_of_their_own() -> None:
    config = FocusConfig(crop_px=160, max_object_px=40, max_crops=4)
    assert plan_focus(_tracks((100.0, 100.0, 200.0, 300.0)), FRAME, config, SEEN).tiles == []
    assert (
        plan_focus(_tracks((100.0, 100.0, 110.0, 120.0), vouched=False), FRAME, config, SEEN).tiles
        == []
    )
    near = _tracks((100.0, 100.0, 110.0, 120.0), (115.0, 100.0, 125.0, 120.0))
    plan = plan_focus(near, FRAME, config, SEEN)
    assert len(plan.tiles) == 1 and len(plan.followed) == 2  # one crop follows both
    many = _tracks(*[(float(x), 10.0, x + 10.0, 30.0) for x in range(0, 600, 100)])
    assert len(plan_focus(many, FRAME, FocusConfig(max_crops=2), SEEN).tiles) == 2


def test_a_track_the_whole_frame_still_sees_gets_a_crop_only_to_refine_a_small_box() -> None:
    (track,) = _tracks((100.0, 100.0, 110.0, 120.0))
    track.time_since_update, track.last_score = 0, 0.8  # matched on the last frame
    assert plan_focus([track], FRAME, FocusConfig(refine_max_px=0), SEEN).tiles == []
    assert len(plan_focus([track], FRAME, FocusConfig(refine_max_px=20), SEEN).tiles) == 1
    assert plan_focus([track], FRAME, FocusConfig(refine_max_px=19), SEEN).tiles == []
    track.last_score = 0.2  # only by a weak detection: the crop may find it better
    assert len(plan_focus([track], FRAME, FocusConfig(refine_max_px=0), SEEN).tiles) == 1
    track.time_since_update = 1  # missed
    assert len(plan_focus([track], FRAME, FocusConfig(refine_max_px=0), SEEN).tiles) == 1


def test_small_whole_frame_boxes_inside_a_crop_are_refined_by_the_crop() -> None:
    tile = Tile(100, 100, 160, 160, True, True, True, True)
    full = Detections(
        np.array(
            [
                [110.0, 110.0, 130.0, 150.0],  # small, loose: the crop's box is better
                [200.0, 110.0, 258.0, 250.0],  # larger than refine_max_px: kept
                [400.0, 100.0, 410.0, 120.0],  # outside the crop: kept
                [150.0, 200.0, 160.0, 220.0],  # the crop's nearest box overlaps it too little
            ]
        ),
        np.array([0.6, 0.8, 0.7, 0.5]),
        np.array([0, 0, 0, 1]),
    )
    crop = Detections(  # crop pixels
        np.array(
            [[12.0, 15.0, 28.0, 55.0], [100.0, 10.0, 158.0, 150.0], [58.0, 100.0, 61.0, 106.0]]
        ),
        np.array([0.9, 0.9, 0.9]),
        np.array([0, 0, 0]),
    )
    nothing = np.zeros((0, 4), dtype=np.float32)
    merged = merge_focus(full, [(tile, crop)], (360, 640), nothing, 1.0, refine_max_px=48)
    refined = merged.detections
    expected = 0.6 * np.array([110.0, 110.0, 130.0, 150.0]) + 0.9 * np.array([112, 115, 128, 155])
    np.testing.assert_allclose(refined.xyxy[0], expected / 1.5, rtol=1e-5)
    np.testing.assert_array_equal(refined.xyxy[1:4], full.xyxy[1:])
    assert refined.confidence.tolist() == full.confidence.tolist()  # the frame's scores
    assert refined.class_id.tolist() == full.class_id.tolist()
    assert len(refined) == 4  # the crop's boxes of those objects were not added
    unrefined = merge_focus(full, [(tile, crop)], (360, 640), nothing, 1.0, refine_max_px=0)
    np.testing.assert_array_equal(unrefined.detections.xyxy[:4], full.xyxy)


def test_merge_adds_only_what_the_whole_frame_missed() -> None:
    tile = Tile(100, 100, 160, 160, True, True, True, True)
    full = Detections(np.array([[10.0, 10.0, 50.0, 90.0]]), np.array([0.9]), np.array([0]))
    # in crop pixels: an object the frame also saw (covered by its box), one it missed, and
    # one cut by the crop's inner border
    crop = Detections(
        np.array([[-80.0, -80.0, -60.0, -20.0], [40.0, 40.0, 50.0, 60.0], [0.0, 50.0, 8.0, 70.0]]),
        np.array([0.7, 0.6, 0.9]),
        np.array([0, 0, 0]),
    )
    nothing = np.zeros((0, 4), dtype=np.float32)
    merged = merge_focus(full, [(tile, crop)], (360, 640), nothing, 0.5)
    assert merged.detections.xyxy[:, 0].tolist() == [10.0, 140.0]
    assert merged.may_start.tolist() == [True, True]  # a new object, scoring >= 0.5
    assert len(merge_focus(full, [(tile, crop)], (360, 640), nothing, 0.65).detections) == 1
    # near a followed track: kept whatever its score, but it may only continue that track
    followed = np.array([[141.0, 141.0, 151.0, 161.0]], dtype=np.float32)
    merged = merge_focus(full, [(tile, crop)], (360, 640), followed, 1.0)
    assert merged.may_start.tolist() == [True, False]
    # two crops seeing the same object: one box
    other = Tile(120, 120, 160, 160, True, True, True, True)
    shifted = Detections(np.array([[20.0, 20.0, 30.0, 40.0]]), np.array([0.8]), np.array([0]))
    merged = merge_focus(full, [(tile, crop), (other, shifted)], (360, 640), followed, 1.0)
    assert len(merged.detections) == 2 and merged.detections.confidence[1] == np.float32(0.8)


def test_a_box_that_may_not_start_a_track_only_continues_one() -> None:
    tracker = FusedTracker(n_init=1)
    box = Detections(np.array([[10.0, 10.0, 30.0, 50.0]]), np.array([0.9]), np.array([0]))
    tracker.update(box, may_start=np.array([False]))
    assert tracker.tracks == []
    tracker.update(box)
    out = tracker.update(box, may_start=np.array([False]))
    assert out.tracker_id.tolist() == [1]


def test_a_crop_finds_the_small_real_people_the_whole_frame_misses(
    bus_image: np.ndarray[Any, np.dtype[np.uint8]],
) -> None:
    # bus.jpg shrunk so its people are ~50 px tall in a 1280x720 frame: at the edge model's
    # 320x416 input they are ~16 px, too small; in a 200 px crop they are at twice the scale.
    small = cv2.resize(bus_image, None, fx=0.13, fy=0.13, interpolation=cv2.INTER_AREA)
    frame = np.full((720, 1280, 3), 114, np.uint8)
    frame[400 : 400 + small.shape[0], 900 : 900 + small.shape[1]] = small
    tile = Tile(860, 360, 200, 200, True, True, True, True)
    config = DetectorConfig(
        runtime=OnnxRuntimeConfig(model_path=REPO_ROOT / "models/coco/nanodet-coco-int8.onnx"),
        input_size=(320, 416),
        confidence_threshold=0.35,
        classes=["person"],
    )
    others = [Tile(x, 0, 200, 200, True, False, True, True) for x in (0, 300, 600)]  # empty
    with Detector.from_config(config) as detector:
        (whole,) = detector.detect([frame])
        found = detect_crops(detector, [("cam", frame, tile)])
        # the same crop sharing one detector run with three others, each in a quarter of the
        # input (160x208: the 200 px crop at 0.8 of its size, people ~40 px)
        packed = detect_crops(
            detector, [("a", frame, t) for t in others] + [("cam", frame, tile)], 2
        )
    assert len(whole) == 0
    for result in (found, packed):
        ((crop_tile, boxes),) = result["cam"]
        assert crop_tile == tile and len(boxes) >= 2
        in_frame = boxes.xyxy + np.array([tile.x0, tile.y0, tile.x0, tile.y0])
        assert np.all((in_frame[:, 0] >= 890) & (in_frame[:, 2] <= 1015))  # on the shrunk bus
    assert [len(boxes) for _, boxes in packed["a"]] == [0, 0, 0]


def test_small_cloud_hints_no_track_covers_get_a_crop_but_are_not_followed() -> None:
    from edge_agent.tracking.fusion import CloudHint

    tracks = _tracks((100.0, 100.0, 110.0, 120.0), vouched=False)
    hints = [
        CloudHint((400.0, 200.0, 410.0, 220.0), 0.4, 0),  # open: a crop
        CloudHint((101.0, 100.0, 111.0, 120.0), 0.9, 0),  # a track is there now
        CloudHint((300.0, 100.0, 400.0, 300.0), 0.9, 1),  # too large to need a closer look
    ]
    plan = plan_focus(tracks, FRAME, FocusConfig(crop_px=160, max_object_px=40), SEEN, hints)
    assert [tile.xyxy for tile in plan.tiles] == [(325, 130, 485, 290)]
    assert plan.followed.shape == (0, 4)  # what the crop finds there is a new object
