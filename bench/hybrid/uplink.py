"""The uplink's quality ladder: bytes against the cloud's accuracy on what it decodes.

    python -m bench.hybrid.uplink [--clips vtest,bikes] [--scenes crowded,small_far]
        [--rate 2] [--frames 400] [--threads 2]

The same escalated frames (a fixed rate, about `--rate` frames/s, so that only the encoding
differs) go through each encoding the edge can send: independent JPEGs at several qualities (the
previous uplink: q85), and the video uplink (`edge_agent.escalation.uplink`: only the escalated
frames, coded against each other) in H.264 and HEVC at several CRFs and at half width. The cloud
decodes them as the service does (the CPU JPEG decoder; `VideoSessions`) and runs its detector on
the pictures. Per encoding: uplink bytes per second and their share of the camera's own H.264
stream over the same seconds (`bench.hybrid._hybrid_sim.camera_stream_bytes`: libx264 veryfast CRF
20, a keyframe a second, as every bench clip is made), the edge's encoding time, the cloud's
decoding time per frame, and the accuracy of the cloud's boxes:
- test-world scenes: against their exact ground truth (mAP50, F1);
- real clips: against the hand-verified truth (`bench.models.truth`, on the escalated frames that
  have verified boxes: person and vehicle AP50 and F1), and, as a second column, the agreement (F1)
  with the cloud on the decoded camera frames themselves, which is what streaming the camera to
  the cloud gives.
The first row, "camera stream", is that baseline: the cloud on every escalated frame as decoded
from the camera's stream, at the stream's bytes.

Writes `bench/results/uplink.{md,json}`.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench import harness
from bench.harness import REPO_ROOT, RESULTS
from bench.hybrid import _hybrid_sim as sim
from bench.hybrid import real_hybrid as real
from bench.models import truth as verified
from cloud_service.decoders import CpuDecoder
from cloud_service.decoders.video import VideoSessions
from cloud_service.engines import Engine
from cloud_service.models import ModelInfo
from cloud_service.processor import DetectorFrameProcessor
from detection.coco_eval import GroundTruth, compute_metrics
from detection.detections import Detections
from edge_agent.config.uplink import UplinkConfig
from edge_agent.detect_command import read_frames
from edge_agent.escalation import build_frame_request
from edge_agent.escalation.encode import detections_from_result, encode_jpeg
from edge_agent.escalation.uplink import EncodedPacket, VideoUplinkEncoder
from protos.analytics.v1 import analytics_pb2 as pb
from testbed.media import sample_clip

logger = logging.getLogger(__name__)

AGENT, CAMERA = "bench-uplink", "cam"
Image = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class Encoding:
    """One rung of the ladder: `codec` jpeg (quality 1-100) or h264/hevc (CRF)."""

    label: str
    codec: str
    quality: int
    max_width: int = 0  # -2: half the source's width
    preset: str = "veryfast"
    previous_default: bool = False
    default: bool = False


LADDER = (
    Encoding("JPEG q85", "jpeg", 85, previous_default=True),
    Encoding("JPEG q40", "jpeg", 40),
    Encoding("H.264 CRF 18", "h264", 18),
    Encoding("H.264 CRF 20", "h264", 20, default=True),
    Encoding("H.264 CRF 23", "h264", 23),
    Encoding("H.264 CRF 28", "h264", 28),
    Encoding("H.264 CRF 33", "h264", 33),
    Encoding("H.264 CRF 20, ultrafast", "h264", 20, preset="ultrafast"),
    Encoding("H.264 CRF 20, half width", "h264", 20, max_width=-2),
    Encoding("HEVC CRF 20", "hevc", 20),
)


@dataclass
class Source:
    """A clip or scene, its escalated frames, and how the cloud's boxes on them are scored."""

    label: str
    kind: str  # "scene" or "clip"
    fps: float
    width: int
    height: int
    n_frames: int
    indices: list[int]
    images: list[Image]
    stream_bytes: int  # of the camera's H.264 stream over all `n_frames`
    names: list[str]
    processor: Callable[[], tuple[DetectorFrameProcessor, sim.Closeable]]
    score: Callable[[dict[int, Detections], dict[int, Detections]], dict[str, float]]
    notes: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        """Seconds of video the escalated frames are spread over."""
        return self.n_frames / self.fps


