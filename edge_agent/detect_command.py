"""`edge-agent detect`: run the edge detector over a video file or RTSP stream and print boxes.

The smallest end-to-end use of the detection core, for trying a model on a clip before writing a
full agent config.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TextIO

import cv2
import numpy as np
import numpy.typing as npt

from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from detection.runtimes.config import (
    LiteRTConfig,
    OnnxRuntimeConfig,
    RuntimeConfig,
    TensorRTConfig,
)

logger = logging.getLogger(__name__)

OutputFormat = Literal["text", "jsonl"]


class SourceError(RuntimeError):
    """A video source that cannot be opened or read."""


def runtime_config_for(model_path: Path, threads: int) -> RuntimeConfig:
    """The runtime config that suits a model file, chosen by its suffix."""
    suffix = model_path.suffix.lower()
    if suffix == ".onnx":
        return OnnxRuntimeConfig(model_path=model_path, intra_op_threads=threads)
    if suffix == ".tflite":
        return LiteRTConfig(model_path=model_path, num_threads=max(threads, 1))
    if suffix in (".engine", ".plan", ".trt"):
        return TensorRTConfig(engine_path=model_path)
    raise ValueError(
        f"cannot tell the runtime of {model_path}: expected .onnx, .tflite or .engine/.plan"
    )


def read_frames(source: str, max_frames: int | None) -> Iterator[npt.NDArray[np.uint8]]:
    """BGR frames from a file path or an RTSP URL, at most `max_frames` of them."""
    if "://" not in source and not Path(source).is_file():
        raise SourceError(f"video file not found: {source}")
    capture = cv2.VideoCapture(source, cv2.CAP_FFMPEG)
    if not capture.isOpened():
        raise SourceError(f"cannot open video source {source!r}")
    try:
        count = 0
        while max_frames is None or count < max_frames:
            ok, frame = capture.read()
            if not ok:
                return
            count += 1
            yield np.asarray(frame, dtype=np.uint8)
    finally:
        capture.release()


@dataclass
class DetectRunSummary:
    """What a `detect` run did: frames, boxes and how long the detector took."""

    frames: int = 0
    detections: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def line(self) -> str:
        """One human line: counts, latency percentiles and throughput."""
        if not self.latencies_ms:
            return "0 frames read"
        p50, p95 = np.percentile(self.latencies_ms, [50, 95])
        return (
            f"{self.frames} frames, {self.detections} detections; detect latency "
            f"p50 {p50:.1f} ms, p95 {p95:.1f} ms; {self.frames / self.wall_s:.1f} frames/s overall"
        )


def format_frame(
    index: int,
    dets: Detections,
    class_names: Sequence[str],
    fmt: OutputFormat,
    latency_ms: float,
) -> str:
    """One output line for a frame's detections, classes by name (`class_names`, by id; a class
    without a name shows its number)."""

    def name(class_id: int) -> str:
        return class_names[class_id] if 0 <= class_id < len(class_names) else str(class_id)

    boxes = [
        {"class": name(cls), "score": round(conf, 3), "xyxy": [round(float(v), 1) for v in box]}
        for box, conf, cls, _ in dets
    ]
    if fmt == "jsonl":
        return json.dumps({"frame": index, "latency_ms": round(latency_ms, 2), "detections": boxes})
    shown = ", ".join(f"{b['class']} {b['score']:.2f} {b['xyxy']}" for b in boxes[:5])
    more = f" (+{len(boxes) - 5} more)" if len(boxes) > 5 else ""
    return f"frame {index:5d}: {len(boxes):3d} boxes {latency_ms:7.1f} ms  {shown}{more}"


def run_detect(
    config: DetectorConfig,
    source: str,
    out: TextIO,
    *,
    max_frames: int | None = None,
    fmt: OutputFormat = "text",
    on_frame: Callable[[int, Detections], None] | None = None,
) -> DetectRunSummary:
    """Detect on every frame of `source`, writing one line per frame to `out`.

    Classes are printed by the detector's names: `config.class_names`, else the model's own
    (its metadata). `on_frame(index, detections)` sees every frame's result (e.g. to score it).
    """
    summary = DetectRunSummary()
    started = time.perf_counter()
    with Detector.from_config(config) as detector:
        for index, frame in enumerate(read_frames(source, max_frames)):
            t0 = time.perf_counter()
            (dets,) = detector.detect([frame])
            latency_ms = (time.perf_counter() - t0) * 1000.0
            summary.frames += 1
            summary.detections += len(dets)
            summary.latencies_ms.append(latency_ms)
            print(format_frame(index, dets, detector.class_names, fmt, latency_ms), file=out)
            if on_frame is not None:
                on_frame(index, dets)
    summary.wall_s = time.perf_counter() - started
    return summary
