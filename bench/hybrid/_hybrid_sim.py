"""Offline edge–cloud hybrid simulation on generated scenes, on simulated time.

The real pieces run frame by frame (time is `frame_index / fps`): the edge detector's output,
`CameraTracker`, `RuleEngine`, `FrameSignals` + `EscalationPolicy` with its budget, the video
uplink's encoder (`CameraUplinks`, the real H.264/HEVC packets) or `request_for_decision`'s real
JPEG bytes, the cloud's `DetectorFrameProcessor` on those requests (decoded video, whole frames
or crops, mapped back to source pixels), `detections_from_result`, and
`fuse_answer` after a simulated round trip of `rtt_frames` frames. What is simulated is only the
clock and the network: an answer to frame `j` is folded in before the tracking of frame
`j + rtt_frames`, as `EdgeAgent.step` does with whatever answers have come back by then.

Detector outputs are cached per scene under `.cache/bench-hybrid/` (edge INT8 on every decoded
frame; cloud on the JPEG of every frame, as the service would see it; cloud on each crop set the
simulation asks for), so variants compare the same detections and only the first run is slow.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import av
import numpy as np
import numpy.typing as npt

from bench.harness import REPO_ROOT
from cloud_service.decoders import BgrImage
from cloud_service.decoders.video import SUPPORTED_CODECS, VideoSessions
from cloud_service.models import ModelInfo
from cloud_service.processor import DetectorFrameProcessor
from detection.class_groups import COCO_GROUPS, GroupKeys
from detection.coco_eval import GroundTruth, box_iou_coco, compute_metrics
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from detection.runtimes.config import LiteRTConfig, OnnxRuntimeConfig
from detection.slicing import Tile
from edge_agent.capture import CapturedFrame
from edge_agent.config import EdgeAgentConfig
from edge_agent.config.camera import CameraConfig
from edge_agent.config.escalation import EscalationConfig
from edge_agent.config.motion import MotionConfig
from edge_agent.config.tracker import TrackerConfig
from edge_agent.detect_command import read_frames
from edge_agent.escalation import (
    EscalationPolicy,
    build_frame_request,
    payload_bytes,
    payload_pixels,
    request_for_decision,
)
from edge_agent.escalation.encode import detections_from_result
from edge_agent.escalation.uplink import CameraUplinks
from edge_agent.pipeline.core import CameraPipeline
from edge_agent.pipeline.focus import detect_crops
from edge_agent.pipeline.mosaic import packing, runs_for
from edge_agent.rules import RuleEvent
from edge_agent.tracking import CameraTracker, NoEmbedder
from edge_agent.tracking.fusion import FusionSettings, FusionTally
from protos.analytics.v1 import analytics_pb2 as pb
from testbed.alert_check import EventMatch, SceneEvent, load_expected, match_events
from testbed.alert_check import scene_agent_config as events_agent_config
from testbed.tracking_eval import (
    MIN_SIDE_PX,
    MIN_VISIBILITY,
    FrameBoxes,
    GroundTruthFrame,
    Scene,
    TrackingScores,
    ensure_scene,
    hypotheses_of,
    score_tracking,
)

logger = logging.getLogger(__name__)

MODELS = REPO_ROOT / "models"
CACHE = REPO_ROOT / ".cache" / "bench-hybrid"
EDGE_MODEL = MODELS / "edge" / "edge-yolov5n-320-int8.tflite"
CLOUD_MODEL = MODELS / "cloud" / "cloud-yolov5s-640-fp16w.onnx"
CLOUD_INPUT_SIZE = (640, 640)
SEED_BASE = 960_000  # far from the datasets of seeds 0 and 1 (0..599 999: training, held-out)
CAMERA = "scene"  # `testbed.alert_check.SCENE_CAMERA`
AGENT = "hybrid-sim"
CACHE_THRESHOLD = 0.1  # detectors are cached down to this; stricter thresholds filter the cache
SCENE_START_S = 1_700_000_000.0  # wall clock of frame 0 (POSIX seconds), for requests and rules

# The tracker and detector settings of `testbed.alert_check.scene_agent_config` (checked against
# it on `events` scenes): IoU-only DeepSORT, ByteTrack second pass down to 0.1.
TRACKER = TrackerConfig(embedder="none", n_init=2, max_age_frames=25, low_score_threshold=0.1)
DETECTOR_THRESHOLD = 0.3
RECOVER_IOU = 0.3  # `tracker.recover_iou` of the benches' "recovery" rows

Mode = Literal["edge", "cloud", "hybrid"]
FloatArray = npt.NDArray[np.float64]


def class_names() -> list[str]:
    """The classes the committed models were trained on."""
    manifest = json.loads((MODELS / "manifest.json").read_text())
    return [str(name) for name in manifest["class_names"]]


# -- cached detector outputs ------------------------------------------------------------------


def _pack(found: Sequence[Detections]) -> dict[str, npt.NDArray[np.generic]]:
    counts = np.array([len(d) for d in found], dtype=np.int64)
    xyxy = [d.xyxy for d in found if len(d)]
    return {
        "counts": counts,
        "xyxy": np.concatenate(xyxy).astype(np.float32) if xyxy else np.zeros((0, 4), np.float32),
        "confidence": np.concatenate([d.confidence for d in found]).astype(np.float32)
        if len(found)
        else np.zeros(0, np.float32),
        "class_id": np.concatenate([d.class_id for d in found]).astype(np.int64)
        if len(found)
        else np.zeros(0, np.int64),
    }


def _unpack(data: dict[str, npt.NDArray[np.generic]], prefix: str = "") -> list[Detections]:
    counts = np.asarray(data[prefix + "counts"], dtype=np.int64)
    ends = np.cumsum(counts)
    xyxy = np.asarray(data[prefix + "xyxy"], dtype=np.float32).reshape(-1, 4)
    confidence = np.asarray(data[prefix + "confidence"], dtype=np.float32)
    class_id = np.asarray(data[prefix + "class_id"], dtype=np.int64)
    out = []
    for end, n in zip(ends, counts, strict=True):
        s = slice(int(end - n), int(end))
        out.append(Detections(xyxy[s], confidence[s], class_id[s]) if n else Detections.empty())
    return out


def above(detections: Detections, threshold: float) -> Detections:
    """The detections scoring at least `threshold` (a detector run at that threshold)."""
    keep = detections.confidence >= threshold
    if keep.all():
        return detections
    return Detections(detections.xyxy[keep], detections.confidence[keep], detections.class_id[keep])


def edge_detector_config(threads: int) -> DetectorConfig:
    """The committed edge INT8 model, keeping boxes down to the tracker's low-score threshold
    (as `EdgeAgent.from_config` lowers the detector's threshold)."""
    return DetectorConfig(
        runtime=LiteRTConfig(model_path=EDGE_MODEL, num_threads=threads),
        class_names=class_names(),
        confidence_threshold=CACHE_THRESHOLD,
    )


def edge_detector(threads: int) -> Detector:
    """The detector of `edge_detector_config`."""
    return Detector.from_config(edge_detector_config(threads))


def cloud_detector_config(threads: int) -> DetectorConfig:
    """The committed cloud model on the CPU, down to the cache threshold."""
    return DetectorConfig(
        runtime=OnnxRuntimeConfig(model_path=CLOUD_MODEL, intra_op_threads=threads),
        class_names=class_names(),
        input_size=CLOUD_INPUT_SIZE,
        confidence_threshold=CACHE_THRESHOLD,
    )


def cloud_processor(threads: int) -> tuple[DetectorFrameProcessor, Detector]:
    """The cloud service's frame processor around the committed cloud model (CPU, in-process)."""
    names = class_names()
    detector = Detector.from_config(cloud_detector_config(threads))
    model = ModelInfo(name=CLOUD_MODEL.stem, version="committed", class_names=tuple(names))
    return DetectorFrameProcessor(detector, model), detector


def frame_request(
    image: npt.NDArray[np.uint8], frame_id: int, jpeg_quality: int
) -> pb.FrameRequest:
    """The whole-frame request the edge sends for `image` (no deadline: simulated time)."""
    return build_frame_request(
        image,
        agent_id=AGENT,
        camera_id=CAMERA,
        frame_id=frame_id,
        capture_time_s=SCENE_START_S,
        jpeg_quality=jpeg_quality,
    )


@dataclass
class SceneData:
    """A scene with its ground truth and every cached per-frame result the simulation needs."""

    label: str
    preset: str
    scene: Scene
    fps: float
    width: int
    height: int
    edge: list[Detections]  # edge INT8, threshold CACHE_THRESHOLD, on the decoded frame
    edge_ms: FloatArray  # edge detector time of each frame (when the cache was made)
    cloud: list[Detections]  # cloud on the frame's JPEG (quality `jpeg_quality`), via the service
    cloud_ms: FloatArray
    frame_bytes: npt.NDArray[np.int64]  # JPEG bytes of each whole frame
    jpeg_quality: int
    camera: CameraConfig | None = None  # with zones, lines and rules on `events` scenes
    expected: list[SceneEvent] = field(default_factory=list)
    class_names: list[str] = field(default_factory=lambda: class_names())  # of both models
    # the detectors' class groups (`DetectorConfig.class_groups`; the tracker's gate)
    class_groups: tuple[tuple[str, ...], ...] = COCO_GROUPS
    tracker: TrackerConfig = TRACKER
    detector_threshold: float = DETECTOR_THRESHOLD  # tracks start above it
    scored_tracking: bool = True  # False: the ground truth has no identities (real footage)
    cache_tag: str = ""  # sub-folder of the detection caches: which models made them
    # class ids the edge detector keeps (its `classes` filter), as the agent's fusion gets
    # them; None: every class (the test world's models share their classes)
    edge_classes: tuple[int, ...] | None = None

    @property
    def n_frames(self) -> int:
        """Frames simulated."""
        return len(self.edge)

    @property
    def stream_bytes(self) -> int:
        """Bytes of the camera's own H.264 stream over the frames simulated (see
        `camera_stream_bytes`): the uplink's baseline, streaming the camera to the cloud."""
        return camera_stream_bytes(self.scene.video, self.n_frames)

    def frames(self) -> Iterator[npt.NDArray[np.uint8]]:
        """The decoded frames, in order."""
        return read_frames(str(self.scene.video), self.n_frames)


_STREAM_BYTES: dict[tuple[str, int], int] = {}


def camera_stream_bytes(video: Path, frames: int) -> int:
    """The H.264 bytes of the first `frames` frames of `video`, packet by packet (no container).

    Every clip the benches use is H.264 as a camera would send it, made the same way for the
    test world (`testbed.scenes.writer`) and for real footage (`testbed.media.sample_clip`):
    libx264 `veryfast`, CRF 20, main profile, no B-frames, a keyframe every second. That is the
    baseline of the uplink: what streaming the camera to the cloud costs.
    """
    key = (str(video), frames)
    if key not in _STREAM_BYTES:
        total = counted = 0
        with av.open(str(video)) as container:
            stream = container.streams.video[0]
            if stream.codec_context.name != "h264":
                raise ValueError(f"{video} is {stream.codec_context.name}, not H.264")
            for packet in container.demux(stream):
                if packet.size == 0:
                    continue  # the demuxer's flush packet
                if counted >= frames:
                    break
                total += packet.size
                counted += 1
        _STREAM_BYTES[key] = total
    return _STREAM_BYTES[key]


def _events_camera(scene: Scene, cache_dir: Path) -> CameraConfig:
    """The camera (zone, line, rules) `scene_agent_config` sets up for an `events` scene."""
    document = events_agent_config(
        scene.root,
        camera_url=str(scene.video),
        model_path=EDGE_MODEL,
        class_names=class_names(),
        mqtt_port=1883,
        outbox_path=cache_dir / "unused-outbox.sqlite",  # never opened
    )
    config = EdgeAgentConfig.model_validate(document)
    if config.tracker != TRACKER or config.detector.confidence_threshold != DETECTOR_THRESHOLD:
        raise RuntimeError(
            "scene_agent_config's tracker/detector settings changed; update TRACKER and "
            f"DETECTOR_THRESHOLD in {__name__}: {config.tracker} / "
            f"{config.detector.confidence_threshold}"
        )
    return config.cameras[0]


def prepare_scene(
    preset: str,
    seed: int,
    *,
    max_frames: int | None = None,
    render_frames: int | None = None,
    cache_dir: Path = CACHE,
    media_dir: Path = REPO_ROOT / ".cache" / "media",
    jpeg_quality: int = 85,
    threads: int = 2,
) -> SceneData:
    """Render (or reuse) scene `preset`/`seed` and compute (or load) its cached detections.

    `render_frames` renders a scene of that length (default: the preset's); `max_frames`
    simulates only the first frames of it (and reuses a longer cache).
    """
    scene = ensure_scene(preset, SEED_BASE + seed, cache_dir / "scenes", media_dir, render_frames)
    frames = scene.n_frames if max_frames is None else min(max_frames, scene.n_frames)
    tag = models_tag()
    arrays = _cached(scene, frames, jpeg_quality, threads, cache_dir / "detections" / tag)
    seqinfo = (scene.root / "seqinfo.ini").read_text().splitlines()
    info = dict(line.split("=", 1) for line in seqinfo if "=" in line)
    camera, expected = None, []
    if preset == "events":
        camera = _events_camera(scene, cache_dir)
        fps = float(info["frameRate"])
        expected = [
            e
            for e in load_expected(scene.root / "events.json")
            if e.time_s < frames / fps - 0.5  # events near the cut could not be seen in time
        ]
    label = preset if seed == 1 else f"{preset}:{seed}"
    return SceneData(
        label=label,
        preset=preset,
        scene=replace(scene, ground_truth=scene.ground_truth[:frames]),
        fps=float(info["frameRate"]),
        width=int(info["imWidth"]),
        height=int(info["imHeight"]),
        edge=_unpack(arrays, "edge_")[:frames],
        edge_ms=arrays["edge_ms"].astype(np.float64)[:frames],
        cloud=_unpack(arrays, "cloud_")[:frames],
        cloud_ms=arrays["cloud_ms"].astype(np.float64)[:frames],
        frame_bytes=arrays["frame_bytes"].astype(np.int64)[:frames],
        jpeg_quality=jpeg_quality,
        camera=camera,
        expected=expected,
        cache_tag=tag,
    )


def models_tag() -> str:
    """Names the committed edge and cloud models and their detector settings (a hash of the
    files and of the configs bar the runtime): cached detections live under it, so a
    retrained model or a changed NMS never meets another's cache."""
    digest = hashlib.sha256()
    for path in (EDGE_MODEL, CLOUD_MODEL):
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    for config in (edge_detector_config(1), cloud_detector_config(1)):
        digest.update(detector_settings_digest(config))
    return f"models-{digest.hexdigest()[:12]}"


def detector_settings_digest(config: DetectorConfig) -> bytes:
    """A digest of what a detector config decides about its boxes (the runtime aside: the
    model file is hashed on its own, threads change nothing)."""
    settings = config.model_dump(mode="json", exclude={"runtime"})
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).digest()