def _schedule(n_frames: int, fps: float, rate: float, truth_step: int | None) -> list[int]:
    """Frames at about `rate` per second; where verified frames come every `truth_step`
    frames, the step is the divisor or multiple of it nearest to fps / rate, so the escalated
    frames meet the verified ones."""
    step = max(1.0, fps / rate)
    if truth_step:
        candidates = [d for d in range(1, truth_step + 1) if truth_step % d == 0]
        candidates += [truth_step * k for k in range(2, 20)]
        chosen = min(candidates, key=lambda c: (abs(c - step), c))
    else:
        chosen = max(1, round(step))
    return list(range(0, n_frames, chosen))


def _read(video: Path, indices: Sequence[int]) -> list[Image]:
    wanted, out = set(indices), []
    for index, image in enumerate(read_frames(str(video), max(indices) + 1)):
        if index in wanted:
            out.append(image)
    return out


def scene_source(spec: str, rate: float, frames: int | None, threads: int) -> Source:
    """A test-world scene: boxes scored against its ground truth."""
    preset, _, seed = spec.partition(":")
    data = sim.prepare_scene(preset, int(seed) if seed else 1, max_frames=frames, threads=threads)
    indices = _schedule(data.n_frames, data.fps, rate, None)
    truths = sim.ground_truth_boxes([data.scene.ground_truth[i] for i in indices])
    names = data.class_names

    def score(found: dict[int, Detections], _: dict[int, Detections]) -> dict[str, float]:
        predictions = [found[i] for i in indices]
        metrics = compute_metrics(truths, predictions, class_names=names)
        confident = [sim.above(p, 0.2) for p in predictions]
        tp, fp, fn = sim.f1_counts(truths, confident)
        return {"map50": metrics.map50, "f1": 2 * tp / max(2 * tp + fp + fn, 1)}

    return Source(
        label=data.label,
        kind="scene",
        fps=data.fps,
        width=data.width,
        height=data.height,
        n_frames=data.n_frames,
        indices=indices,
        images=_read(data.scene.video, indices),
        stream_bytes=data.stream_bytes,
        names=names,
        processor=lambda: sim.cloud_processor(threads),
        score=score,
        notes=["ground truth of the generated scene"],
    )


CPU_CLOUD_CONFIG = REPO_ROOT / "configs" / "cloud-service.cpu.yaml"


def config_processor(config_path: Path, threads: int) -> tuple[DetectorFrameProcessor, Engine]:
    """The service's frame processor around the engine of a shipped cloud config (CPU here)."""
    engine = real.cloud_engine(threads, config_path)
    model = ModelInfo(name="nanodet-coco", version="cloud", class_names=tuple(real.coco_names()))
    return DetectorFrameProcessor(engine, model), engine


