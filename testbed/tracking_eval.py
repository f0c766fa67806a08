"""Tracking quality on generated scenes: CLEAR-MOT and identity metrics with `motmetrics`.

The evaluation has three stages, kept apart so the scoring is tested without video and the
detector runs once per scene however many trackers are compared:

1. detections per frame: the real detector over the scene video (`detect_video`), or the ground
   truth itself, optionally jittered and thinned (`oracle_detections`, which isolates the tracker
   from the detector);
2. tracking (`track_frames`): `CameraTracker.update` over every frame; only confirmed tracks
   (`tracker_id >= 0`) become hypotheses;
3. scoring (`score_tracking`): IoU distance (pairs with IoU below 0.5 never match), boxes as
   `x, y, w, h`, class-agnostic.

Hard ground truth is ignored rather than counted: a box less visible than `MIN_VISIBILITY`
or narrower than `MIN_SIDE_PX` (the rule the detector's training labels and the demo's scoring
use) is removed from the ground truth, and so is any hypothesis it matches in that frame, the
way MOTChallenge treats distractors. A tracker that follows an object into an occlusion is
then neither rewarded nor punished for it.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import motmetrics as mm  # type: ignore[import-untyped]
import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from edge_agent.config.tracker import TrackerConfig
from edge_agent.detect_command import read_frames
from edge_agent.tracking import CameraTracker, Embedder, HistogramEmbedder, NoEmbedder
from testbed.scenes.scenario import make_scenario
from testbed.scenes.writer import read_mot, write_scene

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
EMBEDDER_MODEL_DIR = REPO_ROOT / "models" / "embedder"
EMBEDDER_NAMES: Final = ("none", "histogram", "mobilenetv2")

MIN_VISIBILITY = 0.25  # as `testbed.scenes.dataset.DatasetConfig.min_label_visibility`
MIN_SIDE_PX = 2  # as `DatasetConfig.min_label_side_px`
MAX_IOU_DISTANCE = 0.5  # 1 - IoU above this never matches (IoU >= 0.5 to count)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
ByteImage = npt.NDArray[np.uint8]

_METRICS: Final = (
    "mota",
    "idf1",
    "num_switches",
    "motp",
    "num_false_positives",
    "num_misses",
    "mostly_tracked",
    "mostly_lost",
    "num_unique_objects",
    "num_objects",
    "precision",
    "recall",
)


class EmbedderUnavailableError(RuntimeError):
    """An embedder that cannot be built here (code or model file missing)."""


@dataclass(frozen=True)
class FrameBoxes:
    """Boxes of one frame: `ids (n,)` and `xywh (n, 4)` in pixels."""

    ids: IntArray
    xywh: FloatArray

    @classmethod
    def empty(cls) -> FrameBoxes:
        """A frame without boxes."""
        return cls(np.empty(0, np.int64), np.empty((0, 4), np.float64))


@dataclass(frozen=True)
class GroundTruthFrame:
    """Ground truth of one frame: boxes plus each box's class and visibility."""

    boxes: FrameBoxes
    class_id: IntArray
    visibility: FloatArray

    def ignored(self, min_visibility: float, min_side_px: float) -> npt.NDArray[np.bool_]:
        """Mask of the boxes too hidden or too thin to count."""
        sides = np.minimum(self.boxes.xywh[:, 2], self.boxes.xywh[:, 3])
        return np.asarray((self.visibility < min_visibility) | (sides < min_side_px))


def load_ground_truth(gt_file: Path, n_frames: int) -> list[GroundTruthFrame]:
    """Per-frame ground truth (index 0 = MOT frame 1) of a `gt.txt`; later frames are dropped."""
    rows: list[list[tuple[int, int, int, int, int, int, float]]] = [[] for _ in range(n_frames)]
    for f, track_id, x, y, w, h, _, k, v in read_mot(gt_file):
        if 1 <= f <= n_frames:
            rows[f - 1].append((track_id, x, y, w, h, k, v))
    frames = []
    for frame_rows in rows:
        table = np.array(frame_rows, dtype=np.float64).reshape(-1, 7)
        frames.append(
            GroundTruthFrame(
                boxes=FrameBoxes(table[:, 0].astype(np.int64), table[:, 1:5]),
                class_id=table[:, 5].astype(np.int64),
                visibility=table[:, 6],
            )
        )
    return frames


@dataclass(frozen=True)
class Scene:
    """A scene folder written by `testbed.scenes.writer.write_scene`."""

    root: Path
    video: Path
    ground_truth: list[GroundTruthFrame]

    @property
    def n_frames(self) -> int:
        """Frames of the scene."""
        return len(self.ground_truth)


