"""The cloud service with its model in-process (ONNX Runtime) vs served by Triton, side by side.

    python -m bench.cloud.triton_engine [--cloud-frames 10] [--batch-frames 6] [--window 2]
                                  [--tiny-frames 75] [--rounds 4] [--threads 2]

About 4 minutes on 2 cores with the defaults (cloud model: 40 timed frames per variant at
1 stream, 192 at 8 streams; tiny model: 300); the frame counts are printed at the start.

Needs the Triton venv (`scripts/setup-triton`, PyTriton's bundled `tritonserver`). One local
Triton serves two models from a fresh repository (`cloud_service.triton_repository.add_version`,
Python backend running ONNX Runtime, Triton `max_batch_size` 16, dynamic batching with a 2 ms
queue delay): the committed cloud model (`models/cloud/cloud-yolov5s-640-fp16w.onnx`, input
640x640) and a tiny ONNX model built here (a 32x32 average pool of the input reshaped to the
YOLO head layout `(B, 8, N)`: nearly no compute, nothing above the confidence threshold). Each
variant is a cloud service built with `cloud_service.app.build_service` in this process, with
`engine.runtime.type` `onnxruntime` (model in-process) or `triton` (the same ONNX file in Triton);
ONNX Runtime runs with the same `intra_op_threads` on both sides (the service's session, or the
Triton Python backend's).

Clients are gRPC bidi streams on loopback sending JPEG frames of the testbed's `events` scene
(640x360, the scenes the cloud model was trained on). A stream keeps a fixed number of frames
in flight (it sends the next frame when an answer comes back): 1 at 1 stream, `--window` (2)
at 8 streams, so that 16 frames wait for a batch of 8 and batches leave whole (with 1 each, the
8 streams split into two groups of 4 that take turns). Per frame the latency is client-side,
from handing the frame to gRPC to its answer; frames/s counts the answers after the warm-up
(the first `streams` answers of each round). The mean batch the service ran comes from the
answers (the frames of a batch share its `inference_time_ms`), the one Triton ran from Triton's
metrics endpoint (`nv_inference_count / nv_inference_exec_count`). Rows measured:

1. the cloud model at 1 stream (service `max_batch_size: 1`);
2. the cloud model at 8 streams: in-process with service batching (`max_batch_size: 8`), Triton
   with service batching (Triton gets whole batches of up to 8), and Triton with the service
   sending single frames (`max_batch_size: 1`) so that Triton's own dynamic batcher would do the
   batching (it cannot: the service's one batcher thread sends one request at a time and waits
   for its answer, so Triton's queue never holds two; the table shows the batch Triton ran);
3. the tiny model at 1 stream: the per-frame difference between Triton and in-process is the
   serving overhead (gRPC to Triton with a 4.9 MB FP32 tensor, Triton's scheduling, the copy
   into and out of the Python backend's shared memory), also read from the engine time the
   service reports per frame (`ServerTimings.inference_time_ms`).

The variants of a comparison alternate in rounds (A B, then B A, ...), so this machine's drift
hits both alike; the `others' CPU` column is the share of the machine's CPU that processes
outside this bench took while a variant ran (from /proc), to tell a quiet row from one slowed
by other work. Writes `bench/results/triton_engine.md` and `bench/results/triton_engine.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import grpc
import numpy as np

from bench import harness
from bench.cloud._cloud_common import windowed_stream
from bench.edge._edge_common import REPO_ROOT, decode_all, ensure_scene
from bench.harness import RESULTS

CLOUD_MODEL = REPO_ROOT / "models" / "cloud" / "cloud-yolov5s-640-fp16w.onnx"
CLASS_NAMES = ["person", "car", "truck", "forklift"]
INPUT_SIZE = 640
MANY_STREAMS = 8
SERVICE_BATCH = 8
QUEUE_DELAY_MS = 5.0
TRITON_MAX_BATCH = 16
TRITON_QUEUE_DELAY_US = 2000
JPEG_QUALITY = 85
SCENE_FRAMES = 24
POOL = 32  # the tiny model's average-pool kernel and stride


@dataclass(frozen=True)
class Variant:
    """A cloud service to build: its engine and batching, and the Triton model it calls."""

    key: str
    model: str  # "cloud" or "tiny"
    runtime: str  # "in-process" or "triton"
    service_batch: int
    triton_model: str | None = None


@dataclass
class Measured:
    """Timed answers of one variant, pooled over the rounds."""

    streams: int
    service_batch: int
    latencies_ms: list[float] = field(default_factory=list)
    engine_ms: list[float] = field(default_factory=list)  # ServerTimings.inference_time_ms
    seconds: float = 0.0
    warm_up_frames: int = 0
    triton_inferences: float = 0.0
    triton_executions: float = 0.0
    service_batches: int = 0
    machine_ticks: int = 0  # CPU ticks of the machine while this variant ran
    others_ticks: int = 0  # of them: busy in processes outside this bench's process tree

    @property
    def others_cpu(self) -> float:
        """Share of the machine's CPU other work took while this variant ran (0..1)."""
        return self.others_ticks / self.machine_ticks if self.machine_ticks else float("nan")

    @property
    def frames(self) -> int:
        """Timed frames."""
        return len(self.latencies_ms)

    @property
    def fps(self) -> float:
        """Timed frames per second of timed wall time."""
        return self.frames / self.seconds if self.seconds else float("nan")

    def p(self, q: float) -> float:
        """The `q`th percentile of the latencies (ms)."""
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    @property
    def service_batch_mean(self) -> float:
        """Mean batch the service ran (timed frames over the batches that held them)."""
        return self.frames / self.service_batches if self.service_batches else float("nan")

    @property
    def triton_batch(self) -> float | None:
        """Mean batch Triton executed (None: Triton not involved)."""
        if not self.triton_executions:
            return None
        return self.triton_inferences / self.triton_executions


