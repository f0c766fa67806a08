"""Peer trackers and ultralytics `track()` behind one small interface, for `bench.edge.edge_peers`.

Every tracker (the project's `CameraTracker` and each peer) is wrapped in a `TrackerAdapter`
with three steps, so that the bench times only the tracker's own work:

- `convert` (untimed): the project's `Detections` into the peer's input type;
- `update` (timed): one frame through the tracker;
- `hypotheses` (untimed): the peer's output as confirmed tracks (`FrameBoxes`).

The peers come from the `peers` extra (supervision, trackers, lap) and the `tools` extra
(ultralytics); each is imported when its adapter is first built, and a library that does not
import is skipped with a log line rather than failing the bench.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from edge_agent.config.tracker import TrackerConfig
from edge_agent.tracking import CameraTracker
from testbed.tracking_eval import FrameBoxes, hypotheses_of, make_embedder

logger = logging.getLogger(__name__)

ByteImage = npt.NDArray[np.uint8]
FloatArray = npt.NDArray[np.float64]


ULTRALYTICS_DISTRIBUTIONS = ("ultralytics", "ultralytics-opencv-headless")


def version_of(*distributions: str) -> str:
    """The installed version of the first of `distributions` that is installed, or `missing`."""
    for distribution in distributions:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "missing"


def peer_module(name: str) -> Any:
    """A peer library's module, untyped: the peers' types stop at this boundary."""
    return importlib.import_module(name)


def ultralytics_environment(config_dir: Path, threads: int) -> None:
    """Offline, no auto-install, settings under `config_dir`; call before importing ultralytics.

    Values already in the environment are kept.
    """
    config_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_AUTOINSTALL", "0")
    os.environ.setdefault("YOLO_CONFIG_DIR", str(config_dir))
    os.environ.setdefault("YOLO_VERBOSE", "False")
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def boxes_from_xyxy(ids: npt.ArrayLike, xyxy: npt.ArrayLike) -> FrameBoxes:
    """Confirmed tracks given as ids and `x1, y1, x2, y2` boxes."""
    corners = np.asarray(xyxy, dtype=np.float64).reshape(-1, 4)
    return FrameBoxes(
        np.asarray(ids, dtype=np.float64).astype(np.int64).reshape(-1),
        np.column_stack([corners[:, :2], corners[:, 2:] - corners[:, :2]]).reshape(-1, 4),
    )


# -- trackers -------------------------------------------------------------------------------------


class TrackerAdapter(ABC):
    """One tracker fed the project's detections frame by frame (a fresh one per scene)."""

    @abstractmethod
    def convert(self, detections: Detections, frame: ByteImage) -> Any:
        """The detections in the tracker's input type (not timed)."""

    @abstractmethod
    def update(self, converted: Any, frame: ByteImage) -> Any:
        """Advance one frame (timed)."""

    @abstractmethod
    def hypotheses(self, output: Any) -> FrameBoxes:
        """The confirmed tracks of `update`'s output (not timed)."""


@dataclass(frozen=True)
class TrackerSpec:
    """A tracker under test: its name, library, settings and a factory of fresh instances."""

    name: str
    library: str
    settings: dict[str, Any]
    make: Callable[[], TrackerAdapter] = field(repr=False)
    is_project: bool = False


class ProjectTracker(TrackerAdapter):
    """The project's `CameraTracker` (DeepSORT with the ByteTrack-style low-score pass)."""

    def __init__(self, config: TrackerConfig, confidence_threshold: float) -> None:
        embedder = make_embedder(config.embedder)
        self._tracker = CameraTracker.from_config(config, confidence_threshold, embedder)

    def convert(self, detections: Detections, frame: ByteImage) -> Detections:
        return detections

    def update(self, converted: Detections, frame: ByteImage) -> Detections:
        return self._tracker.update(frame, converted)

    def hypotheses(self, output: Detections) -> FrameBoxes:
        return hypotheses_of(output)


class UltralyticsTracker(TrackerAdapter):
    """ultralytics' `BYTETracker` or `BOTSORT`, fed `Boxes` as `track()` feeds them."""

    def __init__(self, kind: str, overrides: dict[str, Any]) -> None:
        utils = peer_module("ultralytics.utils")
        yaml_file = peer_module("ultralytics.utils.checks").check_yaml(f"{kind}.yaml")
        settings = {**utils.YAML.load(yaml_file), **overrides}
        tracker_class = peer_module("ultralytics.trackers.track").TRACKER_MAP[kind]
        self._tracker: Any = tracker_class(args=utils.IterableSimpleNamespace(**settings))
        self._boxes: Any = peer_module("ultralytics.engine.results").Boxes

    def convert(self, detections: Detections, frame: ByteImage) -> Any:
        data = np.column_stack([detections.xyxy, detections.confidence, detections.class_id])
        return self._boxes(data.astype(np.float32).reshape(-1, 6), frame.shape[:2])

    def update(self, converted: Any, frame: ByteImage) -> Any:
        return self._tracker.update(converted, frame)

    def hypotheses(self, output: Any) -> FrameBoxes:
        rows = np.asarray(output, dtype=np.float64).reshape(-1, 8)  # x1 y1 x2 y2 id score cls idx
        return boxes_from_xyxy(rows[:, 4], rows[:, :4])


