"""Sliced inference: tile plans, mapping tile boxes back, cut boxes, merging, the wrapper."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from detection.errors import DetectionError
from detection.runtimes.base import InputSpec
from detection.runtimes.config import OnnxRuntimeConfig
from detection.slicing import (
    SlicedDetector,
    SlicingConfig,
    Tile,
    axis_starts,
    box_overlap,
    cut_by_tile,
    drop_covered_cut_boxes,
    merge_detections,
    merge_frame,
    plan_tiles,
    tile_to_frame,
)

Image = np.ndarray[Any, np.dtype[np.uint8]]


def _dets(
    boxes: Sequence[Sequence[float]], scores: Sequence[float], classes: Sequence[int] | None = None
) -> Detections:
    return Detections(
        xyxy=np.array(boxes, np.float32).reshape(-1, 4),
        confidence=np.array(scores, np.float32),
        class_id=np.array(classes if classes is not None else [0] * len(scores), np.int64),
    )


def _windows(tiles: list[Tile]) -> list[tuple[int, int, int, int]]:
    return [tile.xyxy for tile in tiles]


# --- tile plan -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "tile", "overlap", "starts"),
    [
        (300, 416, 0.2, [0]),  # smaller than a tile: one
        (416, 416, 0.2, [0]),  # exactly one tile
        (832, 416, 0.0, [0, 416]),  # exact multiple, no overlap: side by side
        (832, 416, 0.2, [0, 208, 416]),  # exact multiple with overlap: one more, spread evenly
        (768, 416, 0.2, [0, 176, 352]),  # 2 tiles would overlap 64 px < 83: three
        (700, 416, 0.2, [0, 284]),  # two tiles overlapping 132 px >= 83
        (1920, 640, 0.2, [0, 427, 853, 1280]),  # last tile flush with the edge
    ],
)
def test_axis_starts(length: int, tile: int, overlap: float, starts: list[int]) -> None:
    got = axis_starts(length, tile, overlap)
    assert got == starts
    assert got[-1] + tile == max(length, tile)  # the last tile ends at the frame edge
    least_overlap = round(tile * overlap)
    assert all(tile - (b - a) >= least_overlap for a, b in zip(got, got[1:], strict=False))


@pytest.mark.parametrize(
    ("frame", "tile", "overlap", "windows"),
    [
        ((300, 400), (416, 416), 0.2, []),  # frame smaller than a tile: not sliced
        ((416, 416), (416, 416), 0.2, []),  # exactly a tile: not sliced
        (
            (416, 832),
            (416, 416),
            0.0,
            [(0, 0, 416, 416), (416, 0, 832, 416)],
        ),  # exact multiple
        (
            (832, 832),
            (416, 416),
            0.0,
            [(0, 0, 416, 416), (416, 0, 832, 416), (0, 416, 416, 832), (416, 416, 832, 832)],
        ),
        (
            (576, 768),
            (640, 640),
            0.2,
            [(0, 0, 640, 576), (128, 0, 768, 576)],
        ),  # taller tile than frame: tiles only along x, as high as the frame
        (
            (576, 768),
            (416, 416),
            0.2,
            [
                (0, 0, 416, 416),
                (176, 0, 592, 416),
                (352, 0, 768, 416),
                (0, 160, 416, 576),
                (176, 160, 592, 576),
                (352, 160, 768, 576),
            ],
        ),
    ],
    ids=["smaller", "equal", "exact-multiple", "exact-2x2", "one-axis", "vtest-416"],
)
def test_plan_tiles(
    frame: tuple[int, int],
    tile: tuple[int, int],
    overlap: float,
    windows: list[tuple[int, int, int, int]],
) -> None:
    tiles = plan_tiles(frame, tile, overlap)
    assert _windows(tiles) == windows
    for t in tiles:  # inside the frame, never padded where the frame goes on
        assert 0 <= t.x0 and t.x0 + t.width <= frame[1]
        assert 0 <= t.y0 and t.y0 + t.height <= frame[0]


def test_tiles_know_which_sides_are_inner() -> None:
    left, right = plan_tiles((416, 832), (416, 416), 0.0)
    assert (left.inner_left, left.inner_right, left.inner_top, left.inner_bottom) == (
        False,
        True,
        False,
        False,
    )
    assert (right.inner_left, right.inner_right) == (True, False)


def test_bad_plans_are_refused() -> None:
    with pytest.raises(DetectionError):
        axis_starts(0, 416, 0.2)
    with pytest.raises(DetectionError):
        axis_starts(800, 416, 1.0)


# --- mapping back and cut boxes ----------------------------------------------------------------


def test_tile_boxes_move_to_frame_pixels_and_are_clipped() -> None:
    tile = plan_tiles((576, 768), (416, 416), 0.2)[4]  # (176, 160) .. (592, 576)
    found = _dets([[10, 20, 30, 60], [400, 400, 420, 430]], [0.9, 0.8])

    moved = tile_to_frame(found, tile, (576, 768))

    np.testing.assert_allclose(moved.xyxy, [[186, 180, 206, 220], [576, 560, 596, 576]])
    assert moved.confidence.tolist() == pytest.approx([0.9, 0.8])


def test_boxes_at_inner_tile_borders_are_cut_frame_borders_are_not() -> None:
    left, right = plan_tiles((416, 832), (416, 416), 0.0)
    boxes = np.array(
        [
            [0, 100, 50, 200],  # at the left frame border: whole
            [380, 100, 415, 200],  # reaches the inner right border (within 2 px): cut
            [100, 0, 200, 416],  # spans top to bottom frame borders: whole
            [300, 100, 400, 200],  # inside: whole
        ],
        np.float32,
    )
    assert cut_by_tile(boxes, left, 2).tolist() == [False, True, False, False]
    assert cut_by_tile(boxes, right, 2).tolist() == [True, False, False, False]


def test_cut_box_is_dropped_only_when_a_whole_box_of_its_class_covers_it() -> None:
    found = _dets(
        [
            [100, 100, 150, 200],  # whole person
            [100, 100, 130, 200],  # its cut piece: inside it -> dropped
            [100, 100, 130, 200],  # a cut piece of another class: nothing covers it -> kept
            [500, 100, 530, 200],  # a cut piece nothing covers -> kept
        ],
        [0.9, 0.8, 0.7, 0.6],
        [0, 0, 1, 0],
    )
    cut = np.array([False, True, True, True])

    kept = drop_covered_cut_boxes(found, cut, 0.6)

    assert kept.confidence.tolist() == pytest.approx([0.9, 0.7, 0.6])


# --- merging -----------------------------------------------------------------------------------


def test_box_overlap_iou_and_ios() -> None:
    a = np.array([[0, 0, 10, 10]], np.float32)
    b = np.array([[0, 0, 10, 20], [20, 20, 30, 30]], np.float32)
    np.testing.assert_allclose(box_overlap(a, b, "iou"), [[0.5, 0.0]])
    np.testing.assert_allclose(box_overlap(a, b, "ios"), [[1.0, 0.0]])


@pytest.mark.parametrize(
    ("method", "metric", "boxes"),
    [
        # the two halves overlap 40/160 IoU, 40/100 IoS: neither merges at 0.5 ...
        ("nms", "iou", [[100, 100, 200, 200], [160, 100, 260, 200]]),
        ("nmm", "ios", [[100, 100, 200, 200], [160, 100, 260, 200]]),
    ],
)
def test_merge_keeps_boxes_below_the_threshold(
    method: Any, metric: Any, boxes: list[list[float]]
) -> None:
    merged = merge_detections(_dets(boxes, [0.9, 0.8]), method, metric, 0.5)
    assert len(merged) == 2


def test_merge_per_class_nms_and_nmm() -> None:
    found = _dets(
        [[100, 100, 200, 200], [110, 100, 210, 200], [110, 100, 210, 200]],
        [0.9, 0.8, 0.7],
        [0, 0, 1],
    )
    nms = merge_detections(found, "nms", "iou", 0.5)
    assert nms.class_id.tolist() == [0, 1]  # the other class is not suppressed
    np.testing.assert_allclose(nms.xyxy[0], [100, 100, 200, 200])
    nmm = merge_detections(found, "nmm", "iou", 0.5)
    np.testing.assert_allclose(nmm.xyxy[0], [100, 100, 210, 200])  # the union
    assert nmm.confidence.tolist() == pytest.approx([0.9, 0.7])


def test_box_split_across_two_tiles_becomes_one() -> None:
    """A 120 px person standing across the border of two side-by-side tiles (no overlap): each
    tile sees a cut piece; the whole-frame pass sees it whole (coarser box, lower score)."""
    frame = (416, 832)
    left, right = plan_tiles(frame, (416, 416), 0.0)
    config = SlicingConfig(enabled=True)
    left_piece = _dets([[356, 100, 416, 300]], [0.8])  # tile pixels, touches its right side
    right_piece = _dets([[0, 100, 60, 300]], [0.7])  # touches its left side
    whole = _dets([[352, 96, 478, 304]], [0.6])

    merged = merge_frame(whole, [(left, left_piece), (right, right_piece)], frame, config)

    assert len(merged) == 1
    np.testing.assert_allclose(merged.xyxy[0], [352, 96, 478, 304])

    # Without the whole-frame box nothing covers the pieces: both stay (abutting, no overlap).
    pieces = merge_frame(None, [(left, left_piece), (right, right_piece)], frame, config)
    np.testing.assert_allclose(pieces.xyxy, [[356, 100, 416, 300], [416, 100, 476, 300]])


def test_object_wider_than_a_tile_is_rebuilt_from_its_pieces_by_nmm_ios() -> None:
    """A 400 px car that no tile holds whole and the whole-frame pass missed: three cut pieces.
    Greedy merging by IoS joins them into one box; NMS by IoU would keep separate pieces."""
    frame = (416, 832)
    tiles = plan_tiles(frame, (416, 416), 0.2)  # x0 = 0, 208, 416
    pieces = [
        _dets([[100, 50, 416, 150]], [0.8], [2]),  # tile pixels: cut at its right side
        _dets([[0, 50, 292, 150]], [0.9], [2]),  # frame x 208..500: cut at its left side
        _dets([[0, 50, 84, 150]], [0.7], [2]),  # frame x 416..500
    ]
    found = list(zip(tiles, pieces, strict=True))

    merged = merge_frame(None, found, frame, SlicingConfig(merge_method="nmm", merge_metric="ios"))
    kept = merge_frame(None, found, frame, SlicingConfig(merge_method="nms", merge_metric="iou"))

    np.testing.assert_allclose(merged.xyxy, [[100, 50, 500, 150]])
    assert merged.confidence.tolist() == pytest.approx([0.9])
    assert len(kept) == 2  # 100..416 and 208..500 overlap at IoU 0.53: the third survives


def test_overlapping_tiles_merge_the_same_object_once() -> None:
    """With overlap, an object inside the overlap is whole in both tiles: one box survives."""
    frame = (416, 832)
    tiles = plan_tiles(frame, (416, 416), 0.2)  # x0 = 0, 208, 416
    # a person at frame x 300..360: whole in tile 0 (300..360) and tile 1 (92..152)
    found = [
        _dets([[300, 50, 360, 200]], [0.8]),
        _dets([[92, 52, 152, 201]], [0.85]),
        _dets([], []),
    ]
    merged = merge_frame(None, list(zip(tiles, found, strict=True)), frame, SlicingConfig())
    assert len(merged) == 1
    assert merged.confidence.tolist() == pytest.approx([0.85])


def test_config_bounds_and_defaults() -> None:
    config = SlicingConfig()
    assert not config.enabled
    assert (config.merge_method, config.merge_metric) == ("nmm", "ios")
    with pytest.raises(ValidationError):
        SlicingConfig(tile_overlap_ratio=0.9)
    with pytest.raises(ValidationError):
        SlicingConfig(merge_method="soft")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        SlicingConfig(tile_size=320)  # type: ignore[call-arg]
    for name, info in SlicingConfig.model_fields.items():
        assert info.description, name


# --- the wrapper on a fake runtime -------------------------------------------------------------

INPUT = 64


class PatchRuntime:
    """A fake model: finds a pure-white square patch wherever it is in the input, as one box of
    class 0 (score 0.9) covering the patch's white pixels; records each batch's images."""

    name = "patch"

    def __init__(self, max_batch_size: int | None = None) -> None:
        self.batches: list[np.ndarray[Any, np.dtype[np.float32]]] = []
        self._spec = InputSpec(INPUT, INPUT, "NCHW", max_batch_size)

    @property
    def input_spec(self) -> InputSpec:
        return self._spec

    def infer(self, images: np.ndarray[Any, np.dtype[np.float32]]) -> Any:
        self.batches.append(images.copy())
        out = np.zeros((images.shape[0], 4 + 2, 1), np.float32)  # one anchor, 2 classes
        for b, image in enumerate(images):
            ys, xs = np.nonzero(image.min(axis=0) > 0.99)
            if ys.size:
                x1, y1, x2, y2 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
                out[b, :4, 0] = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]
                out[b, 4, 0] = 0.9
        return out

    def close(self) -> None:
        pass


def _detector(runtime: PatchRuntime) -> Detector:
    config = DetectorConfig(
        runtime=OnnxRuntimeConfig(model_path=Path("unused.onnx")),
        class_names=["thing", "other"],
        box_units="pixels",
    )
    return Detector(runtime, config)


def _frame_with_patch(h: int, w: int, x: int, y: int, side: int) -> Image:
    frame = np.full((h, w, 3), 60, np.uint8)
    frame[y : y + side, x : x + side] = 255
    return frame


def test_sliced_detector_finds_a_small_object_whole_frame_misses_at_native_scale() -> None:
    """A 4 px patch in a 256x256 frame shrinks to 1 px in the 64 px whole-frame input; the fake
    model needs pure-white pixels, which survive only at native scale (in the tiles)."""
    frame = _frame_with_patch(256, 256, 150, 90, 4)
    runtime = PatchRuntime()
    detector = _detector(runtime)
    whole = detector.detect([frame])[0]
    sliced = SlicedDetector(detector, SlicingConfig(enabled=True))

    found = sliced.detect([frame])[0]

    assert len(whole) == 0
    assert len(found) == 1
    np.testing.assert_allclose(found.xyxy[0], [150, 90, 154, 94])
    assert runtime.batches[-1].shape[0] == 1 + len(sliced.plan((256, 256)))


def test_sliced_detector_batches_frames_tiles_and_crops_in_one_call() -> None:
    runtime = PatchRuntime()
    config = SlicingConfig(enabled=True, tile_overlap_ratio=0.0)
    sliced = SlicedDetector(_detector(runtime), config)
    # 2 px patches vanish when the whole frame shrinks (scale 1/3 and 1/2): tiles find them
    frames = [_frame_with_patch(128, 192, 100, 40, 2), _frame_with_patch(96, 128, 11, 11, 2)]
    crop = _frame_with_patch(48, 48, 20, 20, 8)  # a region crop: never sliced

    found = sliced.detect([*frames, crop], scale_up=[True, True, False])

    tiles = [len(sliced.plan((128, 192))), len(sliced.plan((96, 128)))]
    assert tiles == [6, 4]  # 2 x 3 and 2 x 2 tiles of 64 px
    assert [b.shape[0] for b in runtime.batches] == [3 + sum(tiles)]  # one runtime call
    assert [len(f) for f in found] == [1, 1, 1]
    np.testing.assert_allclose(found[0].xyxy[0], [100, 40, 102, 42])
    np.testing.assert_allclose(found[1].xyxy[0], [11, 11, 13, 13])
    np.testing.assert_allclose(found[2].xyxy[0], [20, 20, 28, 28])  # crop pixels, unscaled
    assert runtime.batches[0][-1].shape == (3, INPUT, INPUT)


def test_runtime_batch_limit_splits_into_the_fewest_calls() -> None:
    runtime = PatchRuntime(max_batch_size=4)
    config = SlicingConfig(enabled=True, tile_overlap_ratio=0.0)
    sliced = SlicedDetector(_detector(runtime), config)
    frames = [_frame_with_patch(128, 128, 10, 10, 8)] * 2  # 1 + 4 tiles each: 10 images

    sliced.detect(frames)

    assert [b.shape[0] for b in runtime.batches] == [4, 4, 2]


def test_tile_at_frame_size_keeps_native_scale_and_frames_that_fit_run_once() -> None:
    runtime = PatchRuntime()
    sliced = SlicedDetector(_detector(runtime), SlicingConfig(enabled=True))
    small = _frame_with_patch(48, 64, 5, 5, 6)

    found = sliced.detect([small])

    assert [b.shape[0] for b in runtime.batches] == [1]  # no tiles: the whole frame only
    np.testing.assert_allclose(found[0].xyxy[0], [5, 5, 11, 11], atol=1.5)


def test_disabled_slicing_passes_through_and_whole_frame_pass_can_be_off() -> None:
    runtime = PatchRuntime()
    detector = _detector(runtime)
    frame = _frame_with_patch(128, 128, 10, 10, 8)

    SlicedDetector(detector, SlicingConfig(tile_overlap_ratio=0.0)).detect([frame])
    tiles_only = SlicingConfig(enabled=True, tile_overlap_ratio=0.0, full_frame_pass=False)
    found = SlicedDetector(detector, tiles_only).detect([frame])

    assert [b.shape[0] for b in runtime.batches] == [1, 4]
    np.testing.assert_allclose(found[0].xyxy, [[10, 10, 18, 18]])


def test_too_many_tiles_fall_back_to_the_whole_frame(caplog: pytest.LogCaptureFixture) -> None:
    runtime = PatchRuntime()
    sliced = SlicedDetector(_detector(runtime), SlicingConfig(enabled=True, max_tiles_per_frame=3))

    sliced.detect([_frame_with_patch(128, 128, 10, 10, 8)])

    assert [b.shape[0] for b in runtime.batches] == [1]
    assert "max_tiles_per_frame" in caplog.text


def test_no_images_no_calls() -> None:
    runtime = PatchRuntime()
    assert SlicedDetector(_detector(runtime), SlicingConfig(enabled=True)).detect([]) == []
    assert runtime.batches == []
