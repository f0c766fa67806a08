"""Hand-verified truth for the real clips (`bench/data/truth/*.json`) and scoring against it.

The truth files are described in `bench/data/truth/README.md`: per clip, the frames that were
checked by eye (a frame listed with no boxes was checked and holds nothing), each box with its
class (`person`, `bicycle`, `car`, `motorcycle`, `bus`, `truck`, or `ignore` for a region that
cannot be resolved) and its flags `small`, `occluded` and `far`.

Scoring is COCO-style at one IoU (0.5 by default), per class group (`person`; `vehicles`:
bicycle, car, motorcycle, bus, truck):
- per frame, detections of the group in descending confidence each take the unmatched truth box of
  the group with the highest IoU >= the threshold (class-agnostic inside a group: a van called
  `truck` by the model and `car` by the truth is still found);
- an unmatched detection lying mostly inside an `ignore` region (intersection over the detection's
  area >= `IGNORE_COVERAGE`) counts neither as a true nor as a false positive, as COCO treats crowd
  regions; a duplicate on a matched box stays a false positive;
- AP50 is the mean interpolated precision at the 101 recall points 0, 0.01, ..., 1 (COCO's), over
  every scored frame's detections pooled in confidence order;
- recall is also given for the truth boxes carrying each flag (`small`, `occluded`, `far`).

Pure logic and a JSON reader (the standard library's `json`, a well-kept parser; the structure is
validated here with messages that name the file, frame and box).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.harness import BENCH_DIR
from detection.detections import Detections

TRUTH_DIR = BENCH_DIR / "data" / "truth"
OBJECT_CLASSES: tuple[str, ...] = ("person", "bicycle", "car", "motorcycle", "bus", "truck")
IGNORE = "ignore"
FLAGS: tuple[str, ...] = ("small", "occluded", "far")
SOURCES: tuple[str, ...] = ("proposal", "adjusted", "added")
GROUPS: dict[str, tuple[str, ...]] = {
    "person": ("person",),
    "vehicles": ("bicycle", "car", "motorcycle", "bus", "truck"),
}
MATCH_IOU = 0.5
# `small`: a box less than this tall in frame pixels (the size at which the edge's 320x416 input
# leaves a person about 20 px tall on vtest's 768x576 frames, where NanoDet's recall falls off).
SMALL_HEIGHT_PX = 50.0
# An unmatched detection this much inside an ignore region is not a false positive.
IGNORE_COVERAGE = 0.5
_RECALL_POINTS = np.linspace(0.0, 1.0, 101)

FloatArray = npt.NDArray[np.float64]


class TruthError(ValueError):
    """A truth file is missing, unreadable or malformed; the message names where."""


@dataclass(frozen=True)
class TruthBox:
    """One verified box: `xyxy` in frame pixels, its class (or `ignore`), flags, provenance."""

    xyxy: tuple[float, float, float, float]
    label: str
    small: bool = False
    occluded: bool = False
    far: bool = False
    source: str = "proposal"

    def flagged(self, flag: str) -> bool:
        """Whether the box carries `flag` (one of `FLAGS`)."""
        return bool(getattr(self, flag))


@dataclass(frozen=True)
class ClipTruth:
    """The verified frames of one clip: frame index -> its boxes (empty: checked, nothing)."""

    clip: str
    width: int
    height: int
    frames: dict[int, tuple[TruthBox, ...]]
    path: Path | None = None

    def boxes(self, label: str | None = None) -> int:
        """How many boxes (of `label`, or all but `ignore`) the truth holds."""
        return sum(
            1
            for boxes in self.frames.values()
            for b in boxes
            if (b.label == label if label is not None else b.label != IGNORE)
        )


def _fail(where: str, what: str) -> TruthError:
    return TruthError(f"{where}: {what}")


def _box(raw: Any, where: str, width: int, height: int) -> TruthBox:
    if not isinstance(raw, dict):
        raise _fail(where, f"a box must be an object, got {type(raw).__name__}")
    unknown = set(raw) - {"xyxy", "class", "source", *FLAGS}
    if unknown:
        raise _fail(where, f"unknown keys {sorted(unknown)}")
    xyxy = raw.get("xyxy")
    if (
        not isinstance(xyxy, list)
        or len(xyxy) != 4
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in xyxy)
    ):
        raise _fail(where, f"xyxy must be 4 numbers, got {xyxy!r}")
    x1, y1, x2, y2 = (float(v) for v in xyxy)
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)) or x2 <= x1 or y2 <= y1:
        raise _fail(where, f"xyxy must be finite with x2 > x1 and y2 > y1, got {xyxy}")
    if x1 < -1 or y1 < -1 or x2 > width + 1 or y2 > height + 1:
        raise _fail(where, f"xyxy {xyxy} lies outside the {width}x{height} frame")
    label = raw.get("class")
    if label not in (*OBJECT_CLASSES, IGNORE):
        raise _fail(where, f"class must be one of {[*OBJECT_CLASSES, IGNORE]}, got {label!r}")
    flags = {}
    for flag in FLAGS:
        value = raw.get(flag, False)
        if not isinstance(value, bool):
            raise _fail(where, f"{flag} must be true or false, got {value!r}")
        flags[flag] = value
    source = raw.get("source", "proposal")
    if source not in SOURCES:
        raise _fail(where, f"source must be one of {list(SOURCES)}, got {source!r}")
    return TruthBox((x1, y1, x2, y2), str(label), source=str(source), **flags)


def parse_truth(document: Any, where: str = "truth") -> ClipTruth:
    """A `ClipTruth` from a decoded truth document; `TruthError` naming the bad part."""
    if not isinstance(document, dict):
        raise _fail(where, "the document must be a JSON object")
    clip = document.get("clip")
    if not isinstance(clip, str) or not clip:
        raise _fail(where, "`clip` must be a non-empty string")
    size = document.get("frame_size")
    if (
        not isinstance(size, list)
        or len(size) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)
    ):
        raise _fail(where, f"`frame_size` must be [width, height] in pixels, got {size!r}")
    width, height = int(size[0]), int(size[1])
    frames = document.get("frames")
    if not isinstance(frames, dict) or not frames:
        raise _fail(where, "`frames` must be a non-empty object: frame index -> list of boxes")
    parsed: dict[int, tuple[TruthBox, ...]] = {}
    for key, boxes in frames.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise _fail(where, f"frame key {key!r} is not a frame index (0, 1, ...)")
        if not isinstance(boxes, list):
            raise _fail(f"{where}, frame {key}", "must be a list of boxes")
        parsed[int(key)] = tuple(
            _box(raw, f"{where}, frame {key}, box {i}", width, height)
            for i, raw in enumerate(boxes)
        )
    return ClipTruth(clip, width, height, dict(sorted(parsed.items())))


def load_truth(path: Path) -> ClipTruth:
    """Read and validate one truth file; `TruthError` when it is missing or malformed."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TruthError(f"cannot read the truth file {path}: {exc.strerror or exc}") from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TruthError(f"{path}: not valid JSON ({exc})") from exc
    truth = parse_truth(document, str(path))
    return ClipTruth(truth.clip, truth.width, truth.height, truth.frames, path)