def clip_source(
    name: str, rate: float, frames: int, threads: int, cloud_config: Path = CPU_CLOUD_CONFIG
) -> Source:
    """A real clip: boxes scored against the verified truth where it exists."""
    video = sample_clip(real.MEDIA, name=name)
    data = real.prepare_clip(name, frames, threads, 0.5)
    truth = verified.clip_truth(name)
    truth_frames = sorted(i for i in truth.frames if i < data.n_frames) if truth else []
    step = truth_frames[1] - truth_frames[0] if len(truth_frames) > 1 else None
    indices = _schedule(data.n_frames, data.fps, rate, step)
    names = real.coco_names()
    scored = [i for i in indices if i in set(truth_frames)]

    def score(found: dict[int, Detections], baseline: dict[int, Detections]) -> dict[str, float]:
        out: dict[str, float] = {}
        street = {i: real._street(d, names) for i, d in found.items()}
        if truth is not None and scored:
            subset = verified.ClipTruth(
                truth.clip, truth.width, truth.height, {i: truth.frames[i] for i in scored}
            )
            tallies = verified.score_frames(subset, {i: street[i] for i in scored}, names)
            out["map50"] = verified.mean_ap50(tallies)
            confident = {i: sim.above(street[i], 0.3) for i in scored}
            tallies = verified.score_frames(subset, confident, names)
            out["f1"] = float(np.nanmean([t.f1 for t in tallies.values() if t.truth]))
        if baseline:
            truths = [_as_truth(sim.above(baseline[i], 0.5)) for i in indices]
            predictions = [sim.above(street[i], 0.3) for i in indices]
            tp, fp, fn = sim.f1_counts(truths, predictions)
            out["agreement_f1"] = 2 * tp / max(2 * tp + fp + fn, 1)
        return out

    notes = [
        f"cloud: {cloud_config.name}",
        f"verified truth on {len(scored)} of the escalated frames"
        if scored
        else "no verified truth: agreement with the camera-stream row only",
    ]
    return Source(
        label=name,
        kind="clip",
        fps=data.fps,
        width=data.width,
        height=data.height,
        n_frames=data.n_frames,
        indices=indices,
        images=_read(video, indices),
        stream_bytes=sim.camera_stream_bytes(video, data.n_frames),
        names=names,
        processor=lambda: config_processor(cloud_config, threads),
        score=score,
        notes=notes,
    )


def _as_truth(found: Detections) -> GroundTruth:
    return GroundTruth(
        xyxy=found.xyxy.astype(np.float32),
        class_id=found.class_id.astype(np.int64),
        ignore=np.zeros(len(found), dtype=bool),
    )


@dataclass
class Row:
    """One encoding on one source."""

    encoding: str
    bytes: int
    keyframes: int
    encode_ms: list[float]
    decode_ms: list[float]
    scores: dict[str, float]


def _requests(source: Source, encoding: Encoding) -> tuple[list[pb.FrameRequest], Row]:
    """The requests the edge sends for the source's escalated frames, and their cost."""
    encoder: VideoUplinkEncoder | None = None
    if encoding.codec != "jpeg":
        width = source.width // 2 if encoding.max_width == -2 else encoding.max_width
        config = UplinkConfig(
            codec=encoding.codec,  # type: ignore[arg-type]
            crf=encoding.quality,
            max_crf=encoding.quality,
            max_width=width,
            preset=encoding.preset,  # type: ignore[arg-type]
            keyframe_interval_s=3_600.0,
        )
        encoder = VideoUplinkEncoder(config, budget_bytes_per_s=1e12)
    requests, encode_ms, total, keyframes = [], [], 0, 0
    for index, image in zip(source.indices, source.images, strict=True):
        started = time.perf_counter()
        packet: EncodedPacket | None = None
        if encoder is not None:
            packet = encoder.encode(image, index / source.fps)
            payload = len(packet.data)
            keyframes += int(packet.keyframe)
            request = build_frame_request(
                image,
                agent_id=AGENT,
                camera_id=CAMERA,
                frame_id=index,
                capture_time_s=sim.SCENE_START_S,
                jpeg_quality=85,
                video=packet,
            )
        else:
            request = pb.FrameRequest(
                agent_id=AGENT,
                camera_id=CAMERA,
                frame_id=index,
                request_id=f"{CAMERA}/{index}",
                jpeg=encode_jpeg(image, encoding.quality),
                jpeg_quality=encoding.quality,
                original_width=image.shape[1],
                original_height=image.shape[0],
            )
            payload = len(request.jpeg)
        encode_ms.append((time.perf_counter() - started) * 1000.0)
        total += payload
        requests.append(request)
    return requests, Row(encoding.label, total, keyframes, encode_ms, [], {})