def _sv_detections(detections: Detections) -> Any:
    return peer_module("supervision").Detections(
        xyxy=detections.xyxy.astype(np.float32).reshape(-1, 4),
        confidence=detections.confidence.astype(np.float32),
        class_id=detections.class_id.astype(int),
    )


def _sv_hypotheses(output: Any) -> FrameBoxes:
    if output.tracker_id is None or not len(output):
        return FrameBoxes.empty()
    ids = np.asarray(output.tracker_id)
    confirmed = ids >= 0  # -1: not yet confirmed (minimum_consecutive_frames)
    return boxes_from_xyxy(ids[confirmed], np.asarray(output.xyxy)[confirmed])


class SupervisionByteTrack(TrackerAdapter):
    """supervision's `ByteTrack` (deprecated there since 0.28, removed in 0.31)."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the deprecation notice
            self._tracker: Any = peer_module("supervision").ByteTrack(**kwargs)

    def convert(self, detections: Detections, frame: ByteImage) -> Any:
        return _sv_detections(detections)

    def update(self, converted: Any, frame: ByteImage) -> Any:
        return self._tracker.update_with_detections(converted)

    def hypotheses(self, output: Any) -> FrameBoxes:
        return _sv_hypotheses(output)


class RoboflowTracker(TrackerAdapter):
    """A tracker of the `trackers` package (`ByteTrackTracker`, `OCSORTTracker`)."""

    def __init__(self, class_name: str, kwargs: dict[str, Any]) -> None:
        self._tracker: Any = getattr(peer_module("trackers"), class_name)(**kwargs)

    def convert(self, detections: Detections, frame: ByteImage) -> Any:
        return _sv_detections(detections)

    def update(self, converted: Any, frame: ByteImage) -> Any:
        return self._tracker.update(converted)  # no frame: neither tracker looks at pixels

    def hypotheses(self, output: Any) -> FrameBoxes:
        return _sv_hypotheses(output)


@dataclass(frozen=True)
class ProjectThresholds:
    """The project tracker's score thresholds and track life, to give a peer the same ones."""

    high: float  # detections at or above start tracks and match first
    low: float  # second-pass floor
    max_age_frames: int
    n_init: int

    @classmethod
    def of(cls, config: TrackerConfig, confidence_threshold: float) -> ProjectThresholds:
        """The thresholds of the project's `tracker:` settings and detector threshold."""
        low = config.low_score_threshold if config.low_score_threshold is not None else 0.1
        return cls(confidence_threshold, low, config.max_age_frames, config.n_init)


def _ultralytics(kind: str, settings: dict[str, Any]) -> TrackerAdapter:
    return UltralyticsTracker(kind, settings)


def _supervision(fps: float, settings: dict[str, Any]) -> TrackerAdapter:
    return SupervisionByteTrack({"frame_rate": fps, **settings})


def _trackers(class_name: str, fps: float, settings: dict[str, Any]) -> TrackerAdapter:
    return RoboflowTracker(class_name, {"frame_rate": fps, **settings})


