"""Batch size against latency and throughput: the engine alone and through the gRPC server.

    python -m bench.cloud.cloud_batching [--streams 8] [--batch-sizes 1,2,4,8,16,32] [--yolov5x]

Models: YOLOv5s built from ultralytics' YAML at 640 (random weights: the real compute cost), the
committed cloud model (models/manifest.json, when present) and, with `--yolov5x`, YOLOv5x (about
1.7 s per frame on 2 cores). ONNX Runtime with 2 threads (this machine's cores).

For each batch size B:
- engine: `Detector.detect` on B decoded frames (letterbox, inference, decoding, NMS): ms per
  batch and frames/s, the median of timed batches after a warm-up batch;
- server: `cloud-service serve` in a subprocess with `max_batch_size: B`, and N client streams in
  this process keeping max(N, 2B) frames in flight in total (a batch running, the next queued):
  median end-to-end latency per frame and frames/s over three batches after two warm-up
  batches; `server/engine` is the throughput ratio.
Engine and server are measured back to back per batch size (this machine's speed drifts).
Then where the server's time goes, from the `ServerTimings` of each result (frames of one batch
share its inference time, which groups them): latency (queue, server total, end-to-end; the
difference is gRPC and the client) and the per-frame budget behind the throughput (the engine as
timed inside the server, decoding, and the rest: batch gaps, gRPC threads competing for the
cores); `engine share` is the fraction of the server's wall time the engine was running. Last,
whether decoding the next batch on another thread while the engine runs pays on this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import grpc
import numpy as np

from bench.cloud._cloud_common import windowed_stream
from bench.harness import REPO_ROOT
from cloud_service.decoders import BgrImage, create_codec
from cloud_service.server import wait_until_serving
from detection.config import DetectorConfig
from detection.detector import Detector
from detection.runtimes.config import OnnxRuntimeConfig
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub

THREADS = 2
IMGSZ = 640
SERVER_START_TIMEOUT_S = 120.0
QUEUE_DELAY_MS = 20
SERVER_CONFIG = """\
server:
  listen_address: 127.0.0.1:{port}
  worker_threads: 64
  grace_period_s: 1
batching:
  max_batch_size: {batch}
  max_queue_delay_ms: {delay_ms}
  max_queue_frames: 100000
  per_stream_queue_frames: 10000
  default_deadline_ms: 600000
engine:
  runtime: {{type: onnxruntime, model_path: "{model}", intra_op_threads: {threads}}}
  input_size: [{size}, {size}]