def _decode_times(requests: Sequence[pb.FrameRequest]) -> list[float]:
    """The cloud's decoding time per frame, as the service decodes (one frame at a time)."""
    jpeg, videos, out = CpuDecoder(threads=1), VideoSessions(), []
    try:
        for request in requests:
            started = time.perf_counter()
            if request.HasField("video"):
                videos.decode(request.agent_id, request.camera_id, request.video)
            else:
                jpeg.decode_batch([request.jpeg])
            out.append((time.perf_counter() - started) * 1000.0)
    finally:
        jpeg.close()
    return out


def _raw_request(index: int) -> pb.FrameRequest:
    """A request standing for a decoded camera frame: with `DecodedPicture` the processor
    detects on exactly that frame (no re-encoding), as the cloud of a stream-to-cloud set-up
    sees it."""
    request = pb.FrameRequest(
        agent_id=AGENT, camera_id="raw", frame_id=index, request_id=str(index)
    )
    request.video.CopyFrom(pb.VideoPacket(codec="h264", data=b"-", keyframe=True, session="raw"))
    return request


def timing(source: Source, ladder: Sequence[Encoding], repeats: int = 5) -> list[Row]:
    """Only the edge's encoding and the cloud's decoding times of every encoding, each frame's
    the least of `repeats` passes (other work on the machine only ever adds time); no detector
    runs."""
    rows = []
    for encoding in ladder:
        passes = []
        for _ in range(repeats):
            requests, row = _requests(source, encoding)
            row.decode_ms = _decode_times(requests)
            passes.append(row)
        best = passes[0]
        best.encode_ms = [float(v) for v in np.min([p.encode_ms for p in passes], axis=0)]
        best.decode_ms = [float(v) for v in np.min([p.decode_ms for p in passes], axis=0)]
        rows.append(best)
    return rows


def measure(source: Source, ladder: Sequence[Encoding]) -> list[Row]:
    """Every encoding of the ladder on `source`, and the camera-stream baseline first."""
    processor, closeable = source.processor()
    service = DetectorFrameProcessor(processor.models, videos=VideoSessions())
    rows: list[Row] = []
    try:

        def detect(requests: Sequence[pb.FrameRequest]) -> dict[int, Detections]:
            out = {}
            for request in requests:  # in order: video packets reference the ones before
                (result,) = service.process([request])
                if result.status.code != 0:
                    raise RuntimeError(f"{source.label} frame {request.frame_id}: {result.status}")
                out[int(request.frame_id)] = detections_from_result(result, source.names)
            return out

        baseline = {}
        for index, image in zip(source.indices, source.images, strict=True):
            raw = DetectorFrameProcessor(processor.models, videos=sim.DecodedPicture(image))
            (result,) = raw.process([_raw_request(index)])
            baseline[index] = detections_from_result(result, source.names)
        stream = Row("camera stream (stream to cloud)", source.stream_bytes, 0, [], [], {})
        stream.scores = source.score(baseline, baseline)
        rows.append(stream)
        for encoding in ladder:
            requests, row = _requests(source, encoding)
            row.decode_ms = _decode_times(requests)
            row.scores = source.score(detect(requests), baseline)
            rows.append(row)
            logger.warning("%s %s: %d bytes", source.label, encoding.label, row.bytes)
    finally:
        closeable.close()
    return rows


def _f(value: float | None, digits: int = 3) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def table(source: Source, rows: Sequence[Row]) -> str:
    """The ladder on one source."""
    metrics = sorted({k for r in rows for k in r.scores})
    head = " | ".join(metrics)
    lines = [
        f"| encoding | KB/s | of camera | keyframes | edge encode ms | cloud decode ms | {head} |",
        "|---|---:|---:|---:|---:|---:|" + "---:|" * len(metrics),
    ]
    for row in rows:
        kb_s = row.bytes / 1000.0 / source.seconds
        share = row.bytes / source.stream_bytes
        encode = _f(float(np.mean(row.encode_ms)), 1) if row.encode_ms else "–"
        decode = _f(float(np.mean(row.decode_ms)), 2) if row.decode_ms else "–"
        scores = " | ".join(_f(row.scores.get(m)) for m in metrics)
        lines.append(
            f"| {row.encoding} | {kb_s:.1f} | {100.0 * share:.1f} % | {row.keyframes or '–'} "
            f"| {encode} | {decode} | {scores} |"
        )
    return "\n".join(lines)


