"""Regions of interest for region escalation: pad, clip and merge boxes (pure geometry)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

Box = tuple[float, float, float, float]
"""`(x1, y1, x2, y2)` in source-frame pixels."""


def box_of(xyxy: npt.ArrayLike) -> Box:
    """`xyxy` (any four numbers, e.g. a track's `to_xyxy()`) as a `Box`."""
    x1, y1, x2, y2 = (float(v) for v in np.asarray(xyxy, dtype=np.float64).reshape(4))
    return x1, y1, x2, y2


def box_area(box: Box) -> float:
    """Area of `box` (0 for degenerate boxes)."""
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def iou(a: Box, b: Box) -> float:
    """Intersection over union of two boxes; 0 when both are empty."""
    inter = box_area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))
    union = box_area(a) + box_area(b) - inter
    return inter / union if union > 0.0 else 0.0


def pairwise_iou(
    boxes: npt.NDArray[np.float64], others: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """`(n, m)` IoU of xyxy rows, in float64 (the policy compares it with its thresholds on
    every frame; `detection.slicing.box_overlap` works in float32); 0 where a box is empty.
    `np.maximum` / `np.minimum` rather than `np.clip`: this runs on every frame in the loop."""
    ax1, ay1, ax2, ay2 = boxes.T
    bx1, by1, bx2, by2 = others.T
    w = np.maximum(np.minimum.outer(ax2, bx2) - np.maximum.outer(ax1, bx1), 0.0)
    h = np.maximum(np.minimum.outer(ay2, by2) - np.maximum.outer(ay1, by1), 0.0)
    inter = w * h
    union = np.add.outer(box_areas(boxes), box_areas(others)) - inter
    return np.asarray(inter / np.maximum(union, 1e-12), dtype=np.float64)


def box_areas(boxes: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Area of each xyxy row (0 for an empty box)."""
    x1, y1, x2, y2 = boxes.T
    return np.asarray(np.maximum(x2 - x1, 0.0) * np.maximum(y2 - y1, 0.0), dtype=np.float64)


def max_iou_with_another(boxes: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """For each xyxy row, its highest IoU with any other row (0 for a single box)."""
    if len(boxes) < 2:
        return np.zeros(len(boxes), dtype=np.float64)
    ious = pairwise_iou(boxes, boxes)
    np.fill_diagonal(ious, 0.0)
    return np.asarray(ious.max(axis=1), dtype=np.float64)


def pad_box(box: Box, padding_fraction: float, min_size_px: float, width: int, height: int) -> Box:
    """`box` grown by `padding_fraction` of its size on each side, at least `min_size_px` a side
    (as far as the frame allows), clipped to the `width` x `height` frame."""
    x1, y1, x2, y2 = box
    half_w = max((x2 - x1) * (0.5 + padding_fraction), min_size_px / 2.0)
    half_h = max((y2 - y1) * (0.5 + padding_fraction), min_size_px / 2.0)
    cx, cy = (x1 + x2) / 2.0, (y1 + y2) / 2.0
    return _clip((cx - half_w, cy - half_h, cx + half_w, cy + half_h), width, height)


def _clip(box: Box, width: int, height: int) -> Box:
    x1, y1, x2, y2 = box
    return (
        min(max(0.0, x1), float(width)),
        min(max(0.0, y1), float(height)),
        min(max(0.0, x2), float(width)),
        min(max(0.0, y2), float(height)),
    )


def _overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _union(a: Box, b: Box) -> Box:
    return (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))


def merge_overlapping(boxes: Iterable[Box]) -> list[Box]:
    """Replace overlapping boxes by their bounding box until none overlap; sorted by (y1, x1)."""
    merged: list[Box] = []
    for box in boxes:
        current = box
        # A union can reach boxes merged earlier, so re-scan until nothing overlaps.
        changed = True
        while changed:
            changed = False
            for index, other in enumerate(merged):
                if _overlap(current, other):
                    current = _union(current, merged.pop(index))
                    changed = True
                    break
        merged.append(current)
    return sorted(merged, key=lambda b: (b[1], b[0]))


def regions_for(
    boxes: Iterable[Box], padding_fraction: float, min_size_px: float, width: int, height: int
) -> list[Box]:
    """Padded, clipped and merged crops covering `boxes`, with integer pixel edges."""
    padded = [pad_box(b, padding_fraction, min_size_px, width, height) for b in boxes]
    snapped = [_snap(b, width, height) for b in padded]
    return [b for b in merge_overlapping(snapped) if box_area(b) > 0.0]


def _snap(box: Box, width: int, height: int) -> Box:
    """Round outwards to whole pixels so crops and their coordinates agree exactly."""
    x1, y1, x2, y2 = box
    return _clip(
        (float(math.floor(x1)), float(math.floor(y1)), float(math.ceil(x2)), float(math.ceil(y2))),
        width,
        height,
    )
