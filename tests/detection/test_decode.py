"""YOLO output decoding: layout detection, both layouts, box units, thresholds, bad outputs."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from detection import OutputLayout, UnknownOutputLayoutError, decode_yolo, detect_layout
from detection.errors import DetectionError

INPUT_HW = (320, 480)


def _anchor_free(rows: list[list[float]], n_classes: int) -> npt.NDArray[np.float32]:
    """(1, 4+C, N) from rows of `cx, cy, w, h, class scores...`, padded with empty anchors."""
    out = np.zeros((1, 4 + n_classes, 64), dtype=np.float32)
    for i, row in enumerate(rows):
        out[0, :, i] = row
    return out


def _yolov5(rows: list[list[float]], n_classes: int) -> npt.NDArray[np.float32]:
    """(1, N, 5+C) from rows of `cx, cy, w, h, objectness, class scores...`."""
    out = np.zeros((1, 64, 5 + n_classes), dtype=np.float32)
    for i, row in enumerate(rows):
        out[0, i] = row
    return out


@pytest.mark.parametrize(
    ("shape", "num_classes", "layout"),
    [
        ((1, 84, 8400), None, OutputLayout.ANCHOR_FREE),
        ((4, 7, 2100), None, OutputLayout.ANCHOR_FREE),
        ((1, 25200, 85), None, OutputLayout.YOLOV5),
        ((2, 6300, 8), None, OutputLayout.YOLOV5),
        ((1, 84, 8400), 80, OutputLayout.ANCHOR_FREE),
        ((1, 25200, 85), 80, OutputLayout.YOLOV5),
    ],
)
def test_layout_detection(
    shape: tuple[int, ...], num_classes: int | None, layout: OutputLayout
) -> None:
    assert detect_layout(shape, num_classes) is layout


@pytest.mark.parametrize(
    ("shape", "num_classes", "message"),
    [
        ((84, 8400), None, "must be 3-D"),
        ((1, 2, 3, 4), None, "must be 3-D"),
        ((1, 10, 10), None, "cannot tell the layout"),
        ((1, 4, 3), None, "cannot tell the layout"),
        ((1, 84, 8400), 3, "fits neither"),
    ],
)
def test_unknown_layouts_are_rejected(
    shape: tuple[int, ...], num_classes: int | None, message: str
) -> None:
    with pytest.raises(UnknownOutputLayoutError, match=message):
        detect_layout(shape, num_classes)


def test_anchor_free_pixels() -> None:
    out = _anchor_free([[100, 50, 20, 10, 0.1, 0.9, 0.0], [10, 10, 4, 4, 0.2, 0.1, 0.1]], 3)
    (dets,) = decode_yolo(out, INPUT_HW, confidence_threshold=0.25)
    assert dets.xyxy.tolist() == [[90, 45, 110, 55]]
    assert dets.class_id.tolist() == [1]
    assert dets.confidence.tolist() == pytest.approx([0.9])


def test_anchor_free_normalised_boxes_are_scaled_by_input_size() -> None:
    out = _anchor_free([[0.5, 0.5, 0.1, 0.2, 0.0, 0.0, 0.8]], 3)
    for units in ("auto", "normalized"):
        (dets,) = decode_yolo(out, INPUT_HW, 0.25, box_units=units)  # type: ignore[arg-type]
        np.testing.assert_allclose(dets.xyxy, [[216, 128, 264, 192]])
    (as_pixels,) = decode_yolo(out, INPUT_HW, 0.25, box_units="pixels")
    np.testing.assert_allclose(as_pixels.xyxy, [[0.45, 0.4, 0.55, 0.6]], rtol=1e-6)


def test_yolov5_score_is_objectness_times_class_score() -> None:
    rows = [
        [100, 100, 40, 20, 0.5, 0.2, 0.9],  # 0.45 -> kept, class 1
        [200, 100, 40, 20, 0.3, 0.9, 0.1],  # 0.27 -> kept at 0.25
        [300, 100, 40, 20, 0.2, 0.9, 0.9],  # 0.18 -> dropped
    ]
    (dets,) = decode_yolo(_yolov5(rows, 2), INPUT_HW, 0.25)
    assert dets.class_id.tolist() == [1, 0]
    assert dets.confidence.tolist() == pytest.approx([0.45, 0.27])
    assert dets.xyxy[0].tolist() == [80, 90, 120, 110]


def test_batch_gives_one_result_per_image_and_drops_non_finite_rows() -> None:
    out = np.concatenate(
        [
            _anchor_free([[50, 50, 10, 10, 0.9]], 1),
            _anchor_free([[np.nan, 50, 10, 10, 0.9], [60, 60, 10, 10, 0.8]], 1),
            _anchor_free([], 1),
        ]
    )
    results = decode_yolo(out, INPUT_HW, 0.25)
    assert [len(r) for r in results] == [1, 1, 0]
    assert results[1].xyxy.tolist() == [[55, 55, 65, 65]]


def test_negative_sizes_become_empty_boxes_not_errors() -> None:
    (dets,) = decode_yolo(_anchor_free([[50, 50, -10, 10, 0.9]], 1), INPUT_HW, 0.25)
    assert dets.xyxy.tolist() == [[50, 45, 50, 55]]


def test_threshold_out_of_range() -> None:
    with pytest.raises(DetectionError, match="confidence_threshold"):
        decode_yolo(_anchor_free([], 1), INPUT_HW, 1.5)
