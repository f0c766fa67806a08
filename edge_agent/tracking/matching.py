"""Cost matrices and assignment for DeepSORT: IoU, appearance, gating, matching cascade.

Functions here work on plain arrays and index lists, never on tracks, so they are tested
without a tracker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

from detection.nms import box_iou
from edge_agent.tracking.kalman import CHI2INV95, FloatArray, KalmanFilter

#: Cost given to pairs that a gate rules out; any value above every `max_cost` works.
INFEASIBLE_COST = 1e5

#: `cost(track_indices, detection_indices) -> (len(track_indices), len(detection_indices))`.
CostFunction = Callable[[Sequence[int], Sequence[int]], FloatArray]


class Assignment(NamedTuple):
    """Result of one matching step, as indices into the caller's track and detection lists."""

    matches: list[tuple[int, int]]
    unmatched_tracks: list[int]
    unmatched_detections: list[int]


def iou_cost(track_xyxy: npt.ArrayLike, detection_xyxy: npt.ArrayLike) -> FloatArray:
    """`1 - IoU` between track boxes `(t, 4)` and detection boxes `(d, 4)`, shape `(t, d)`."""
    a = np.asarray(track_xyxy, dtype=np.float32).reshape(-1, 4)
    b = np.asarray(detection_xyxy, dtype=np.float32).reshape(-1, 4)
    return np.asarray(1.0 - box_iou(a, b), dtype=np.float64)


def buffered(xyxy: npt.ArrayLike, scale: float) -> FloatArray:
    """Boxes `(n, 4)` grown by `scale` times their width and height on each side (C-BIoU's
    buffered box; `scale` 0 returns them as they are)."""
    boxes = np.asarray(xyxy, dtype=np.float64).reshape(-1, 4)
    size = boxes[:, 2:] - boxes[:, :2]
    return np.concatenate([boxes[:, :2] - scale * size, boxes[:, 2:] + scale * size], axis=1)


def cosine_cost(galleries: Sequence[npt.ArrayLike], features: npt.ArrayLike) -> FloatArray:
    """Smallest cosine distance from each track's gallery `(k, d)` to each feature `(n, d)`.

    Rows are normalised here, so callers may pass raw features. A track with an empty
    gallery gets `INFEASIBLE_COST` on its whole row.
    """
    feats = _normalise(np.asarray(features, dtype=np.float64))
    cost = np.full((len(galleries), feats.shape[0]), INFEASIBLE_COST, dtype=np.float64)
    for row, gallery in enumerate(galleries):
        g = np.asarray(gallery, dtype=np.float64)
        if g.size == 0 or feats.shape[0] == 0:
            continue
        g = _normalise(g.reshape(-1, feats.shape[1]))
        cost[row] = np.min(1.0 - g @ feats.T, axis=0)
    return cost


def _normalise(rows: FloatArray) -> FloatArray:
    rows = rows.reshape(rows.shape[0], -1) if rows.ndim != 2 else rows
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.asarray(rows / np.maximum(norms, 1e-12), dtype=np.float64)


def gate_cost_matrix(
    kalman: KalmanFilter,
    cost: FloatArray,
    states: Sequence[tuple[FloatArray, FloatArray]],
    detection_xyah: npt.ArrayLike,
    only_position: bool = False,
) -> FloatArray:
    """A copy of `cost (t, d)` with pairs outside the Kalman 95 % gate set to infeasible.

    `states[i]` is the `(mean, covariance)` of row `i`; `detection_xyah (d, 4)`.
    """
    gated = np.array(cost, dtype=np.float64, copy=True)
    threshold = CHI2INV95[2 if only_position else 4]
    measurements = np.asarray(detection_xyah, dtype=np.float64).reshape(-1, 4)
    if measurements.shape[0] == 0:
        return gated
    for row, (mean, covariance) in enumerate(states):
        distance = kalman.gating_distance(mean, covariance, measurements, only_position)
        gated[row, distance > threshold] = INFEASIBLE_COST
    return gated


def linear_assignment(
    cost: npt.ArrayLike,
    max_cost: float,
    track_indices: Sequence[int] | None = None,
    detection_indices: Sequence[int] | None = None,
) -> Assignment:
    """Minimum-cost matching (Hungarian, via scipy) that rejects pairs costing over `max_cost`.

    `cost` is indexed by position in `track_indices` / `detection_indices` (default: all
    rows / columns); the result is in terms of those indices. NaN costs count as infeasible.
    """
    matrix = np.asarray(cost, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"cost must be a 2-D matrix, got shape {matrix.shape}")
    tracks = list(range(matrix.shape[0])) if track_indices is None else list(track_indices)
    dets = list(range(matrix.shape[1])) if detection_indices is None else list(detection_indices)
    if matrix.shape != (len(tracks), len(dets)):
        raise ValueError(
            f"cost has shape {matrix.shape}, expected ({len(tracks)}, {len(dets)}) "
            "from the index lists"
        )
    if not tracks or not dets:
        return Assignment([], tracks, dets)
    # Clip so the solver never sees inf/NaN, and gated pairs stay clearly over the gate.
    clipped = np.where(np.isfinite(matrix), matrix, INFEASIBLE_COST)
    clipped = np.minimum(clipped, max_cost + 1e-5)
    rows, cols = linear_sum_assignment(clipped)
    matches: list[tuple[int, int]] = []
    matched_rows: set[int] = set()
    matched_cols: set[int] = set()
    for r, c in zip(np.asarray(rows).tolist(), np.asarray(cols).tolist(), strict=True):
        if clipped[r, c] <= max_cost:
            matches.append((tracks[r], dets[c]))
            matched_rows.add(r)
            matched_cols.add(c)
    unmatched_tracks = [t for i, t in enumerate(tracks) if i not in matched_rows]
    unmatched_dets = [d for i, d in enumerate(dets) if i not in matched_cols]
    return Assignment(matches, unmatched_tracks, unmatched_dets)


def matching_cascade(
    cost_function: CostFunction,
    max_cost: float,
    cascade_depth: int,
    time_since_update: Sequence[int],
    track_indices: Sequence[int],
    detection_indices: Sequence[int],
) -> Assignment:
    """DeepSORT's cascade: tracks seen most recently pick detections first.

    `time_since_update[t]` is the frame count since track `t` was last matched (1 for a
    track matched on the previous frame, after its predict step).
    """
    unmatched_dets = list(detection_indices)
    matches: list[tuple[int, int]] = []
    for level in range(cascade_depth):
        if not unmatched_dets:
            break
        level_tracks = [t for t in track_indices if time_since_update[t] == level + 1]
        if not level_tracks:
            continue
        cost = cost_function(level_tracks, unmatched_dets)
        result = linear_assignment(cost, max_cost, level_tracks, unmatched_dets)
        matches.extend(result.matches)
        unmatched_dets = result.unmatched_detections
    matched_tracks = {t for t, _ in matches}
    unmatched_tracks = [t for t in track_indices if t not in matched_tracks]
    return Assignment(matches, unmatched_tracks, unmatched_dets)