def clip_truth(clip: str, directory: Path = TRUTH_DIR) -> ClipTruth | None:
    """The truth of `clip` (`<directory>/<clip>.json`), or None where the clip has none."""
    path = directory / f"{clip}.json"
    return load_truth(path) if path.is_file() else None


def restricted(truth: ClipTruth, indices: Iterable[int]) -> ClipTruth:
    """The truth on those of its frames that are among `indices` (the frames a bench read)."""
    keep = set(indices)
    frames = {i: boxes for i, boxes in truth.frames.items() if i in keep}
    return ClipTruth(truth.clip, truth.width, truth.height, frames, truth.path)


def _iou(a: FloatArray, b: FloatArray) -> FloatArray:
    """IoU matrix (len(a), len(b)) of xyxy boxes."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0.0, None), axis=2)
    area_a = np.prod(a[:, 2:] - a[:, :2], axis=1)
    area_b = np.prod(b[:, 2:] - b[:, :2], axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    out: FloatArray = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    return out


def _inside(a: FloatArray, regions: FloatArray) -> FloatArray:
    """Share of each box of `a` covered by each region (intersection over a's area)."""
    lt = np.maximum(a[:, None, :2], regions[None, :, :2])
    rb = np.minimum(a[:, None, 2:], regions[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0.0, None), axis=2)
    area = np.prod(a[:, 2:] - a[:, :2], axis=1)[:, None]
    out: FloatArray = np.divide(inter, area, out=np.zeros_like(inter), where=area > 0)
    return out


@dataclass
class Tally:
    """Matches of one class group, summable over frames and clips."""

    truth: int = 0
    ignored: int = 0  # detections inside ignore regions, not counted
    scores: list[float] = field(default_factory=list)  # counted detections, confidence
    hits: list[bool] = field(default_factory=list)  # ... and whether each was a true positive
    flagged: dict[str, list[int]] = field(
        default_factory=lambda: {f: [0, 0] for f in FLAGS}
    )  # flag -> [found, total]

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.truth + other.truth,
            self.ignored + other.ignored,
            self.scores + other.scores,
            self.hits + other.hits,
            {f: [a + b for a, b in zip(self.flagged[f], other.flagged[f], strict=True)]
             for f in FLAGS},
        )  # fmt: skip

    @property
    def true_positives(self) -> int:
        """Detections matched to a truth box."""
        return int(sum(self.hits))

    @property
    def false_positives(self) -> int:
        """Counted detections that matched nothing."""
        return len(self.hits) - self.true_positives

    @property
    def recall(self) -> float:
        """Truth boxes found / truth boxes (NaN without truth)."""
        return self.true_positives / self.truth if self.truth else math.nan

    @property
    def precision(self) -> float:
        """True positives / counted detections (NaN without detections)."""
        return self.true_positives / len(self.hits) if self.hits else math.nan

    @property
    def f1(self) -> float:
        """2TP / (2TP + FP + FN); 0 when either side has boxes and none match, NaN when neither."""
        total = len(self.hits) + self.truth
        return 2 * self.true_positives / total if total else math.nan

    @property
    def ap50(self) -> float:
        """COCO's 101-point interpolated average precision (NaN without truth boxes)."""
        if not self.truth:
            return math.nan
        if not self.hits:
            return 0.0
        order = np.argsort(-np.asarray(self.scores, dtype=np.float64), kind="stable")
        hits = np.asarray(self.hits, dtype=np.float64)[order]
        tp = np.cumsum(hits)
        precision = tp / np.arange(1, len(hits) + 1)
        recall = tp / self.truth
        # precision envelope: best precision at any recall at or above each point
        envelope = np.maximum.accumulate(precision[::-1])[::-1]
        at = np.searchsorted(recall, _RECALL_POINTS, side="left")
        sampled = np.where(at < len(envelope), envelope[np.minimum(at, len(envelope) - 1)], 0.0)
        return float(np.mean(sampled))

    def flag_recall(self, flag: str) -> float:
        """Recall over the truth boxes carrying `flag` (NaN where none does)."""
        found, total = self.flagged[flag]
        return found / total if total else math.nan


