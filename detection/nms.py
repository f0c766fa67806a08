"""Vectorised non-maximum suppression in numpy (per class by the coordinate-offset trick)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from detection.errors import DetectionError


def box_iou(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Pairwise IoU of boxes `a (n,4)` and `b (m,4)` in xyxy; returns `(n, m)`."""
    a = np.asarray(a, dtype=np.float32).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float32).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area_a = np.prod(a[:, 2:] - a[:, :2], axis=1)
    area_b = np.prod(b[:, 2:] - b[:, :2], axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0).astype(np.float32)


def nms(
    xyxy: npt.NDArray[np.floating[Any]],
    scores: npt.NDArray[np.floating[Any]],
    iou_threshold: float,
) -> npt.NDArray[np.int64]:
    """Indices of the boxes kept by greedy NMS, highest score first.

    A box is suppressed when its IoU with a kept, higher-scoring box is strictly above
    `iou_threshold` (torchvision's rule).
    """
    if not 0.0 <= iou_threshold <= 1.0:
        raise DetectionError(f"iou_threshold must be in [0, 1], got {iou_threshold}")
    boxes = np.asarray(xyxy, dtype=np.float64).reshape(-1, 4)
    scores = np.asarray(scores, dtype=np.float32).reshape(-1)
    if boxes.shape[0] != scores.shape[0]:
        raise DetectionError(f"{boxes.shape[0]} boxes but {scores.shape[0]} scores")
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    areas = np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)
    while order.size:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        lt = np.maximum(boxes[i, :2], boxes[rest, :2])
        rb = np.minimum(boxes[i, 2:], boxes[rest, 2:])
        inter = np.prod(np.clip(rb - lt, 0, None), axis=1)
        union = areas[i] + areas[rest] - inter
        iou = np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)
        order = rest[iou <= iou_threshold]
    return np.asarray(keep, dtype=np.int64)


def batched_nms(
    xyxy: npt.NDArray[np.floating[Any]],
    scores: npt.NDArray[np.floating[Any]],
    class_ids: npt.NDArray[np.int64],
    iou_threshold: float,
) -> npt.NDArray[np.int64]:
    """Class-aware NMS: boxes of different classes never suppress each other.

    Each class is shifted to its own region of the plane so one NMS pass handles all classes.
    """
    boxes = np.asarray(xyxy, dtype=np.float64).reshape(-1, 4)
    classes = np.asarray(class_ids, dtype=np.int64).reshape(-1)
    if boxes.shape[0] != classes.shape[0]:
        raise DetectionError(f"{boxes.shape[0]} boxes but {classes.shape[0]} class ids")
    if boxes.shape[0] == 0:
        return np.empty(0, dtype=np.int64)
    # float64: a large offset must not eat the precision of the coordinates
    span = float(np.abs(boxes).max()) + 1.0
    shifted = boxes.astype(np.float64) + (classes.astype(np.float64) * span * 2.0)[:, None]
    return nms(shifted, scores, iou_threshold)