def load_scene(root: Path) -> Scene:
    """The video and ground truth of the scene folder `root`."""
    video, gt_file, seqinfo = root / "video.mp4", root / "gt" / "gt.txt", root / "seqinfo.ini"
    for path in (video, gt_file, seqinfo):
        if not path.is_file():
            raise FileNotFoundError(f"scene {root} has no {path.name}")
    lengths = [ln for ln in seqinfo.read_text().splitlines() if ln.startswith("seqLength=")]
    if not lengths:
        raise ValueError(f"{seqinfo} has no seqLength")
    n_frames = int(lengths[0].split("=", 1)[1])
    return Scene(root, video, load_ground_truth(gt_file, n_frames))


# -- detections -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class OracleSettings:
    """Ground truth as detections: which boxes, and how much noise.

    `jitter_frac`: standard deviation of the Gaussian noise on each box edge, as a fraction of
    the box's width (x) or height (y); `drop_rate`: chance that a box is missing from a frame.
    """

    min_visibility: float = MIN_VISIBILITY
    jitter_frac: float = 0.0
    drop_rate: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_visibility <= 1.0:
            raise ValueError(f"min_visibility must be in [0, 1], got {self.min_visibility}")
        if not 0.0 <= self.jitter_frac <= 1.0:
            raise ValueError(f"jitter_frac must be in [0, 1], got {self.jitter_frac}")
        if not 0.0 <= self.drop_rate < 1.0:
            raise ValueError(f"drop_rate must be in [0, 1), got {self.drop_rate}")


def oracle_detections(
    ground_truth: Sequence[GroundTruthFrame], settings: OracleSettings
) -> list[Detections]:
    """One `Detections` per frame made from the ground truth (confidence 1, true classes)."""
    rng = np.random.default_rng(settings.seed)
    out = []
    for frame in ground_truth:
        xywh = frame.boxes.xywh
        keep = ~frame.ignored(settings.min_visibility, MIN_SIDE_PX)
        # Draw for every box, kept or not, so one setting does not shift another's noise.
        kept_by_chance = rng.random(len(xywh)) >= settings.drop_rate
        noise = rng.normal(0.0, settings.jitter_frac, size=(len(xywh), 4))
        xyxy = np.column_stack([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]])
        xyxy = xyxy + noise * np.tile(xywh[:, 2:], 2)
        xyxy[:, 2:] = np.maximum(xyxy[:, 2:], xyxy[:, :2] + 1.0)
        chosen = keep & kept_by_chance
        out.append(
            Detections(
                xyxy=xyxy[chosen].astype(np.float32),
                confidence=np.ones(int(chosen.sum()), np.float32),
                class_id=frame.class_id[chosen],
            )
        )
    return out


@dataclass(frozen=True)
class DetectRun:
    """Detections of every frame and the detector's total time on them."""

    detections: list[Detections]
    detect_s: float

    @property
    def ms_per_frame(self) -> float:
        """Mean detector time per frame."""
        return 1000.0 * self.detect_s / max(len(self.detections), 1)


def detect_video(video: Path, config: DetectorConfig, max_frames: int | None = None) -> DetectRun:
    """The detector's output on every frame of `video`, with its time per frame."""
    found: list[Detections] = []
    seconds = 0.0
    with Detector.from_config(config) as detector:
        for frame in read_frames(str(video), max_frames):
            started = time.perf_counter()
            (dets,) = detector.detect([frame])
            seconds += time.perf_counter() - started
            found.append(dets)
    return DetectRun(found, seconds)


# -- tracking -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrackRun:
    """Hypotheses of every frame (confirmed tracks only) and the tracker's total time."""

    hypotheses: list[FrameBoxes]
    track_s: float
    embedded_boxes: int

    @property
    def ms_per_frame(self) -> float:
        """Mean time of `CameraTracker.update` (embedding included) per frame."""
        return 1000.0 * self.track_s / max(len(self.hypotheses), 1)


def hypotheses_of(tracked: Detections) -> FrameBoxes:
    """The confirmed tracks of one tracked frame as `x, y, w, h` boxes."""
    confirmed = tracked.tracker_id >= 0
    xyxy = tracked.xyxy[confirmed].astype(np.float64)
    return FrameBoxes(
        tracked.tracker_id[confirmed].astype(np.int64),
        np.column_stack([xyxy[:, :2], xyxy[:, 2:] - xyxy[:, :2]]).reshape(-1, 4),
    )


def track_frames(
    frames: Iterable[ByteImage], detections: Sequence[Detections], tracker: CameraTracker
) -> TrackRun:
    """Run `tracker` over paired frames and detections (as many frames as detections)."""
    hypotheses = []
    seconds = 0.0
    frame_iter = iter(frames)
    for index, dets in enumerate(detections):
        frame = next(frame_iter, None)
        if frame is None:
            raise ValueError(f"{len(detections)} frames of detections but only {index} frames")
        started = time.perf_counter()
        tracked = tracker.update(frame, dets)
        seconds += time.perf_counter() - started
        hypotheses.append(hypotheses_of(tracked))
    return TrackRun(hypotheses, seconds, tracker.embedded_boxes)


