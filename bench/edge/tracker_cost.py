"""Cost of tracking per frame by embedder and embedding policy, and of the CNN embedder per crop.

    python -m bench.edge.tracker_cost [--frames 30] [--quick]

Table 1: `CameraTracker.update` per frame (embedding included) for 10 / 50 / 200 objects moving
at constant velocity (boxes synthetic, pixels from a real 1280x720 generated frame, so crops are
real image content), with no embedder, colour histograms, and MobileNetV2 through ONNX Runtime
and LiteRT, each with `embed_policy` all and ambiguous. The median of the frames after a
warm-up of 3; the ratio is to the IoU-only tracker with the same objects.
Table 2: MobileNetV2 per crop by runtime, one crop per call vs batches of 16.
Threads: 2 (this machine's cores). Machines are noisy: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bench.harness import REPO_ROOT
from detection.detections import Detections
from edge_agent.config.tracker import TrackerConfig
from edge_agent.tracking import (
    CameraTracker,
    Embedder,
    HistogramEmbedder,
    MobileNetV2Embedder,
    NoEmbedder,
)
from edge_agent.tracking.cnn_embedder import crop_boxes
from testbed.scenes.scenario import build_renderer, make_scenario

MODEL_DIR = REPO_ROOT / "models" / "embedder"
MEDIA_CACHE = REPO_ROOT / ".cache" / "media"
THREADS = 2
WARMUP_FRAMES = 3
WIDTH, HEIGHT = 1280, 720

ByteImage = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class Cost:
    """Median ms per frame and mean boxes embedded per frame."""

    ms_per_frame: float
    embedded_per_frame: float


def real_frames(count: int) -> list[ByteImage]:
    """`count` frames of a generated crowded scene at 1280x720 (real background, sprites)."""
    spec = make_scenario("crowded", 1, n_frames=count, width_px=WIDTH, height_px=HEIGHT)
    renderer = build_renderer(spec, MEDIA_CACHE)
    return [renderer.render(i)[0] for i in range(count)]


def moving_boxes(n_objects: int, n_frames: int, seed: int = 0) -> list[Detections]:
    """`n_objects` boxes (20-60 x 40-120 px) moving at constant velocity, bouncing off edges."""
    rng = np.random.default_rng(seed)
    size = np.column_stack([rng.uniform(20, 60, n_objects), rng.uniform(40, 120, n_objects)])
    position = rng.uniform([0, 0], [WIDTH, HEIGHT], (n_objects, 2)) - size / 2
    velocity = rng.uniform(-4, 4, (n_objects, 2))
    limit = np.array([WIDTH, HEIGHT]) - size
    out = []
    for _ in range(n_frames):
        position = position + velocity
        bounced = (position < 0) | (position > limit)
        velocity = np.where(bounced, -velocity, velocity)
        position = np.clip(position, 0, limit)
        jitter = rng.normal(0, 1.0, (n_objects, 4))
        xyxy = np.column_stack([position, position + size]) + jitter
        out.append(
            Detections(
                xyxy=xyxy.astype(np.float32),
                confidence=np.full(n_objects, 0.9, np.float32),
                class_id=np.zeros(n_objects, np.int64),
            )
        )
    return out


def tracking_cost(
    embedder: Embedder, policy: str, frames: list[ByteImage], detections: list[Detections]
) -> Cost:
    """Median `CameraTracker.update` time after the warm-up frames."""
    config = TrackerConfig(embed_policy="all" if policy == "all" else "ambiguous")
    tracker = CameraTracker.from_config(config, 0.5, embedder)
    times = []
    for index, dets in enumerate(detections):
        started = time.perf_counter()
        tracker.update(frames[index % len(frames)], dets)
        if index >= WARMUP_FRAMES:
            times.append((time.perf_counter() - started) * 1000.0)
    return Cost(statistics.median(times), tracker.embedded_boxes / len(detections))


def crop_cost(embedder: MobileNetV2Embedder, crops: list[ByteImage], repeats: int) -> float:
    """Median ms per crop of embedding `crops` in the embedder's batches."""
    embedder.embed_crops(crops)  # warm-up (and LiteRT's resize to this batch size)
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        embedder.embed_crops(crops)
        runs.append((time.perf_counter() - started) * 1000.0 / len(crops))
    return statistics.median(runs)


def _embedders() -> dict[str, Embedder]:
    found: dict[str, Embedder] = {"none": NoEmbedder(), "histogram": HistogramEmbedder()}
    for suffix, label in ((".onnx", "mobilenetv2-onnx"), (".tflite", "mobilenetv2-tflite")):
        models = sorted(MODEL_DIR.glob(f"*{suffix}"))
        if models:
            found[label] = MobileNetV2Embedder(models[0], threads=THREADS, max_batch=16)
    return found


def main(argv: list[str] | None = None) -> int:
    """Print both tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=30, help="frames per measurement")
    parser.add_argument("--repeats", type=int, default=5, help="runs of the per-crop timing")
    parser.add_argument("--quick", action="store_true", help="10 frames, 2 repeats")
    args = parser.parse_args(argv)
    n_frames = 10 if args.quick else max(args.frames, WARMUP_FRAMES + 1)
    repeats = 2 if args.quick else args.repeats
    frames = real_frames(min(n_frames, 30))
    embedders = _embedders()

    print("| objects | embedder | policy | ms/frame | boxes embedded/frame | vs none |")
    print("|---|---|---|---|---|---|")
    for n_objects in (10, 50, 200):
        detections = moving_boxes(n_objects, n_frames)
        baseline: float | None = None
        for name, embedder in embedders.items():
            for policy in ("all",) if name == "none" else ("all", "ambiguous"):
                cost = tracking_cost(embedder, policy, frames, detections)
                baseline = baseline or cost.ms_per_frame
                print(
                    f"| {n_objects} | {name} | {'–' if name == 'none' else policy} | "
                    f"{cost.ms_per_frame:.2f} | {cost.embedded_per_frame:.1f} | "
                    f"{cost.ms_per_frame / baseline:.1f}x |"
                )

    crops = crop_boxes(frames[0], moving_boxes(64, 1)[0].xyxy)
    print()
    print("| runtime | batch | ms/crop | vs onnxruntime batch 1 |")
    print("|---|---|---|---|")
    reference: float | None = None
    for name in ("mobilenetv2-onnx", "mobilenetv2-tflite"):
        cnn = embedders.get(name)
        if not isinstance(cnn, MobileNetV2Embedder):
            continue
        for batch in (1, 16):
            cnn.max_batch = batch
            ms = crop_cost(cnn, crops, repeats)
            reference = reference or ms
            print(f"| {cnn.runtime_name} | {batch} | {ms:.2f} | {ms / reference:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