def _cached(
    scene: Scene, frames: int, jpeg_quality: int, threads: int, folder: Path
) -> dict[str, npt.NDArray[np.generic]]:
    """The cache of `scene` covering at least `frames` frames (computed when there is none)."""
    name = scene.root.name
    found = sorted(
        (int(p.name.rsplit("-", 2)[1][:-1]), p)
        for p in folder.glob(f"{name}-*f-q{jpeg_quality}.npz")
    )
    path = next((p for n, p in found if n >= frames), None)
    if path is None:
        path = folder / f"{name}-{frames}f-q{jpeg_quality}.npz"
        _compute_cache(scene, frames, jpeg_quality, threads, path)
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _compute_cache(scene: Scene, frames: int, jpeg_quality: int, threads: int, out: Path) -> None:
    logger.warning("caching edge and cloud detections of %s (%d frames)", scene.root.name, frames)
    names = class_names()
    edge, edge_ms, cloud, cloud_ms, sizes = [], [], [], [], []
    # Edge first, on its own: its time per frame is the edge loop's detector time.
    with edge_detector(threads) as detector:
        for image in read_frames(str(scene.video), frames):
            started = time.perf_counter()
            (found,) = detector.detect([image])
            edge_ms.append((time.perf_counter() - started) * 1000.0)
            edge.append(found)
    processor, cloud_detector = cloud_processor(threads)
    with cloud_detector:
        for index, image in enumerate(read_frames(str(scene.video), frames)):
            request = frame_request(image, index, jpeg_quality)
            sizes.append(payload_bytes(request))
            started = time.perf_counter()
            (result,) = processor.process([request])
            cloud_ms.append((time.perf_counter() - started) * 1000.0)
            cloud.append(detections_from_result(result, names))
    arrays: dict[str, npt.NDArray[np.generic]] = {
        **{f"edge_{k}": v for k, v in _pack(edge).items()},
        **{f"cloud_{k}": v for k, v in _pack(cloud).items()},
        "edge_ms": np.array(edge_ms),
        "cloud_ms": np.array(cloud_ms),
        "frame_bytes": np.array(sizes, dtype=np.int64),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)  # type: ignore[arg-type]
    tmp.replace(out)