def blank_frames(height_px: int, width_px: int) -> Iterator[ByteImage]:
    """Endless black frames, for trackers whose embedder never looks at pixels."""
    frame = np.zeros((height_px, width_px, 3), np.uint8)
    while True:
        yield frame


# -- embedders ------------------------------------------------------------------------------------


def embedder_model_file(model_dir: Path = EMBEDDER_MODEL_DIR) -> Path | None:
    """The first `*.onnx` in `model_dir` (sorted by name), or None."""
    found = sorted(model_dir.glob("*.onnx")) if model_dir.is_dir() else []
    return found[0] if found else None


def _mobilenetv2_parts(model_dir: Path) -> tuple[Callable[[TrackerConfig], Embedder], Path]:
    """`build_embedder` and the model file, or `EmbedderUnavailableError` naming what is missing."""
    build: Any = getattr(importlib.import_module("edge_agent.tracking"), "build_embedder", None)
    if build is None:
        raise EmbedderUnavailableError("edge_agent.tracking has no build_embedder")
    model = embedder_model_file(model_dir)
    if model is None:
        raise EmbedderUnavailableError(f"no *.onnx embedder model in {model_dir}")
    return cast(Callable[[TrackerConfig], Embedder], build), model


def make_embedder(name: str, model_dir: Path = EMBEDDER_MODEL_DIR) -> Embedder:
    """The embedder called `name` (one of `EMBEDDER_NAMES`).

    `mobilenetv2` needs `edge_agent.tracking.build_embedder` and an ONNX model in `model_dir`;
    without either it raises `EmbedderUnavailableError`.
    """
    if name == "none":
        return NoEmbedder()
    if name == "histogram":
        return HistogramEmbedder()
    if name != "mobilenetv2":
        raise ValueError(f"unknown embedder {name!r}; expected one of {EMBEDDER_NAMES}")
    build, model = _mobilenetv2_parts(model_dir)
    return build(TrackerConfig(embedder="mobilenetv2", embedder_model_path=model))


def available_embedders(model_dir: Path = EMBEDDER_MODEL_DIR) -> list[str]:
    """The names in `EMBEDDER_NAMES` that `make_embedder` can build here (nothing is loaded)."""
    try:
        _mobilenetv2_parts(model_dir)
    except EmbedderUnavailableError as exc:
        logger.info("embedder mobilenetv2 skipped: %s", exc)
        return [name for name in EMBEDDER_NAMES if name != "mobilenetv2"]
    return list(EMBEDDER_NAMES)


# -- scoring --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrackingScores:
    """CLEAR-MOT and identity metrics of one sequence (`motmetrics` definitions).

    `motp` is the mean IoU distance (1 - IoU) of matched pairs: lower is better.
    `ignored_hypotheses` counts hypotheses dropped because they matched ignored ground truth.
    """

    mota: float
    idf1: float
    id_switches: int
    motp: float
    false_positives: int
    misses: int
    mostly_tracked: int
    mostly_lost: int
    num_unique_objects: int
    num_objects: int
    precision: float
    recall: float
    num_frames: int
    ignored_hypotheses: int


def iou_distance(gt_xywh: FloatArray, hyp_xywh: FloatArray, max_distance: float) -> FloatArray:
    """`1 - IoU` of every ground-truth and hypothesis box, NaN (no match) above `max_distance`.

    `motmetrics.distances.iou_matrix` without its `np.asfarray` (gone in numpy 2), and with the
    `(n, m)` shape kept when one side is empty.
    """
    gt = np.asarray(gt_xywh, dtype=np.float64).reshape(-1, 4)
    hyp = np.asarray(hyp_xywh, dtype=np.float64).reshape(-1, 4)
    if not len(gt) or not len(hyp):
        return np.empty((len(gt), len(hyp)), np.float64)
    distance = 1.0 - np.asarray(mm.distances.boxiou(gt[:, None], hyp[None, :]), np.float64)
    return np.where(distance > max_distance, np.nan, distance)


def drop_ignored(
    truth: GroundTruthFrame,
    hyp: FrameBoxes,
    *,
    min_visibility: float,
    max_distance: float,
) -> tuple[FrameBoxes, FrameBoxes, int]:
    """Ground truth without ignored boxes, hypotheses without those matching them, drop count.

    Hypotheses are matched one to one to all ground truth first (Hungarian on IoU distance), so
    a hypothesis on a visible object is never given up to a hidden one beside it.
    """
    ignored = truth.ignored(min_visibility, MIN_SIDE_PX)
    gt = truth.boxes
    if not ignored.any():
        return gt, hyp, 0
    distance = iou_distance(gt.xywh, hyp.xywh, max_distance)
    drop = np.zeros(len(hyp.ids), bool)
    if distance.size:
        cost = np.where(np.isnan(distance), 2.0, distance)
        for g, h in zip(*linear_sum_assignment(cost), strict=True):
            if ignored[g] and not np.isnan(distance[g, h]):
                drop[h] = True
    kept_gt = FrameBoxes(gt.ids[~ignored], gt.xywh[~ignored])
    kept_hyp = FrameBoxes(hyp.ids[~drop], hyp.xywh[~drop])
    return kept_gt, kept_hyp, int(drop.sum())