def tiny_model(path: Path) -> Path:
    """An ONNX detector that costs almost nothing: `images (B,3,H,W)` -> 32x32 average pool ->
    8 channels -> `output0 (B, 8, H*W/1024)`, scores scaled to 0.1x (no detections)."""
    import onnx
    from onnx import TensorProto, helper

    pooled = helper.make_node(
        "AveragePool", ["images"], ["pooled"], kernel_shape=[POOL, POOL], strides=[POOL, POOL]
    )
    nodes = [
        pooled,
        helper.make_node("Concat", ["pooled", "pooled", "pooled"], ["nine"], axis=1),
        helper.make_node("Slice", ["nine", "starts", "ends", "axes"], ["eight"]),
        helper.make_node("Mul", ["eight", "scale"], ["scaled"]),
        helper.make_node("Reshape", ["scaled", "shape"], ["output0"]),
    ]
    initializers = [
        helper.make_tensor("starts", TensorProto.INT64, [1], [0]),
        helper.make_tensor("ends", TensorProto.INT64, [1], [8]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
        helper.make_tensor("scale", TensorProto.FLOAT, [], [0.1]),
        helper.make_tensor("shape", TensorProto.INT64, [3], [0, 8, -1]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny-pool",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "h", "w"])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", 8, "n"])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in (
        ("class_names", json.dumps(CLASS_NAMES)),
        ("box_units", "pixels"),
        ("model_name", "tiny-pool"),
    ):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def scene_jpegs(count: int) -> list[bytes]:
    """`count` frames spread over the `events` scene (generated once, cached), as JPEG."""
    frames = decode_all(ensure_scene(None) / "video.mp4")
    picked = [frames[i * len(frames) // count] for i in range(count)]
    params = [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY]
    return [bytes(cv2.imencode(".jpg", frame, params)[1]) for frame in picked]


def service_config(variant: Variant, model_path: Path, threads: int, triton_url: str) -> Any:
    """The `CloudServiceConfig` of `variant`."""
    from cloud_service.config import CloudServiceConfig

    runtime: dict[str, Any]
    if variant.runtime == "triton":
        runtime = {
            "type": "triton",
            "url": triton_url,
            "model_name": variant.triton_model,
            "request_timeout_s": 120.0,
        }
    else:
        runtime = {
            "type": "onnxruntime",
            "model_path": str(model_path),
            "intra_op_threads": threads,
        }
    return CloudServiceConfig.model_validate(
        {
            "server": {"listen_address": "127.0.0.1:0", "worker_threads": 32},
            "batching": {
                "max_batch_size": variant.service_batch,
                "max_queue_delay_ms": QUEUE_DELAY_MS,
                "default_deadline_ms": 600_000,
            },
            "engine": {"runtime": runtime, "input_size": [INPUT_SIZE, INPUT_SIZE]},
            "metrics": {"enabled": False},
        }
    )


def triton_counts(metrics_port: int, model: str) -> tuple[float, float]:
    """(inferences, executions) Triton counted for `model` so far (its Prometheus metrics)."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - local http
        text = response.read().decode()
    values = {"nv_inference_count": 0.0, "nv_inference_exec_count": 0.0}
    pattern = re.compile(r'^(nv_inference_(?:exec_)?count)\{[^}]*model="([^"]+)"[^}]*\} (\S+)$')
    for line in text.splitlines():
        match = pattern.match(line)
        if match and match.group(2) == model:
            values[match.group(1)] += float(match.group(3))
    return values["nv_inference_count"], values["nv_inference_exec_count"]


def run_once(
    port: int, jpegs: list[bytes], streams: int, window: int, timed_per_stream: int, into: Measured
) -> None:
    """Load the service on `port` with `streams` streams of 1 + `timed_per_stream` frames each,
    `window` in flight per stream, and add the answers after the first `streams` (the warm-up)
    to `into`."""
    from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub

    sink: list[tuple[float, float, Any]] = []
    lock = threading.Lock()
    options = [("grpc.max_send_message_length", 16 * 1024 * 1024)]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        stub = InferenceServiceStub(channel)
        threads = [
            threading.Thread(
                target=windowed_stream,
                args=(stub, jpegs, 1 + timed_per_stream, window, sink, lock),
                kwargs={"camera": f"cam-{s}", "offset": 3 * s},
            )
            for s in range(streams)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    failed = [result for _, _, result in sink if result.status.code]
    if failed:
        raise RuntimeError(f"{len(failed)} frames failed, e.g. {failed[0].status}")
    sink.sort(key=lambda item: item[1])
    start_s = sink[streams - 1][1]
    timed = sink[streams:]
    into.seconds += timed[-1][1] - start_s
    into.warm_up_frames += streams
    into.latencies_ms += [(received - sent) * 1000.0 for sent, received, _ in timed]
    into.engine_ms += [result.timings.inference_time_ms for _, _, result in timed]
    # The frames of one batch share its inference time: distinct values count the batches.
    into.service_batches += len({result.timings.inference_time_ms for _, _, result in timed})


@dataclass
class Bench:
    """The built services and what every comparison shares."""

    services: dict[str, Any]
    variants: dict[str, Variant]
    jpegs: list[bytes]
    rounds: int
    metrics_port: int

    def compare(
        self, keys: list[str], streams: int, window: int, timed_per_stream: int
    ) -> dict[str, Measured]:
        """The variants `keys` at `streams` streams of `window` frames in flight each,
        alternating order round by round."""
        measured = {
            key: Measured(streams=streams, service_batch=self.variants[key].service_batch)
            for key in keys
        }
        for index in range(self.rounds):
            for key in keys if index % 2 == 0 else keys[::-1]:
                model = self.variants[key].triton_model
                before = triton_counts(self.metrics_port, model) if model else (0.0, 0.0)
                port = self.services[key].port
                ticks = cpu_ticks()
                run_once(port, self.jpegs, streams, window, timed_per_stream, measured[key])
                total, busy, ours = (b - a for a, b in zip(ticks, cpu_ticks(), strict=True))
                measured[key].machine_ticks += total
                measured[key].others_ticks += max(busy - ours, 0)
                if model:
                    after = triton_counts(self.metrics_port, model)
                    measured[key].triton_inferences += after[0] - before[0]
                    measured[key].triton_executions += after[1] - before[1]
        return measured


def cpu_ticks() -> tuple[int, int, int]:
    """(all, busy, this bench's) CPU ticks so far: the machine's from /proc/stat, busy without
    idle and iowait; this bench's summed over this process and its descendants (Triton and its
    backend stubs). Zeros where /proc is not there."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except OSError:
        return 0, 0, 0
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    busy = total - fields[3] - fields[4]
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        rest = stat[stat.rindex(")") + 2 :].split()  # fields after the command name
        parents[int(entry.name)] = int(rest[1])
        times[int(entry.name)] = int(rest[11]) + int(rest[12])  # utime + stime
    ours, frontier = set(), [os.getpid()]
    while frontier:
        pid = frontier.pop()
        ours.add(pid)
        frontier += [child for child, parent in parents.items() if parent == pid]
    return total, busy, sum(times.get(pid, 0) for pid in ours)


def _load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    """Build the Triton repository, start Triton and the services, measure, write the tables."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--cloud-frames", type=int, default=10, help="timed frames per round, 1 stream"
    )
    parser.add_argument(
        "--batch-frames",
        type=int,
        default=6,
        help=f"timed frames per stream per round, {MANY_STREAMS} streams",
    )
    parser.add_argument(
        "--tiny-frames", type=int, default=75, help="timed frames per round, tiny model"
    )
    parser.add_argument(
        "--window",
        type=int,
        default=2,
        help=f"frames in flight per stream at {MANY_STREAMS} streams (1 at 1 stream)",
    )
    parser.add_argument("--rounds", type=int, default=4, help="rounds (variants alternate order)")
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    args = parser.parse_args(argv)

    from cloud_service.app import build_service
    from cloud_service.triton_repository import add_version
    from testbed.triton import running_triton

    started = time.perf_counter()
    load_before = _load_average()
    jpegs = scene_jpegs(SCENE_FRAMES)
    r = args.rounds
    print(
        f"frames per variant ({r} rounds; + 1 warm-up frame per stream and round): "
        f"cloud 1 stream {r * args.cloud_frames}, cloud {MANY_STREAMS} streams "
        f"{r * MANY_STREAMS * args.batch_frames}, tiny 1 stream {r * args.tiny_frames}",
        flush=True,
    )
    variants = {
        v.key: v
        for v in (
            Variant("cloud-ort-b1", "cloud", "in-process", 1),
            Variant("cloud-triton-b1", "cloud", "triton", 1, "cloud"),
            Variant("cloud-ort-b8", "cloud", "in-process", SERVICE_BATCH),
            Variant("cloud-triton-b8", "cloud", "triton", SERVICE_BATCH, "cloud"),
            Variant("tiny-ort-b1", "tiny", "in-process", 1),
            Variant("tiny-triton-b1", "tiny", "triton", 1, "tiny"),
        )
    }
    with tempfile.TemporaryDirectory(prefix="bench-triton-") as tmp:
        work = Path(tmp)
        paths = {"cloud": CLOUD_MODEL, "tiny": tiny_model(work / "tiny.onnx")}
        repository = work / "repository"
        for name, path in paths.items():
            add_version(
                repository,
                name,
                path,
                1,
                backend="python",
                max_batch_size=TRITON_MAX_BATCH,
                max_queue_delay_us=TRITON_QUEUE_DELAY_US,
                intra_op_threads=args.threads,
            )
        with running_triton(repository, work / "triton") as triton:
            print(f"Triton up at {triton.grpc_target} ({time.perf_counter() - started:.0f} s)")
            services: dict[str, Any] = {}
            try:
                for key, variant in variants.items():
                    config = service_config(
                        variant, paths[variant.model], args.threads, triton.grpc_target
                    )
                    services[key] = build_service(config)
                    services[key].server.start()
                print(f"services built ({time.perf_counter() - started:.0f} s)", flush=True)
                bench = Bench(services, variants, jpegs, args.rounds, triton.metrics_port)
                one = bench.compare(["cloud-ort-b1", "cloud-triton-b1"], 1, 1, args.cloud_frames)
                print(f"1 stream done ({time.perf_counter() - started:.0f} s)", flush=True)
                many = bench.compare(
                    ["cloud-ort-b8", "cloud-triton-b8", "cloud-triton-b1"],
                    MANY_STREAMS,
                    args.window,
                    args.batch_frames,
                )
                print(f"{MANY_STREAMS} streams done ({time.perf_counter() - started:.0f} s)")
                tiny = bench.compare(["tiny-ort-b1", "tiny-triton-b1"], 1, 1, args.tiny_frames)
            finally:
                for service in services.values():
                    service.server.stop(0).wait(10)
                    service.close()
    elapsed = time.perf_counter() - started
    loads = (load_before, _load_average())
    report = render(args, one, many, tiny, elapsed, loads)
    print(report.markdown)
    harness.write_results("triton_engine", report.markdown, report.records, RESULTS, indent=2)
    return 0


@dataclass
class Report:
    """The markdown page and the JSON records."""

    markdown: str
    records: list[dict[str, Any]]


def render(
    args: argparse.Namespace,
    one: dict[str, Measured],
    many: dict[str, Measured],
    tiny: dict[str, Measured],
    elapsed_s: float,
    loads: tuple[str, str],
) -> Report:
    """Tables, notes and records of a run."""
    rows = [
        ("cloud, in-process", one, "cloud-ort-b1", "cloud-ort-b1"),
        ("cloud, Triton", one, "cloud-triton-b1", "cloud-ort-b1"),
        ("cloud, in-process, service batching", many, "cloud-ort-b8", "cloud-ort-b8"),
        ("cloud, Triton, service batching", many, "cloud-triton-b8", "cloud-ort-b8"),
        ("cloud, Triton, batching left to Triton", many, "cloud-triton-b1", "cloud-ort-b8"),
        ("tiny, in-process", tiny, "tiny-ort-b1", "tiny-ort-b1"),
        ("tiny, Triton", tiny, "tiny-triton-b1", "tiny-ort-b1"),
    ]
    lines = [
        "| variant | streams | service max batch | mean batch: service / Triton | timed frames "
        "| frames/s | p50 ms | p95 ms | frames/s vs in-process | p50 vs in-process "
        "| others' CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    records = []
    for label, group, key, base_key in rows:
        m, base = group[key], group[base_key]
        streams, batch = m.streams, m.service_batch
        same = key == base_key
        fps_ratio = None if same else m.fps / base.fps
        p50_ratio = None if same else m.p(50) / base.p(50)
        lines.append(
            f"| {label} | {streams} | {batch} "
            f"| {m.service_batch_mean:.1f} / {_fmt(m.triton_batch)} | {m.frames} "
            f"| {m.fps:.2f} | {m.p(50):.1f} | {m.p(95):.1f} "
            f"| {_fmt(fps_ratio, 2)} | {_fmt(p50_ratio, 2)} | {100 * m.others_cpu:.0f}% |"
        )
        records.append(
            {
                "name": label,
                "key": key,
                "streams": streams,
                "service_max_batch": batch,
                "service_mean_batch": round(m.service_batch_mean, 2),
                "triton_mean_batch": None if m.triton_batch is None else round(m.triton_batch, 2),
                "frames": m.frames,
                "warm_up_frames": m.warm_up_frames,
                "fps": round(m.fps, 3),
                "p50_ms": round(m.p(50), 2),
                "p95_ms": round(m.p(95), 2),
                "engine_p50_ms": round(statistics.median(m.engine_ms), 2),
                "fps_vs_in_process": None if fps_ratio is None else round(fps_ratio, 3),
                "p50_vs_in_process": None if p50_ratio is None else round(p50_ratio, 3),
                "others_cpu_share": round(m.others_cpu, 3),
            }
        )
    ort, tri = tiny["tiny-ort-b1"], tiny["tiny-triton-b1"]
    client_overhead = tri.p(50) - ort.p(50)
    engine_overhead = statistics.median(tri.engine_ms) - statistics.median(ort.engine_ms)
    b8_ort, b8_tri = many["cloud-ort-b8"], many["cloud-triton-b8"]
    per_frame_b8 = 1000.0 / b8_tri.fps - 1000.0 / b8_ort.fps
    serial = many["cloud-triton-b1"]
    winner = (
        "service batching"
        if b8_tri.fps >= serial.fps
        else "service max batch 1, batching left to Triton"
    )
    command = (
        f"python -m bench.cloud.triton_engine --cloud-frames {args.cloud_frames} "
        f"--batch-frames {args.batch_frames} --window {args.window} "
        f"--tiny-frames {args.tiny_frames} "
        f"--rounds {args.rounds} --threads {args.threads}"
    )
    notes = [
        f"- ONNX Runtime CPU with `intra_op_threads: {args.threads}` on both sides (the "
        "service's own session, or the session in Triton's Python backend); spinning on in "
        "both (ONNX Runtime's default). Triton: PyTriton's `tritonserver`, Python backend, one "
        f"instance, `max_batch_size: {TRITON_MAX_BATCH}`, dynamic batching with "
        f"{TRITON_QUEUE_DELAY_US} us queue delay. Service: CPU JPEG decoding, "
        f"`max_queue_delay_ms: {QUEUE_DELAY_MS:g}`, letterbox to {INPUT_SIZE}x{INPUT_SIZE}.",
        f"- Frames: {SCENE_FRAMES} JPEGs (q{JPEG_QUALITY}, 640x360) of the testbed `events` "
        f"scene; each stream keeps 1 frame in flight at 1 stream, {args.window} at "
        f"{MANY_STREAMS} streams; latency is client-side, from handing the frame to gRPC to its "
        "answer. Mean batch: the service's from the answers (frames of a batch share its "
        "inference time), Triton's from its metrics (inferences / executions). Client, service "
        "and Triton share this machine's cores.",
        f"- {args.rounds} rounds, the variants of a comparison alternating order; per round the "
        "first answer of each stream is a warm-up and not counted.",
        f"- Serving overhead (tiny model, 1 stream): Triton - in-process = {client_overhead:+.1f} "
        f"ms per frame at p50 client-side; {engine_overhead:+.1f} ms in the engine time the "
        "service reports (`inference_time_ms`: the ModelInfer call to Triton vs the in-process "
        "run). That is gRPC to Triton with a 4.9 MB FP32 tensor, Triton's scheduling and the "
        "copies into and out of the Python backend.",
        f"- At {MANY_STREAMS} streams Triton costs {per_frame_b8:+.1f} ms per frame of "
        "throughput (1/fps) against in-process, with service batching.",
        f"- Which batching wins at {MANY_STREAMS} streams: **{winner}** by frames/s "
        f"({b8_tri.fps:.2f} vs {serial.fps:.2f}; p50 {b8_tri.p(50):.0f} vs {serial.p(50):.0f} "
        "ms). But Triton did not batch: with service `max_batch_size: 1` the service's one "
        "batcher thread calls Triton one frame at a time and waits for the answer, so Triton's "
        "queue never holds more than one request from it (mean batch Triton ran: "
        f"{_fmt(serial.triton_batch, 2)}). The row is service batching against no batching; "
        "Triton's dynamic batching would only combine requests of several callers (several "
        "service replicas on one Triton). On a CPU batching does not raise throughput "
        "(`bench.cloud.cloud_batching`): a batch costs about the sum of its frames.",
        "- Every frame was answered OK (the bench fails otherwise). `others' CPU`: the share of "
        "the machine's CPU that processes outside this bench (not this process, Triton or its "
        "stubs) took while the variant ran; where it is well above 0 the row was slowed by other "
        "work and its ratio is noise. Load average (1, 5, 15 min) before / after the run: "
        f"{loads[0]} / {loads[1]}.",
    ]
    markdown = "\n".join(
        [
            "# Cloud service engine: in-process ONNX Runtime vs Triton\n",
            f"`{command}` ({elapsed_s:.0f} s on this machine)\n",
            *lines,
            "",
            *notes,
            "",
        ]
    )
    return Report(markdown=markdown, records=records)


if __name__ == "__main__":
    raise SystemExit(main())