# -- the cloud's answers ------------------------------------------------------------------------


class Closeable(Protocol):
    """What holds a model open."""

    def close(self) -> None:
        """Release it."""
        ...


ProcessorFactory = Callable[[], tuple[DetectorFrameProcessor, Closeable]]
"""Makes the cloud's frame processor (and what to close after it)."""


def detection_rows(found: Detections) -> list[list[float]]:
    """`found` as JSON rows `[x1, y1, x2, y2, confidence, class_id]`."""
    return [
        [*map(float, b), float(c), float(k)]
        for b, c, k in zip(found.xyxy, found.confidence, found.class_id, strict=True)
    ]


def detections_of(rows: Sequence[Sequence[float]]) -> Detections:
    """The `Detections` of JSON rows made by `detection_rows`."""
    if not rows:
        return Detections.empty()
    array = np.array(rows, dtype=np.float32).reshape(-1, 6)
    return Detections(array[:, :4], array[:, 4], array[:, 5].astype(np.int64))


class DetectionsCache:
    """Detections computed once per key and kept in a JSON file (written atomically)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._rows: dict[str, list[list[float]]] = (
            json.loads(path.read_text()) if path.is_file() else {}
        )
        self._dirty = False
        self.computed = 0  # entries computed in this process

    def get(self, key: str, compute: Callable[[], Detections]) -> Detections:
        """The cached detections of `key`, computed (and counted) when missing."""
        rows = self._rows.get(key)
        if rows is None:
            rows = self._rows[key] = detection_rows(compute())
            self._dirty = True
            self.computed += 1
        return detections_of(rows)

    def save(self) -> None:
        """Write what was computed so far."""
        if not self._dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._rows))
        tmp.replace(self.path)
        self._dirty = False


class CloudAnswers(DetectionsCache):
    """The cloud service's answer to a request: cached whole frames, crops computed once.

    Crop answers run the service's `DetectorFrameProcessor` on the real request (JPEG crops,
    boxes mapped back to source pixels) and are kept in a JSON file per scene, keyed by frame,
    quality and regions, so later runs and variants that send the same crops reuse them.
    """

    def __init__(
        self,
        data: SceneData,
        cache_dir: Path = CACHE,
        threads: int = 2,
        processor: ProcessorFactory | None = None,
    ) -> None:
        super().__init__(cache_dir / "regions" / data.cache_tag / f"{data.scene.root.name}.json")
        self.data = data
        self._factory = processor or (lambda: cloud_processor(threads))
        self._processor: tuple[DetectorFrameProcessor, Closeable] | None = None
        self._videos = VideoSessions()
        self._chains: dict[str, hashlib._Hash] = {}

    def answer(self, request: pb.FrameRequest) -> Detections:
        """The detections (edge class ids, threshold `CACHE_THRESHOLD`) the cloud returns."""
        frame_id = int(request.frame_id)
        if request.HasField("video"):
            return self._video_answer(request)
        if request.jpeg and request.jpeg_quality == self.data.jpeg_quality:
            return self.data.cloud[frame_id]
        regions = [(r.x1, r.y1, r.x2, r.y2) for r in request.regions]
        key = f"{frame_id}|q{request.jpeg_quality}|{'' if request.jpeg else regions}"
        return self.get(key, lambda: self._run(request))

    def _run(self, request: pb.FrameRequest) -> Detections:
        (result,) = self._service()[0].process([request])
        return detections_from_result(result, self.data.class_names)

    def _service(self) -> tuple[DetectorFrameProcessor, Closeable]:
        if self._processor is None:
            self._processor = self._factory()
        return self._processor

    def _video_answer(self, request: pb.FrameRequest) -> Detections:
        """The answer on the decoded video packet, decoded as the service does (its session's
        decoder, packet after packet) and cached under the hash of every packet of the session
        so far: the picture depends on the whole chain, so a cached answer is exact."""
        video = request.video
        if video.keyframe:
            self._chains[video.session] = hashlib.sha256()
        chain = self._chains[video.session]
        chain.update(hashlib.sha256(video.data).digest())
        key = f"{request.frame_id}|{video.codec}|{chain.hexdigest()[:24]}"
        # decoded whether or not the answer is cached: the next packet references this one
        picture = self._videos.decode(request.agent_id, request.camera_id, video)

        def detect() -> Detections:
            processor = DetectorFrameProcessor(
                self._service()[0].models, videos=DecodedPicture(picture)
            )
            (result,) = processor.process([request])
            return detections_from_result(result, self.data.class_names)

        return self.get(key, detect)

    def close(self) -> None:
        """Save, and release the cloud detector."""
        self.save()
        if self._processor is not None:
            self._processor[1].close()
            self._processor = None


class DecodedPicture:
    """A `VideoDecoder` that hands the processor a picture decoded beforehand (any request
    with a `video` field then detects on exactly that picture)."""

    codecs = SUPPORTED_CODECS

    def __init__(self, picture: npt.NDArray[np.uint8]) -> None:
        self._picture = picture

    def decode(self, agent_id: str, camera_id: str, packet: pb.VideoPacket) -> BgrImage:
        """The picture given at construction."""
        return self._picture


def _tile_key(tile: Tile) -> str:
    return f"{tile.x0},{tile.y0},{tile.width},{tile.height}"


class EdgeCrops(DetectionsCache):
    """The edge detector's boxes in focus crops (`edge_agent.pipeline.focus`), in crop pixels,
    computed once per (frame, crop) and kept in a JSON file per scene like `CloudAnswers`."""

    def __init__(
        self,
        data: SceneData,
        cache_dir: Path = CACHE,
        threads: int = 2,
        detector: Callable[[], Detector] | None = None,
    ) -> None:
        super().__init__(cache_dir / "focus" / data.cache_tag / f"{data.scene.root.name}.json")
        self._factory = detector or (lambda: edge_detector(threads))
        self._detector: Detector | None = None

    def detect(
        self, index: int, image: npt.NDArray[np.uint8], tiles: Sequence[Tile], per_side: int = 1
    ) -> list[tuple[Tile, Detections]]:
        """The edge detector's boxes (threshold `CACHE_THRESHOLD`) in each of `tiles` of frame
        `index`, run as the agent runs them: `per_side` x `per_side` crops a detector run
        (`edge_agent.pipeline.mosaic`; a crop's boxes then depend on the others in its run, so
        they are kept under the whole run's key)."""
        keys = [_tile_key(tile) for tile in tiles]
        size = max(1, per_side) ** 2
        if per_side > 1:
            runs = [keys[i : i + size] for i in range(0, len(keys), size)]
            keys = [f"m{per_side}:{'/'.join(run)}:{key}" for run in runs for key in run]
        found: dict[int, list[Detections]] = {}  # first crop of a run -> its crops' boxes

        def run(i: int) -> Detections:  # the detector run holding crop `i`, on its first miss
            start = i - i % size
            if start not in found:
                planned = [("", image, tile) for tile in tiles[start : start + size]]
                computed = detect_crops(self.detector(), planned, per_side)[""]
                found[start] = [boxes for _, boxes in computed]
            return found[start][i - start]

        return [
            (tile, self.get(f"{index}|{key}", functools.partial(run, i)))
            for i, (tile, key) in enumerate(zip(tiles, keys, strict=True))
        ]

    def detector(self) -> Detector:
        """The edge detector, made on first use."""
        if self._detector is None:
            self._detector = self._factory()
        return self._detector

    def close(self) -> None:
        """Save, and release the detector."""
        self.save()
        if self._detector is not None:
            self._detector.close()
            self._detector = None


# -- one variant on one scene -------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One pipeline set-up: edge only, cloud on every frame, or hybrid with an escalation policy.

    `rtt_frames`: frames between sending a frame and folding in its answer (>= 1);
    `cloud_threshold`: the cloud service's `confidence_threshold`. `native_crops` is a what-if:
    crop requests are answered with the whole-frame detections (fusion keeps those centred in
    the regions), as a cloud that detected each crop at its own scale (no upscaling to the
    model's input) would roughly answer; bytes are still those of the real crops.
    `oracle=True` is the ceiling of the machinery: every answer is the frame's ground truth
    (visible boxes at score 1; fusion keeps those centred in the regions of a crop request),
    with the same budget, round trip and bytes. What it leaves to gain is the cloud model's part.
    `stream=True` (cloud mode) streams the camera to the cloud: the uplink is the camera's own
    H.264 stream (`SceneData.stream_bytes`), and the cloud's boxes are those on every frame as
    cloud-only sees it (the JPEG at `jpeg_quality` of the decoded frame). `tracker` replaces
    the scene's tracker settings (`SceneData.tracker`) where set. `focus_runs` is the edge
    box's time for focus crops: that many detector runs a frame, the crops packed to fit as the
    agent packs them (`FocusBudget`, `focus.mosaic`); None, as many as the plan asks for.
    """

    name: str
    mode: Mode
    escalation: EscalationConfig = field(default_factory=EscalationConfig)
    rtt_frames: int = 4
    cloud_threshold: float = 0.2
    native_crops: bool = False
    oracle: bool = False
    group: str = ""
    is_default: bool = False
    stream: bool = False  # cloud mode only: the camera's H.264 stream is the uplink
    tracker: TrackerConfig | None = None
    focus_runs: int | None = None  # detector runs on focus crops a frame (None: as asked)


def focus_run_variants(fps: float, escalation: EscalationConfig, **common: Any) -> list[Variant]:
    """The hybrid at `fps` frames/s with `escalation` on a box with time for one detector run
    on focus crops a frame (the busy real demo ran 10-23 % of the crops it planned), its crops
    packed to fit (`focus.mosaic`) and not; `common`: the other `Variant` fields both share."""
    alone = escalation.focus.model_copy(update={"mosaic": 1})
    return [
        Variant(
            f"hybrid {fps:g} f/s, one crop run a frame",
            "hybrid",
            escalation,
            focus_runs=1,
            **common,
        ),
        Variant(
            f"hybrid {fps:g} f/s, one crop run a frame, not packed",
            "hybrid",
            escalation.model_copy(update={"focus": alone}),
            focus_runs=1,
            **common,
        ),
    ]


def with_recovery(name: str) -> str:
    """The name of `name`'s row with the tracker's recovery (`recovery_variants`)."""
    return f"{name}, recovery {RECOVER_IOU:g}"


def recovery_variants(
    tracker: TrackerConfig, fps: float, escalation: EscalationConfig, **common: Any
) -> list[Variant]:
    """Edge only, and the hybrid at `fps` frames/s with `escalation`, with `tracker`'s
    observation-centric recovery on (`tracker.recover_iou` at `RECOVER_IOU`); `common`: the
    other `Variant` fields both share."""
    recovering = tracker.model_copy(update={"recover_iou": RECOVER_IOU})
    return [
        Variant(with_recovery("edge only"), "edge", tracker=recovering, **common),
        Variant(
            with_recovery(f"hybrid {fps:g} f/s"), "hybrid", escalation, tracker=recovering, **common
        ),
    ]


@dataclass
class SimRun:
    """What one variant did on one scene, frame by frame and in total."""

    outputs: list[Detections] = field(default_factory=list)  # tracked, per frame
    events: list[RuleEvent] = field(default_factory=list)
    hard: int = 0
    sent: int = 0
    sent_regions: int = 0
    focus_crops: int = 0  # crops the edge detector looked at closer
    refused_budget: int = 0
    bytes_sent: int = 0
    fusion: FusionTally = field(default_factory=FusionTally)  # what the answers did
    sent_frames: list[int] = field(default_factory=list)
    created_ids: set[int] = field(default_factory=set)  # track ids fusion started
    loop_ms: list[float] = field(default_factory=list)  # per frame: detector + loop work
    encode_ms: list[float] = field(default_factory=list)  # per sent frame
    keyframes: int = 0  # video uplink keyframes among the sent frames


def reported_ids(run: SimRun) -> set[int]:
    """Track ids that appear in the pipeline's output on some frame."""
    return {int(i) for t in run.outputs for i in t.tracker_id if i >= 0}


@dataclass(frozen=True)
class _InFlight:
    due_frame: int
    frame_id: int
    cloud: Detections


class SimClock:
    """Simulated monotonic seconds: the time of the frame being processed."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def fusion_settings(
    config: EscalationConfig, fps: float, classes: tuple[int, ...] | None = None
) -> FusionSettings:
    """`FusionSettings` exactly as the agent builds them (for a detector keeping `classes`)."""
    return FusionSettings.from_config(config.fusion, fps, classes)


def sim_camera(data: SceneData) -> CameraConfig:
    """The scene's camera as the pipeline sees it: zones and rules on `events` scenes, analysed
    at the scene's frame rate with the motion gate off (every frame of the test world counts)."""
    base = data.camera or CameraConfig(name=CAMERA, url=str(data.scene.video))
    return base.model_copy(update={"target_fps": data.fps, "motion": MotionConfig(enabled=False)})


def oracle_answer(data: SceneData, index: int) -> Detections:
    """The ground truth of frame `index` as a perfect cloud would answer it: the boxes the
    scores count (not ignored), class ids as the edge's, score 1."""
    truth = ground_truth_boxes([data.scene.ground_truth[index]])[0]
    keep = ~truth.ignore
    return Detections(
        xyxy=truth.xyxy[keep],
        confidence=np.ones(int(keep.sum()), dtype=np.float32),
        class_id=truth.class_id[keep],
    )


def simulate(
    data: SceneData,
    variant: Variant,
    answers: CloudAnswers | None = None,
    crops: EdgeCrops | None = None,
) -> SimRun:
    """Run `variant` over every frame of `data` on simulated time; see the module docstring.

    The frame loop is the agent's own `CameraPipeline` (tracker, rules, escalation decision,
    fusion); what is simulated is the detector (cached outputs), the clock and the network.
    """
    if variant.rtt_frames < 1:
        raise ValueError(f"rtt_frames must be >= 1, got {variant.rtt_frames}")
    if variant.mode == "hybrid" and not variant.oracle and answers is None:
        raise ValueError("a hybrid variant needs CloudAnswers (or oracle=True)")
    config = variant.escalation
    clock = SimClock()
    policy = EscalationPolicy.from_config(config, clock) if variant.mode == "hybrid" else None
    pipeline = CameraPipeline(
        sim_camera(data),
        CameraTracker.from_config(
            data.tracker if variant.tracker is None else variant.tracker,
            data.detector_threshold,
            NoEmbedder(),
            GroupKeys.from_names(data.class_groups, data.class_names),
        ),
        data.class_names,
        fusion=fusion_settings(config, data.fps, data.edge_classes),
        escalator=policy,
        focus=config.focus if variant.mode == "hybrid" else None,
        clock=lambda: SCENE_START_S + clock.now_s,
    )
    rtt_s = variant.rtt_frames / data.fps
    in_flight: list[_InFlight] = []
    run = SimRun()
    uplinks = CameraUplinks(config.uplink, camera_budget_bytes_per_s=config.per_camera_bytes_per_s)
    codecs = frozenset({config.uplink.codec})  # the simulated cloud decodes what is configured
    for index, image in enumerate(data.frames()):
        clock.now_s = now = index / data.fps
        started = time.perf_counter()
        while in_flight and in_flight[0].due_frame <= index:  # as `EdgeAgent._fuse_answers`
            answer = in_flight.pop(0)
            assert policy is not None  # noqa: S101 (only hybrid runs send)
            policy.observe_answer(rtt_s=rtt_s)
            before = {t.track_id for t in pipeline.tracker.tracker.tracks}
            pipeline.fuse(answer.frame_id, answer.cloud)
            run.created_ids.update({t.track_id for t in pipeline.tracker.tracker.tracks} - before)
        if variant.mode == "cloud":
            detections = above(data.cloud[index], variant.cloud_threshold)
        else:
            detections = data.edge[index]
        frame = CapturedFrame(CAMERA, index, SCENE_START_S + now, now, image)
        if not pipeline.admit(frame):
            raise RuntimeError(f"frame {index} of {data.label} not admitted at the scene's rate")
        tiles = pipeline.focus_tiles(frame)
        if tiles and crops is None:
            raise ValueError("a hybrid variant with focus crops needs EdgeCrops")
        most = pipeline.focus.mosaic if pipeline.focus is not None else 1
        side, granted = packing(len(tiles), variant.focus_runs, most)  # as the agent's budget
        tiles = tiles[:granted]
        focus = crops.detect(index, image, tiles, side) if crops and tiles else []
        outcome = pipeline.process(frame, detections, focus=focus)
        run.events += outcome.events
        run.outputs.append(outcome.detections)
        decision = outcome.decision
        if decision is not None:
            run.hard += int(bool(decision.reasons))
            run.refused_budget += int(decision.refused_by_budget)
        loop_ms = (time.perf_counter() - started) * 1000.0
        if variant.mode != "cloud":  # the detector on the frame and on each run of crops
            loop_ms += float(data.edge_ms[index]) * (1 + runs_for(len(tiles), side))
        run.loop_ms.append(loop_ms)
        if variant.mode == "cloud":
            started = time.perf_counter()
            request = frame_request(image, index, data.jpeg_quality)
            run.encode_ms.append((time.perf_counter() - started) * 1000.0)
            run.sent += 1
            run.sent_frames.append(index)
            run.bytes_sent += 0 if variant.stream else payload_bytes(request)
            continue
        if decision is None or not decision.send:
            continue
        assert policy is not None  # noqa: S101 (a decision comes from it)
        started = time.perf_counter()
        video = None
        if decision.mode == "frame":  # the agent's stage: whole frames go as video packets
            video = uplinks.encode(CAMERA, image, now, stream_id=1, codecs=codecs)
        request = request_for_decision(
            image,
            decision,
            agent_id=AGENT,
            camera_id=CAMERA,
            frame_id=index,
            capture_time_s=SCENE_START_S + now,
            jpeg_quality=config.jpeg_quality,
            region_jpeg_quality=config.regions.jpeg_quality,
            video=video,
        )
        run.encode_ms.append((time.perf_counter() - started) * 1000.0)
        run.keyframes += int(video is not None and video.keyframe)
        n_bytes = payload_bytes(request)
        policy.record_encoded(CAMERA, decision, n_bytes, payload_pixels(request))
        run.sent += 1
        run.sent_frames.append(index)
        run.sent_regions += int(decision.mode == "regions")
        run.bytes_sent += n_bytes
        if variant.oracle:
            cloud = oracle_answer(data, index)
        elif variant.native_crops and decision.regions:
            cloud = above(data.cloud[index], variant.cloud_threshold)
        else:
            assert answers is not None  # noqa: S101 (checked above for hybrid)
            cloud = above(answers.answer(request), variant.cloud_threshold)
        in_flight.append(_InFlight(index + variant.rtt_frames, index, cloud))
    if variant.stream:
        run.bytes_sent = data.stream_bytes
    run.events += pipeline.withdrawn()
    run.fusion = pipeline.counters.fusion
    run.focus_crops = pipeline.counters.focus_crops
    return run


# -- scores -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunScores:
    """Accuracy of one run against the scene's ground truth."""

    map50: float
    precision: float
    recall: float
    f1: float
    tracking: TrackingScores | None  # None where the ground truth has no identities
    alerts: EventMatch | None

    @property
    def idf1(self) -> float:
        """Tracking IDF1 (NaN without identities)."""
        return math.nan if self.tracking is None else self.tracking.idf1

    @property
    def mota(self) -> float:
        """Tracking MOTA (NaN without identities)."""
        return math.nan if self.tracking is None else self.tracking.mota


def ground_truth_boxes(frames: Sequence[GroundTruthFrame]) -> list[GroundTruth]:
    """`GroundTruth` per frame for `compute_metrics`, ignoring boxes `score_tracking` ignores."""
    out = []
    for frame in frames:
        xywh = frame.boxes.xywh
        out.append(
            GroundTruth(
                xyxy=np.column_stack([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]]).astype(np.float32),
                class_id=frame.class_id,
                ignore=frame.ignored(MIN_VISIBILITY, MIN_SIDE_PX),
            )
        )
    return out


def confirmed(tracked: Detections) -> Detections:
    """The boxes of confirmed tracks (what the pipeline reports), with their confidences."""
    keep = tracked.tracker_id >= 0
    return Detections(
        tracked.xyxy[keep],
        tracked.confidence[keep],
        tracked.class_id[keep],
        tracked.tracker_id[keep],
    )


def f1_counts(
    truths: Sequence[GroundTruth], predictions: Sequence[Detections], iou: float = 0.5
) -> tuple[int, int, int]:
    """(true positives, false positives, misses) at `iou`, per class, greedy by confidence.

    A prediction matched to an ignored box counts as neither (as in `compute_metrics`).
    """
    tp = fp = fn = 0
    for truth, pred in zip(truths, predictions, strict=True):
        for cls in np.union1d(truth.class_id, pred.class_id):
            g = truth.class_id == cls
            gt_boxes, ignore = truth.xyxy[g], truth.ignore[g]
            p = pred.class_id == cls
            order = np.argsort(-pred.confidence[p], kind="stable")
            boxes = pred.xyxy[p][order]
            taken = np.zeros(len(gt_boxes), dtype=bool)
            ious = box_iou_coco(boxes, gt_boxes) if len(gt_boxes) and len(boxes) else None
            for row in range(len(boxes)):
                best, best_iou = -1, iou
                if ious is not None:
                    # Prefer a non-ignored box; an ignored one only when no other matches.
                    for want_ignored in (False, True):
                        for col in np.flatnonzero((~taken) & (ignore == want_ignored)):
                            if ious[row, col] >= best_iou:
                                best, best_iou = int(col), float(ious[row, col])
                        if best >= 0:
                            break
                if best < 0:
                    fp += 1
                    continue
                taken[best] = True
                tp += int(not ignore[best])
            fn += int(((~taken) & (~ignore)).sum())
    return tp, fp, fn


def observed_events(events: Sequence[RuleEvent], names: Sequence[str]) -> list[SceneEvent]:
    """`start` events of tracked objects as `SceneEvent`s, timed from the scene's first frame
    (what `testbed.alert_check.observed_from_payloads` makes of the MQTT payloads), less those
    a later `retract` withdrew."""
    retracted = {(e.rule, e.track_id, e.timestamp_s) for e in events if e.phase == "retract"}
    return [
        SceneEvent(
            kind=e.kind,
            class_name=names[e.class_id],
            place=e.zone or e.line or "",
            direction=e.direction,
            time_s=e.timestamp_s - SCENE_START_S,
        )
        for e in events
        if e.phase == "start"
        and 0 <= e.class_id < len(names)
        and (e.rule, e.track_id, e.timestamp_s) not in retracted
    ]


def score_run(data: SceneData, run: SimRun) -> RunScores:
    """Detection, tracking and alert accuracy of `run` on `data`."""
    names = data.class_names
    truths = ground_truth_boxes(data.scene.ground_truth)
    predictions = [confirmed(t) for t in run.outputs]
    metrics = compute_metrics(truths, predictions, class_names=names)
    tp, fp, fn = f1_counts(truths, predictions)
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    tracking = None
    if data.scored_tracking:
        hypotheses: list[FrameBoxes] = [hypotheses_of(t) for t in run.outputs]
        tracking = score_tracking(data.scene.ground_truth, hypotheses)
    alerts = None
    if data.camera is not None:
        alerts = match_events(data.expected, observed_events(run.events, names))
    return RunScores(metrics.map50, precision, recall, f1, tracking, alerts)