def _score_frame(
    truth: Sequence[TruthBox],
    found: Detections,
    names: Sequence[str],
    members: tuple[str, ...],
    iou_threshold: float,
) -> Tally:
    gt = [b for b in truth if b.label in members]
    regions = np.asarray([b.xyxy for b in truth if b.label == IGNORE], dtype=np.float64)
    ids = [i for i, n in enumerate(names) if n in members]
    keep = np.isin(found.class_id, ids)
    boxes = found.xyxy[keep].astype(np.float64).reshape(-1, 4)
    scores = found.confidence[keep].astype(np.float64)
    order = np.argsort(-scores, kind="stable")
    boxes, scores = boxes[order], scores[order]
    gt_xyxy = np.asarray([b.xyxy for b in gt], dtype=np.float64).reshape(-1, 4)
    ious = _iou(boxes, gt_xyxy)
    inside = (
        _inside(boxes, regions).max(axis=1) if len(regions) and len(boxes) else np.zeros(len(boxes))
    )
    taken = np.zeros(len(gt), dtype=bool)
    tally = Tally(truth=len(gt))
    for row in range(len(boxes)):
        candidates = np.where(taken, -1.0, ious[row]) if len(gt) else np.zeros(0)
        best = int(np.argmax(candidates)) if len(candidates) else -1
        if best >= 0 and candidates[best] >= iou_threshold:
            taken[best] = True
            tally.scores.append(float(scores[row]))
            tally.hits.append(True)
        elif inside[row] >= IGNORE_COVERAGE:
            tally.ignored += 1
        else:
            tally.scores.append(float(scores[row]))
            tally.hits.append(False)
    for flag in FLAGS:
        marked = np.asarray([b.flagged(flag) for b in gt], dtype=bool)
        tally.flagged[flag] = [int((taken & marked).sum()), int(marked.sum())]
    return tally


def score_frames(
    truth: ClipTruth,
    found: Mapping[int, Detections],
    names: Sequence[str],
    *,
    groups: Mapping[str, tuple[str, ...]] = GROUPS,
    iou_threshold: float = MATCH_IOU,
) -> dict[str, Tally]:
    """Per class group, the tally of `found` (frame index -> detections whose `class_id` index
    `names`) against `truth`, on the truth's frames. Every truth frame must have detections."""
    if not 0.0 < iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold must be in (0, 1], got {iou_threshold}")
    missing = sorted(set(truth.frames) - set(found))
    if missing:
        raise TruthError(
            f"{truth.clip}: no detections for the truth's frames {missing[:5]}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        )
    out = {group: Tally() for group in groups}
    for index, boxes in truth.frames.items():
        for group, members in groups.items():
            out[group] = out[group] + _score_frame(
                boxes, found[index], names, members, iou_threshold
            )
    return out


def mean_ap50(tallies: Mapping[str, Tally]) -> float:
    """Mean AP50 over the groups that have truth boxes (NaN where none has)."""
    values = [t.ap50 for t in tallies.values() if t.truth]
    return float(np.mean(values)) if values else math.nan


def clean(value: float) -> float | None:
    """A JSON-ready number: NaN as null, 4 decimals."""
    return None if math.isnan(value) else round(value, 4)


def tally_record(tally: Tally) -> dict[str, Any]:
    """A tally as JSON: counts, recall, precision, F1, AP50 and recall per flag."""
    return {
        "truth_boxes": tally.truth,
        "detections": len(tally.hits),
        "ignored_detections": tally.ignored,
        "true_positives": tally.true_positives,
        "recall": clean(tally.recall),
        "precision": clean(tally.precision),
        "f1": clean(tally.f1),
        "ap50": clean(tally.ap50),
        **{
            f"recall_{flag}": clean(tally.flag_recall(flag)) for flag in FLAGS
        },
        **{f"{flag}_boxes": tally.flagged[flag][1] for flag in FLAGS},
    }  # fmt: skip