metrics: {{enabled: false}}
model_name: bench
"""


@dataclass(frozen=True)
class Model:
    """A row group: label, ONNX file and input size."""

    label: str
    path: Path
    size: int


@dataclass
class ServerRun:
    """Measured frames of one server run: end-to-end latencies and server timings (ms)."""

    frames_per_s: float
    e2e_ms: list[float] = field(default_factory=list)
    results: list[pb.FrameResult] = field(default_factory=list)
    batch_sizes: dict[float, int] = field(default_factory=dict)  # by batch inference time


def _yaml_model(arch: str) -> Model:
    os.environ.setdefault("YOLO_CONFIG_DIR", str(REPO_ROOT / ".cache" / "ultralytics-config"))
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from detection.toolchain.cache import cache_key, cached
    from detection.toolchain.export import export_onnx

    root = REPO_ROOT / ".cache" / "models"
    key = cache_key("bench-onnx", model=arch, imgsz=IMGSZ)  # shared with bench.models.model_latency
    onnx = cached(root, key, lambda work: export_onnx(f"{arch}.yaml", work, IMGSZ))
    return Model(f"{arch} (YAML, random weights)", onnx, IMGSZ)


def _committed_cloud_model() -> Model | None:
    manifest = REPO_ROOT / "models" / "manifest.json"
    if not manifest.is_file():
        return None
    entry = json.loads(manifest.read_text())["models"].get("cloud_onnx_fp16_weights")
    if entry is None:
        return None
    return Model("committed cloud model", REPO_ROOT / "models" / entry["file"], entry["eval_imgsz"])


def _jpegs() -> list[bytes]:
    """Four real photos (ultralytics assets and their mirror images) as JPEG."""
    import ultralytics

    assets = Path(ultralytics.__file__).parent / "assets"
    images = []
    for name in ("bus.jpg", "zidane.jpg"):
        image = cv2.imread(str(assets / name))
        if image is None:
            raise FileNotFoundError(assets / name)
        images += [image, np.ascontiguousarray(image[:, ::-1])]
    return [
        bytes(cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 85])[1]) for image in images
    ]


def _detector(model: Model) -> Detector:
    runtime = OnnxRuntimeConfig(model_path=model.path, intra_op_threads=THREADS)
    return Detector.from_config(DetectorConfig(runtime=runtime, input_size=(model.size,) * 2))


def _engine_ms(detector: Detector, jpegs: list[bytes], batch: int, timed: int) -> float:
    """Median ms per `detect` call on `batch` decoded frames."""
    decoder = create_codec()
    images = [decoder.decode(jpegs[i % len(jpegs)]) for i in range(batch)]
    detector.detect(images)  # warm-up (first run of this batch shape)
    runs = []
    for _ in range(timed):
        started = time.perf_counter()
        detector.detect(images)
        runs.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(runs)


def _overlap(
    detector: Detector, jpegs: list[bytes], batch: int, batches: int
) -> tuple[float, float]:
    """Frames/s with decoding serial to inference, and with the next batch decoded meanwhile."""
    decoder = create_codec()
    payloads = [[jpegs[(b + i) % len(jpegs)] for i in range(batch)] for b in range(batches)]

    def decode(batch_jpegs: list[bytes]) -> list[BgrImage]:
        return [decoder.decode(j) for j in batch_jpegs]

    detector.detect(decode(payloads[0]))
    started = time.perf_counter()
    for batch_jpegs in payloads:
        detector.detect(decode(batch_jpegs))
    serial = batch * batches / (time.perf_counter() - started)
    with ThreadPoolExecutor(max_workers=1) as pool:
        started = time.perf_counter()
        pending = pool.submit(decode, payloads[0])
        for index in range(batches):
            images = pending.result()
            if index + 1 < batches:
                pending = pool.submit(decode, payloads[index + 1])
            detector.detect(images)
        overlapped = batch * batches / (time.perf_counter() - started)
    return serial, overlapped


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_run(model: Model, jpegs: list[bytes], batch: int, streams: int) -> ServerRun:
    warmup, measured = max(2 * batch, 4), max(3 * batch, 12)
    per_stream = math.ceil((warmup + measured) / streams)
    window = max(1, math.ceil(2 * batch / streams))
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "cloud.yaml"
        config.write_text(
            SERVER_CONFIG.format(
                port=port,
                batch=batch,
                delay_ms=QUEUE_DELAY_MS,
                model=model.path,
                threads=THREADS,
                size=model.size,
            )
        )
        command = [sys.executable, "-m", "cloud_service", "serve", "--config", str(config)]
        process = subprocess.Popen(  # noqa: S603 - our own CLI
            [*command, "--log-level", "WARNING"],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                wait_until_serving(
                    channel, SERVER_START_TIMEOUT_S, still_running=lambda: process.poll() is None
                )
                stub = InferenceServiceStub(channel)
                sink: list[tuple[float, float, pb.FrameResult]] = []
                lock = threading.Lock()
                threads = [
                    threading.Thread(
                        target=windowed_stream,
                        args=(stub, jpegs, per_stream, window, sink, lock),
                        kwargs={"agent": f"agent-{s}"},
                    )
                    for s in range(streams)
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
        finally:
            process.terminate()
            process.communicate(timeout=30)
    sink.sort(key=lambda item: item[1])
    start_s = sink[warmup - 1][1]
    timed = sink[warmup : warmup + measured]
    bad = [r for _, _, r in sink if r.status.code]
    if bad:
        raise RuntimeError(f"{len(bad)} frames failed, e.g. {bad[0].status}")
    return ServerRun(
        frames_per_s=len(timed) / (timed[-1][1] - start_s),
        e2e_ms=[(received - sent) * 1000.0 for sent, received, _ in timed],
        results=[result for _, _, result in timed],
        batch_sizes={ms: len(group) for ms, group in _batches([r for _, _, r in sink]).items()},
    )


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _batches(results: list[pb.FrameResult]) -> dict[float, list[pb.FrameResult]]:
    """Group results by batch: the frames of a batch share its (float) inference time."""
    groups: dict[float, list[pb.FrameResult]] = {}
    for result in results:
        groups.setdefault(result.timings.inference_time_ms, []).append(result)
    return groups


def _decode_frame_ms(result: pb.FrameResult, batch_size: int, per_batch: bool) -> float:
    """A frame's share of decoding, whether the processor reports it per batch or per frame."""
    return (
        result.timings.decode_time_ms / batch_size if per_batch else result.timings.decode_time_ms
    )