def record(source: Source, rows: Sequence[Row]) -> dict[str, Any]:
    """The JSON of one source."""
    return {
        "source": source.label,
        "kind": source.kind,
        "frames": source.n_frames,
        "fps": source.fps,
        "size": [source.width, source.height],
        "escalated_frames": source.indices,
        "camera_stream_bytes_per_s": round(source.stream_bytes / source.seconds, 1),
        "notes": source.notes,
        "rows": [
            {
                "encoding": r.encoding,
                "bytes_per_s": round(r.bytes / source.seconds, 1),
                "camera_stream_fraction": round(r.bytes / source.stream_bytes, 4),
                "keyframes": r.keyframes,
                "edge_encode_ms": round(float(np.mean(r.encode_ms)), 2) if r.encode_ms else None,
                "cloud_decode_ms": round(float(np.mean(r.decode_ms)), 3) if r.decode_ms else None,
                "scores": {k: verified.clean(v) for k, v in r.scores.items()},
            }
            for r in rows
        ],
    }


def main(argv: list[str] | None = None) -> int:
    """Measure the ladder on every source; print and write the tables and the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", default="vtest,bikes", help="real clips ('' for none)")
    parser.add_argument("--scenes", default="crowded,small_far", help="test-world scenes")
    parser.add_argument("--rate", type=float, default=2.0, help="escalated frames per second")
    parser.add_argument("--frames", type=int, default=400, help="frames per clip (400)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--cloud-config",
        type=Path,
        default=CPU_CLOUD_CONFIG,
        help="the cloud service config whose engine answers the real clips (the CPU one)",
    )
    parser.add_argument(
        "--timing-only",
        action="store_true",
        help="only encode and decode times (each frame's least of 5, no detector): "
        "uplink_timing.{md,json}",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.perf_counter()
    sources = [
        clip_source(name.strip(), args.rate, args.frames, args.threads, args.cloud_config)
        for name in args.clips.split(",")
        if name.strip()
    ] + [
        scene_source(spec.strip(), args.rate, None, args.threads)
        for spec in args.scenes.split(",")
        if spec.strip()
    ]
    run = timing if args.timing_only else measure
    results = [(source, run(source, LADDER)) for source in sources]
    command = harness.command_line(__spec__.name, argv)
    name = "uplink_timing" if args.timing_only else "uplink"
    title = "encoding and decoding times" if args.timing_only else "quality ladder"
    sections = [f"# The uplink's {title}\n\n`{command}`"]
    for source, rows in results:
        sections.append(
            f"## {source.label} ({source.width}x{source.height}, {source.fps:g} fps, "
            f"{len(source.indices)} of {source.n_frames} frames escalated = "
            f"{len(source.indices) / source.seconds:.2f} frames/s; camera stream "
            f"{source.stream_bytes / 1000.0 / source.seconds:.1f} KB/s; "
            f"{'; '.join(source.notes)})\n\n{table(source, rows)}"
        )
    sections.append(
        "Scores: `map50` and `f1` against truth no model made (the scene's ground truth, or "
        "the hand-verified boxes of the real clip: person and vehicle AP50 averaged, F1 of boxes "
        ">= 0.3 averaged); `agreement_f1`: F1 against the cloud's own boxes >= 0.5 on the "
        "decoded camera frames (the camera-stream row), which measures agreement, not accuracy. "
        "The camera-stream row's cloud detects on the decoded camera frames themselves. "
        "Times are one frame at a time on this machine "
        f"(2 cores, other work running). Wall time {time.perf_counter() - started:.0f} s."
    )
    document = "\n\n".join(sections)
    print(document)
    sources_record = [record(s, r) for s, r in results]
    harness.write_results(name, document, {"command": command, "sources": sources_record}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