def score_tracking(
    ground_truth: Sequence[GroundTruthFrame],
    hypotheses: Sequence[FrameBoxes],
    *,
    min_visibility: float = MIN_VISIBILITY,
    max_distance: float = MAX_IOU_DISTANCE,
) -> TrackingScores:
    """Score the tracker's `hypotheses` against `ground_truth`, frame by frame (same length)."""
    if len(ground_truth) != len(hypotheses):
        raise ValueError(
            f"{len(ground_truth)} frames of ground truth but {len(hypotheses)} of hypotheses"
        )
    accumulator = mm.MOTAccumulator(auto_id=False)
    ignored_total = 0
    for index, (truth, hyp) in enumerate(zip(ground_truth, hypotheses, strict=True)):
        gt, kept, ignored = drop_ignored(
            truth, hyp, min_visibility=min_visibility, max_distance=max_distance
        )
        ignored_total += ignored
        accumulator.update(
            gt.ids.tolist(),
            kept.ids.tolist(),
            iou_distance(gt.xywh, kept.xywh, max_distance),
            frameid=index + 1,
        )
    summary = mm.metrics.create().compute(accumulator, metrics=list(_METRICS), name="scene")
    row = {name: float(summary[name].iloc[0]) for name in _METRICS}
    return TrackingScores(
        mota=row["mota"],
        idf1=row["idf1"],
        id_switches=int(row["num_switches"]),
        motp=row["motp"],
        false_positives=int(row["num_false_positives"]),
        misses=int(row["num_misses"]),
        mostly_tracked=int(row["mostly_tracked"]),
        mostly_lost=int(row["mostly_lost"]),
        num_unique_objects=int(row["num_unique_objects"]),
        num_objects=int(row["num_objects"]),
        precision=row["precision"],
        recall=row["recall"],
        num_frames=len(ground_truth),
        ignored_hypotheses=ignored_total,
    )


# -- one scene, end to end ------------------------------------------------------------------------


@dataclass(frozen=True)
class SceneEvaluation:
    """A tracker's scores on a scene and what tracking cost."""

    scores: TrackingScores
    track: TrackRun


def evaluate_tracking(
    scene: Scene,
    detections: Sequence[Detections],
    tracker_config: TrackerConfig,
    embedder: Embedder,
    confidence_threshold: float,
    *,
    min_visibility: float = MIN_VISIBILITY,
    frames: Callable[[], Iterable[ByteImage]] | None = None,
) -> SceneEvaluation:
    """Track `detections` (one per frame of `scene`) and score the confirmed tracks.

    `frames` gives the images the embedder sees (default: the scene's decoded video).
    """
    if len(detections) != scene.n_frames:
        raise ValueError(f"{len(detections)} frames of detections for {scene.n_frames} frames")
    tracker = CameraTracker.from_config(tracker_config, confidence_threshold, embedder)
    images = frames() if frames is not None else read_frames(str(scene.video), scene.n_frames)
    run = track_frames(images, detections, tracker)
    scores = score_tracking(scene.ground_truth, run.hypotheses, min_visibility=min_visibility)
    logger.info(
        "%s: MOTA %.3f IDF1 %.3f IDsw %d (%.2f ms/frame tracking)",
        scene.root.name, scores.mota, scores.idf1, scores.id_switches, run.ms_per_frame,
    )  # fmt: skip
    return SceneEvaluation(scores, run)


def ensure_scene(
    preset: str,
    seed: int,
    out_dir: Path,
    media_cache_dir: Path,
    n_frames: int | None = None,
    *,
    static_camera: bool = False,
) -> Scene:
    """The scene `preset`/`seed` under `out_dir`, rendered unless an identical one is there
    (`static_camera`: its still-background variant)."""
    spec = make_scenario(preset, seed, n_frames=n_frames, static_camera=static_camera)
    document = out_dir / spec.name / "scenario.json"
    wanted = json.dumps(spec.to_json(), sort_keys=True)
    if document.is_file():
        if json.dumps(json.loads(document.read_text())["spec"], sort_keys=True) == wanted:
            return load_scene(out_dir / spec.name)
        logger.info("scene %s in %s is stale; rendering it again", spec.name, out_dir)
    write_scene(spec, out_dir, media_cache_dir)
    return load_scene(out_dir / spec.name)