def _breakdown_row(batch: int, run: ServerRun) -> tuple[str, float]:
    """Where a frame's time goes; also the engine's share of the server's wall time."""
    timings = [r.timings for r in run.results]
    sizes = [run.batch_sizes[t.inference_time_ms] for t in timings]
    per_batch = all(
        len({r.timings.decode_time_ms for r in group}) == 1
        for group in _batches(run.results).values()
    )
    engine_frame = _mean([t.inference_time_ms / n for t, n in zip(timings, sizes, strict=True)])
    decode_frame = _mean(
        [_decode_frame_ms(r, n, per_batch) for r, n in zip(run.results, sizes, strict=True)]
    )
    total = _mean([t.total_time_ms for t in timings])
    e2e = _mean(run.e2e_ms)
    wall_frame = 1000.0 / run.frames_per_s
    rest = wall_frame - engine_frame - decode_frame
    row = (
        f"| {batch} | {_mean([float(n) for n in sizes]):.1f} "
        f"| {_mean([t.queue_time_ms for t in timings]):.0f} "
        f"| {total:.0f} | {e2e:.0f} | {e2e - total:.1f} | {engine_frame:.1f} | "
        f"{decode_frame:.1f} | {rest:.1f} | {wall_frame:.1f} | {engine_frame / wall_frame:.2f} |"
    )
    return row, engine_frame


def _bench_model(
    model: Model, jpegs: list[bytes], batches: list[int], streams: int
) -> tuple[list[str], dict[int, float]]:
    """Engine then server, batch size by batch size (close in time: this machine is noisy)."""
    breakdown, ratios = [], {}
    with _detector(model) as detector:
        for batch in batches:
            engine_ms = _engine_ms(detector, jpegs, batch, timed=2 if batch >= 8 else 3)
            engine_fps = batch * 1000.0 / engine_ms
            run = _server_run(model, jpegs, batch, streams)
            ratios[batch] = run.frames_per_s / engine_fps
            row, engine_in_server_ms = _breakdown_row(batch, run)
            breakdown.append(row)
            print(
                f"| {model.label} | {batch} | {engine_ms:.0f} | {engine_fps:.2f} | "
                f"{statistics.median(run.e2e_ms):.0f} | {run.frames_per_s:.2f} | "
                f"{ratios[batch]:.2f} | {batch * engine_in_server_ms:.0f} |",
                flush=True,
            )
    return breakdown, ratios


def main(argv: list[str] | None = None) -> int:
    """Print the batch-size tables, the overhead ratio and the time breakdown."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=8, help="concurrent client streams")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32", help="comma-separated")
    parser.add_argument("--yolov5x", action="store_true", help="add YOLOv5x (~1.7 s/frame)")
    parser.add_argument("--skip-committed", action="store_true", help="skip the trained model")
    parser.add_argument("--overlap-batch", type=int, default=8, help="batch for the decode test")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    jpegs = _jpegs()
    models = [_yaml_model("yolov5s")]
    committed = None if args.skip_committed else _committed_cloud_model()
    if committed is not None:
        models.append(committed)
    else:
        print("(no models/manifest.json: the committed cloud model row is skipped)")
    if args.yolov5x:
        models.append(_yaml_model("yolov5x"))
    started = time.perf_counter()
    print(f"\n## Engine alone vs through the server ({args.streams} streams), ONNX Runtime CPU\n")
    print("| model | batch | engine ms/batch | engine frames/s | server p50 ms/frame "
          "| server frames/s | server/engine | engine ms/batch in server |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    breakdowns = []
    for model in models:
        breakdown, ratios = _bench_model(model, jpegs, batches, args.streams)
        breakdowns.append((model, breakdown, ratios))
    for model, breakdown, ratios in breakdowns:
        print(f"\n## Where the time goes: {model.label}, {args.streams} streams (ms)\n")
        print("| batch | mean batch | queue | server total | end-to-end | gRPC+client "
              "| engine/frame | decode/frame | rest/frame | 1/fps | engine share |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(breakdown))
        if 8 in ratios:
            print(f"\nserver/engine throughput at batch 8, {args.streams} streams: {ratios[8]:.2f}")
    with _detector(models[0]) as detector:
        serial, overlapped = _overlap(detector, jpegs, args.overlap_batch, batches=3)
    print(
        f"\ndecode overlap ({models[0].label}, batch {args.overlap_batch}): serial "
        f"{serial:.2f} frames/s, next batch decoded on another thread {overlapped:.2f} frames/s"
    )
    print(f"\ndone in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
