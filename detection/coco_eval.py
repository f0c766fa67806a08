"""COCO-style detection metrics in pure numpy: per-class AP at IoU 0.50:0.05:0.95, mAP, recall.

Follows `pycocotools.COCOeval` (bbox, `useCats=1`) step for step, so the numbers agree with it:
- per image and class, predictions sorted by score (stable) and cut to `max_detections`;
- greedy matching in score order, each ground-truth box at most once, to the unmatched box of
  highest IoU >= the threshold; non-ignored boxes are preferred over ignored ones;
- a prediction matched to an ignored box is neither a true nor a false positive; in an area range,
  ground truth outside it is ignored, and so are unmatched predictions outside it;
- AP is the mean of the interpolated precision at the 101 recall points 0, 0.01, ..., 1;
- classes without (non-ignored) ground truth are left out of the means, as COCO does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from detection.errors import DetectionError

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

COCO_IOU_THRESHOLDS: tuple[float, ...] = tuple(float(t) for t in np.linspace(0.5, 0.95, 10))
RECALL_POINTS = np.linspace(0.0, 1.0, 101)
SMALL_AREA_PX2 = 32.0**2  # COCO "small": area <= 32² (inclusive in COCO's code)
_ALL_AREAS = (0.0, 1e10)  # COCO's "all" range


class MetricsError(DetectionError, ValueError):
    """Inputs to the metrics do not fit together (lengths, shapes, parameters)."""


@dataclass(frozen=True, eq=False)
class GroundTruth:
    """Labelled boxes of one image: `xyxy (n,4)` in the image's pixels, `class_id (n,)`, and
    `ignore (n,)` marking boxes (e.g. low visibility) that count neither as hits nor as misses."""

    xyxy: npt.NDArray[np.float32]
    class_id: npt.NDArray[np.int64]
    ignore: BoolArray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    def __post_init__(self) -> None:
        xyxy = np.asarray(self.xyxy, dtype=np.float32)
        if xyxy.size == 0:
            xyxy = xyxy.reshape(0, 4)
        if xyxy.ndim != 2 or xyxy.shape[1] != 4:
            raise MetricsError(f"ground truth xyxy must have shape (n, 4), got {xyxy.shape}")
        n = xyxy.shape[0]
        class_id = np.asarray(self.class_id).reshape(-1).astype(np.int64)
        ignore = np.asarray(self.ignore, dtype=bool).reshape(-1)
        if ignore.size == 0 and n:
            ignore = np.zeros(n, dtype=bool)
        if class_id.shape != (n,) or ignore.shape != (n,):
            raise MetricsError(
                f"ground truth class_id and ignore must have shape ({n},), "
                f"got {class_id.shape} and {ignore.shape}"
            )
        if not np.all(np.isfinite(xyxy)) or np.any(xyxy[:, 2:] < xyxy[:, :2]):
            raise MetricsError("ground truth boxes must be finite with x2 >= x1 and y2 >= y1")
        if np.any(class_id < 0):
            raise MetricsError("ground truth class_id must be >= 0")
        object.__setattr__(self, "xyxy", xyxy)
        object.__setattr__(self, "class_id", class_id)
        object.__setattr__(self, "ignore", ignore)

    def __len__(self) -> int:
        return int(self.xyxy.shape[0])

    @property
    def area(self) -> FloatArray:
        """Box areas in square pixels (float64, as COCO computes them)."""
        wh = self.xyxy[:, 2:].astype(np.float64) - self.xyxy[:, :2].astype(np.float64)
        return wh[:, 0] * wh[:, 1]


@dataclass(frozen=True)
class ClassMetrics:
    """One class: AP over IoU 0.50:0.95 and at 0.50, recall at the score threshold (IoU 0.5).

    AP values are NaN for a class without non-ignored ground truth (COCO leaves it out)."""

    class_id: int
    name: str
    num_gt: int
    num_predictions: int
    ap50_95: float
    ap50: float
    recall: float


@dataclass(frozen=True)
class AreaMetrics:
    """The summary over one area range (all boxes, or small ones only)."""

    map50_95: float
    map50: float
    recall: float  # at the score threshold and IoU 0.5, over all non-ignored boxes
    num_gt: int


@dataclass(frozen=True)
class MetricsResult:
    """Detection metrics over a dataset; `overall` for all boxes, `small` for small ones."""

    overall: AreaMetrics
    small: AreaMetrics
    per_class: tuple[ClassMetrics, ...]
    num_images: int
    score_threshold: float
    small_area_px2: float
    max_detections: int

    @property
    def map50_95(self) -> float:
        """mAP over IoU 0.50:0.05:0.95 (COCO's AP)."""
        return self.overall.map50_95

    @property
    def map50(self) -> float:
        """mAP at IoU 0.50."""
        return self.overall.map50

    def table(self) -> str:
        """A markdown table: one row per class with ground truth or predictions, then totals."""
        lines = [
            f"| class | GT | predictions | AP50-95 | AP50 | recall@{self.score_threshold:g} |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for c in self.per_class:
            lines.append(
                f"| {c.name} | {c.num_gt} | {c.num_predictions} | {_fmt(c.ap50_95)} "
                f"| {_fmt(c.ap50)} | {_fmt(c.recall)} |"
            )
        total_predictions = sum(c.num_predictions for c in self.per_class)
        for label, area, predictions in (
            ("**all**", self.overall, str(total_predictions)),
            (f"**small** (area <= {self.small_area_px2:g} px²)", self.small, ""),
        ):
            lines.append(
                f"| {label} | {area.num_gt} | {predictions} | {_fmt(area.map50_95)} "
                f"| {_fmt(area.map50)} | {_fmt(area.recall)} |"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (NaN as None)."""

        def clean(value: float) -> float | None:
            return None if math.isnan(value) else value

        def area(a: AreaMetrics) -> dict[str, Any]:
            return {
                "map50_95": clean(a.map50_95),
                "map50": clean(a.map50),
                "recall": clean(a.recall),
                "num_gt": a.num_gt,
            }

        return {
            "overall": area(self.overall),
            "small": area(self.small),
            "per_class": [
                {
                    "class_id": c.class_id,
                    "name": c.name,
                    "num_gt": c.num_gt,
                    "num_predictions": c.num_predictions,
                    "ap50_95": clean(c.ap50_95),
                    "ap50": clean(c.ap50),
                    "recall": clean(c.recall),
                }
                for c in self.per_class
            ],
            "num_images": self.num_images,
            "score_threshold": self.score_threshold,
            "small_area_px2": self.small_area_px2,
            "max_detections": self.max_detections,
        }


def _fmt(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.4f}"


def box_iou_coco(
    dt: npt.NDArray[np.floating[Any]], gt: npt.NDArray[np.floating[Any]]
) -> FloatArray:
    """IoU `(len(dt), len(gt))` of xyxy boxes in float64, as COCO's `bbIou` (no crowd)."""
    dt = np.asarray(dt, dtype=np.float64)
    gt = np.asarray(gt, dtype=np.float64)
    w = np.minimum(dt[:, None, 2], gt[None, :, 2]) - np.maximum(dt[:, None, 0], gt[None, :, 0])
    h = np.minimum(dt[:, None, 3], gt[None, :, 3]) - np.maximum(dt[:, None, 1], gt[None, :, 1])
    inter = np.clip(w, 0, None) * np.clip(h, 0, None)
    area_dt = (dt[:, 2] - dt[:, 0]) * (dt[:, 3] - dt[:, 1])
    area_gt = (gt[:, 2] - gt[:, 0]) * (gt[:, 3] - gt[:, 1])
    union = area_dt[:, None] + area_gt[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(union > 0, inter / union, 0.0)
    return np.asarray(iou, dtype=np.float64)


@dataclass
class _Matches:
    """Per-class accumulation over images for one area range: scores, TP and ignore masks."""

    scores: list[FloatArray] = field(default_factory=list)
    tp: list[BoolArray] = field(default_factory=list)  # (T, n)
    ignored: list[BoolArray] = field(default_factory=list)  # (T, n)
    num_gt: int = 0


def _best(candidates: FloatArray) -> tuple[int, float]:
    """Index and value of the maximum, the last index on ties (COCO's loop replaces on `>=`)."""
    reverse = candidates[::-1]
    j = int(np.argmax(reverse))
    return len(candidates) - 1 - j, float(reverse[j])


def _match_image(
    iou: FloatArray, gt_ignore: BoolArray, thresholds: FloatArray
) -> tuple[BoolArray, BoolArray]:
    """Greedy COCO matching of score-sorted predictions (rows of `iou`) to ground truth.

    `gt_ignore` must already be sorted with non-ignored boxes first, as COCO sorts them.
    Returns `matched (T, n)` and `matched_to_ignored (T, n)`.
    """
    n_dt, n_gt = iou.shape
    n_t = len(thresholds)
    matched = np.zeros((n_t, n_dt), dtype=bool)
    to_ignored = np.zeros((n_t, n_dt), dtype=bool)
    if n_gt == 0 or n_dt == 0:
        return matched, to_ignored
    taken = np.zeros((n_t, n_gt), dtype=bool)
    limits = np.minimum(thresholds, 1 - 1e-10)
    regular = ~gt_ignore
    for t in range(n_t):
        for d in range(n_dt):
            ok = (~taken[t]) & (iou[d] >= limits[t])
            if not ok.any():
                continue
            pick = -1
            if np.any(ok & regular):
                pick, _ = _best(np.where(ok & regular, iou[d], -np.inf))
            else:
                pick, _ = _best(np.where(ok, iou[d], -np.inf))
            taken[t, pick] = True
            matched[t, d] = True
            to_ignored[t, d] = bool(gt_ignore[pick])
    return matched, to_ignored


def _average_precision(
    scores: FloatArray, tp: BoolArray, ignored: BoolArray, num_gt: int
) -> tuple[FloatArray, FloatArray]:
    """Per IoU threshold: 101-point interpolated AP and final recall (COCO's `accumulate`)."""
    n_t = tp.shape[0]
    ap = np.zeros(n_t)
    final_recall = np.zeros(n_t)
    order = np.argsort(-scores, kind="mergesort")
    tp = tp[:, order]
    ignored = ignored[:, order]
    tps = np.cumsum(tp & ~ignored, axis=1, dtype=np.float64)
    fps = np.cumsum(~tp & ~ignored, axis=1, dtype=np.float64)
    for t in range(n_t):
        if tps.shape[1] == 0:
            continue
        recall = tps[t] / num_gt
        precision = tps[t] / (fps[t] + tps[t] + np.spacing(1))
        final_recall[t] = recall[-1]
        envelope = np.maximum.accumulate(precision[::-1])[::-1]
        index = np.searchsorted(recall, RECALL_POINTS, side="left")
        valid = index < len(envelope)
        sampled = np.zeros(len(RECALL_POINTS))
        sampled[valid] = envelope[index[valid]]
        ap[t] = sampled.mean()
    return ap, final_recall


def _check_inputs(
    ground_truth: Sequence[GroundTruth],
    predictions: Sequence[Detections],
    iou_thresholds: Sequence[float],
    max_detections: int,
) -> None:
    if len(ground_truth) != len(predictions):
        raise MetricsError(
            f"need one prediction batch per image: {len(ground_truth)} ground-truth images, "
            f"{len(predictions)} predictions"
        )
    if not iou_thresholds or any(not 0.0 < t <= 1.0 for t in iou_thresholds):
        raise MetricsError(f"iou_thresholds must be non-empty, in (0, 1]; got {iou_thresholds}")
    if 0.5 not in [round(t, 10) for t in iou_thresholds]:
        raise MetricsError(f"iou_thresholds must include 0.5 (for mAP50); got {iou_thresholds}")
    if max_detections < 1:
        raise MetricsError(f"max_detections must be >= 1, got {max_detections}")


def _accumulate(
    ground_truth: Sequence[GroundTruth],
    predictions: Sequence[Detections],
    thresholds: FloatArray,
    max_detections: int,
    area_range: tuple[float, float],
) -> dict[int, _Matches]:
    """Match every image and class; gather what `_average_precision` needs, per class."""
    low, high = area_range
    per_class: dict[int, _Matches] = {}
    for gt, dt in zip(ground_truth, predictions, strict=True):
        gt_area = gt.area
        dt_xyxy = dt.xyxy.astype(np.float64)
        dt_area = (dt_xyxy[:, 2] - dt_xyxy[:, 0]) * (dt_xyxy[:, 3] - dt_xyxy[:, 1])
        for c in np.union1d(gt.class_id, dt.class_id).tolist():
            g = np.flatnonzero(gt.class_id == c)
            g_ignore = gt.ignore[g] | (gt_area[g] < low) | (gt_area[g] > high)
            g = g[np.argsort(g_ignore, kind="mergesort")]  # non-ignored first, as COCO
            g_ignore = np.sort(g_ignore, kind="mergesort")
            d = np.flatnonzero(dt.class_id == c)
            d = d[np.argsort(-dt.confidence[d], kind="mergesort")][:max_detections]
            iou = box_iou_coco(dt_xyxy[d], gt.xyxy[g])
            matched, to_ignored = _match_image(iou, g_ignore, thresholds)
            outside = (dt_area[d] < low) | (dt_area[d] > high)
            acc = per_class.setdefault(int(c), _Matches())
            acc.scores.append(dt.confidence[d].astype(np.float64))
            acc.tp.append(matched)
            acc.ignored.append(to_ignored | (~matched & outside[None, :]))
            acc.num_gt += int(np.count_nonzero(~g_ignore))
    return per_class


@dataclass(frozen=True)
class _ClassScores:
    ap50_95: float
    ap50: float
    recall: float
    num_gt: int
    num_predictions: int


def _score_classes(
    per_class: dict[int, _Matches], thresholds: FloatArray, score_threshold: float
) -> dict[int, _ClassScores]:
    i50 = int(np.argmin(np.abs(thresholds - 0.5)))
    out: dict[int, _ClassScores] = {}
    for c, acc in per_class.items():
        scores = np.concatenate(acc.scores) if acc.scores else np.zeros(0)
        n_pred = len(scores)
        if acc.num_gt == 0:
            out[c] = _ClassScores(math.nan, math.nan, math.nan, 0, n_pred)
            continue
        n_t = len(thresholds)
        tp = np.concatenate(acc.tp, axis=1) if acc.tp else np.zeros((n_t, 0), bool)
        ignored = np.concatenate(acc.ignored, axis=1) if acc.ignored else np.zeros((n_t, 0), bool)
        ap, _ = _average_precision(scores, tp, ignored, acc.num_gt)
        # greedy matching runs in score order, so the matches of the boxes above a score
        # threshold are those of the full run
        hits = tp[i50] & ~ignored[i50] & (scores >= score_threshold)
        recall = float(np.count_nonzero(hits)) / acc.num_gt
        out[c] = _ClassScores(float(ap.mean()), float(ap[i50]), recall, acc.num_gt, n_pred)
    return out


def _summary(scores: dict[int, _ClassScores]) -> AreaMetrics:
    valid = [s for s in scores.values() if s.num_gt > 0]
    num_gt = sum(s.num_gt for s in valid)
    if not valid:
        return AreaMetrics(math.nan, math.nan, math.nan, 0)
    return AreaMetrics(
        map50_95=float(np.mean([s.ap50_95 for s in valid])),
        map50=float(np.mean([s.ap50 for s in valid])),
        recall=sum(s.recall * s.num_gt for s in valid) / num_gt,
        num_gt=num_gt,
    )


def compute_metrics(
    ground_truth: Sequence[GroundTruth],
    predictions: Sequence[Detections],
    *,
    class_names: Sequence[str] = (),
    score_threshold: float = 0.25,
    small_area_px2: float = SMALL_AREA_PX2,
    max_detections: int = 100,
    iou_thresholds: Sequence[float] = COCO_IOU_THRESHOLDS,
) -> MetricsResult:
    """COCO-style metrics of `predictions` against `ground_truth` (one entry per image).

    `max_detections` caps predictions per image and class (COCO's `maxDets`); `score_threshold`
    sets the operating point of the recall; small objects have area <= `small_area_px2`, in the
    evaluated image's pixels.
    """
    _check_inputs(ground_truth, predictions, iou_thresholds, max_detections)
    if small_area_px2 <= 0:
        raise MetricsError(f"small_area_px2 must be > 0, got {small_area_px2}")
    thresholds = np.asarray(iou_thresholds, dtype=np.float64)
    overall = _score_classes(
        _accumulate(ground_truth, predictions, thresholds, max_detections, _ALL_AREAS),
        thresholds,
        score_threshold,
    )
    small = _score_classes(
        _accumulate(ground_truth, predictions, thresholds, max_detections, (0.0, small_area_px2)),
        thresholds,
        score_threshold,
    )
    per_class = tuple(
        ClassMetrics(
            class_id=c,
            name=class_names[c] if c < len(class_names) else str(c),
            num_gt=s.num_gt,
            num_predictions=s.num_predictions,
            ap50_95=s.ap50_95,
            ap50=s.ap50,
            recall=s.recall,
        )
        for c, s in sorted(overall.items())
    )
    return MetricsResult(
        overall=_summary(overall),
        small=_summary(small),
        per_class=per_class,
        num_images=len(ground_truth),
        score_threshold=score_threshold,
        small_area_px2=small_area_px2,
        max_detections=max_detections,
    )


@dataclass(frozen=True)
class Agreement:
    """How well predictions agree with a reference at one operating point (IoU match).

    Used where the reference is another model's output rather than hand labels (the edge-cloud
    literature's method for real footage): recall = share of reference boxes found.
    """

    true_positives: int
    false_positives: int
    false_negatives: int

    @property
    def recall(self) -> float:
        """Matched reference boxes / reference boxes (NaN without reference boxes)."""
        total = self.true_positives + self.false_negatives
        return self.true_positives / total if total else math.nan

    @property
    def precision(self) -> float:
        """Matched predictions / predictions (NaN without predictions)."""
        total = self.true_positives + self.false_positives
        return self.true_positives / total if total else math.nan

    @property
    def f1(self) -> float:
        """Harmonic mean of precision and recall (NaN when either is undefined)."""
        p, r = self.precision, self.recall
        if math.isnan(p) or math.isnan(r):
            return math.nan
        return 0.0 if p + r == 0 else 2 * p * r / (p + r)

    def __add__(self, other: Agreement) -> Agreement:
        return Agreement(
            self.true_positives + other.true_positives,
            self.false_positives + other.false_positives,
            self.false_negatives + other.false_negatives,
        )


def agreement(
    reference: Sequence[Detections],
    predictions: Sequence[Detections],
    *,
    classes: Sequence[int] | None = None,
    iou_threshold: float = 0.5,
) -> Agreement:
    """Count matches of `predictions` to `reference` per image, class-aware, greedy by score.

    Both sides are taken as they are (filter by score before calling); `classes` restricts the
    count to those class ids on both sides.
    """
    if len(reference) != len(predictions):
        raise MetricsError(
            f"reference and predictions must have one entry per image, got {len(reference)} "
            f"and {len(predictions)}"
        )
    if not 0.0 < iou_threshold <= 1.0:
        raise MetricsError(f"iou_threshold must be in (0, 1], got {iou_threshold}")
    tp = fp = fn = 0
    for ref, pred in zip(reference, predictions, strict=True):
        wanted = set(ref.class_id.tolist()) | set(pred.class_id.tolist())
        if classes is not None:
            wanted &= set(classes)
        for c in wanted:
            ref_boxes = ref.xyxy[ref.class_id == c]
            mask = pred.class_id == c
            order = np.argsort(-pred.confidence[mask], kind="stable")
            pred_boxes = pred.xyxy[mask][order]
            iou = (
                box_iou_coco(pred_boxes, ref_boxes) if len(ref_boxes) and len(pred_boxes) else None
            )
            matched, _ = (
                _match_image(iou, np.zeros(len(ref_boxes), dtype=bool), np.array([iou_threshold]))
                if iou is not None
                else (np.zeros((1, len(pred_boxes)), dtype=bool), None)
            )
            hits = int(matched[0].sum())
            tp += hits
            fp += len(pred_boxes) - hits
            fn += len(ref_boxes) - hits
    return Agreement(tp, fp, fn)