def peer_specs(fps: float, project: ProjectThresholds) -> list[TrackerSpec]:
    """Every peer tracker that imports here, at its library defaults and at project thresholds.

    supervision and trackers take lost-track buffers in 30 fps frames and scale them by
    `fps`/30; ultralytics 8.4 takes frames as they come.
    """
    buffer_30fps = round(project.max_age_frames * 30.0 / fps)
    ultralytics_tuned = {
        "track_high_thresh": project.high,
        "track_low_thresh": project.low,
        "new_track_thresh": project.high,
        "track_buffer": project.max_age_frames,  # frames: ultralytics does not scale it
    }
    sv_tuned = {
        "track_activation_threshold": project.high,  # new tracks need 0.1 more (fixed in sv)
        "lost_track_buffer": buffer_30fps,
        "minimum_consecutive_frames": project.n_init,
    }
    bytetrack_tuned = {
        "track_activation_threshold": project.high,
        "high_conf_det_threshold": project.high,
        "lost_track_buffer": buffer_30fps,
        "minimum_consecutive_frames": project.n_init,
    }
    ocsort_tuned = {
        "high_conf_det_threshold": project.high,
        "lost_track_buffer": buffer_30fps,
        "minimum_consecutive_frames": project.n_init,
    }
    Factory = Callable[[dict[str, Any]], TrackerAdapter]
    candidates: list[tuple[str, str, dict[str, Any], Factory]] = []
    for kind, label in (("bytetrack", "ByteTrack"), ("botsort", "BoT-SORT")):
        candidates.append(("ultralytics", label, ultralytics_tuned, partial(_ultralytics, kind)))
    candidates.append(("supervision", "ByteTrack", sv_tuned, partial(_supervision, fps)))
    for class_name, label, tuned in (
        ("ByteTrackTracker", "ByteTrack", bytetrack_tuned),
        ("OCSORTTracker", "OC-SORT", ocsort_tuned),
    ):
        candidates.append(("trackers", label, tuned, partial(_trackers, class_name, fps)))

    specs = []
    for library, label, tuned, factory in candidates:
        try:
            factory({})  # imports the library and builds one: fail here, not mid-run
        except ImportError as exc:
            logger.warning("%s %s skipped: %s", library, label, exc)
            continue
        version = version_of(
            *(ULTRALYTICS_DISTRIBUTIONS if library == "ultralytics" else [library])
        )
        for suffix, settings in (("", {}), (" (project thresholds)", tuned)):
            specs.append(
                TrackerSpec(
                    name=f"{library} {label}{suffix}",
                    library=f"{library} {version}",
                    settings={
                        **({} if library == "ultralytics" else {"frame_rate": fps}),
                        **settings,
                    },
                    make=partial(factory, settings),
                )
            )
    return specs


# -- ultralytics track(), end to end --------------------------------------------------------------


@dataclass
class LoopRun:
    """One end-to-end pass over a clip: confirmed tracks per frame and the timed frames' cost."""

    hypotheses: list[FrameBoxes]
    timed_s: float
    timed_frames: int
    stages_s: dict[str, float] = field(default_factory=dict)  # summed over the timed frames
    input_shape: tuple[int, ...] | None = None

    @property
    def ms_per_frame(self) -> float:
        """Mean wall time of a timed frame."""
        return 1000.0 * self.timed_s / max(self.timed_frames, 1)


class UltralyticsTrackLoop:
    """`YOLO(model, task="detect").track(video, stream=True)` over a clip, timed per frame.

    `rect` True is ultralytics' own letterbox for a dynamic ONNX model (the frame's aspect,
    padded to a stride multiple: 320x192 for 640x360); False pads to the square `imgsz`, as
    the project's detector does.
    """

    def __init__(self, model: Path, imgsz: int, tracker: str, *, rect: bool) -> None:
        self._model: Any = peer_module("ultralytics").YOLO(str(model), task="detect")
        self.imgsz, self.tracker, self.rect = imgsz, tracker, rect
        defaults = peer_module("ultralytics.cfg").DEFAULT_CFG
        self.nms_iou = float(defaults.iou)
        self.confidence_threshold = 0.1  # what `Model.track` sets when `conf` is not given

    def run(self, video: Path, warmup_frames: int) -> LoopRun:
        """Track every frame of `video`; frames after `warmup_frames` are timed."""
        stream = self._model.track(
            str(video),
            tracker=self.tracker,
            imgsz=self.imgsz,
            rect=self.rect,
            stream=True,
            persist=False,
            verbose=False,
            device="cpu",
        )
        run = LoopRun([], 0.0, 0)
        stages = {"preprocess": 0.0, "inference": 0.0, "postprocess": 0.0}
        last_frame = None
        resumed = time.perf_counter()
        for index, result in enumerate(stream):
            elapsed = time.perf_counter() - resumed  # decode, letterbox, infer, NMS, track
            if index >= warmup_frames:
                run.timed_s += elapsed
                run.timed_frames += 1
                for key in stages:
                    stages[key] += float(result.speed.get(key) or 0.0) / 1000.0
            boxes = result.boxes
            if boxes is None or boxes.id is None:
                run.hypotheses.append(FrameBoxes.empty())
            else:
                run.hypotheses.append(boxes_from_xyxy(boxes.id.numpy(), boxes.xyxy.numpy()))
            resumed = time.perf_counter()
            last_frame = result.orig_img
        if last_frame is not None and self._model.predictor is not None:
            # the tensor the model saw (after ultralytics' letterbox), recomputed once, untimed
            tensor = self._model.predictor.preprocess([last_frame])
            run.input_shape = tuple(int(s) for s in tensor.shape[2:])
        stages["other"] = run.timed_s - sum(stages.values())  # decode, tracker, results
        run.stages_s = stages
        return run
