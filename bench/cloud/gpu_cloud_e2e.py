"""End-to-end throughput of the cloud service on a GPU: real server, gRPC streams on loopback.

The service is built by `cloud_service.app.build_service` from a config asking for the NVJPEG
decoder and ONNX Runtime on the CUDA EP. Where ONNX Runtime has no CUDA EP, the torch reference
YOLOv5x stands in for the engine (registered for this process only, and said so in the table),
so the rest of the path (gRPC, batcher, decode, pre/post-processing) is still measured.
Each stream keeps `--e2e-window-frames` frames in flight; the first seconds are a warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.cloud._gpu_common import Report, Target
from bench.cloud.gpu_cloud_model import IMGSZ

WARM_UP_S = 3.0
RPC_SLACK_S = 30.0


class TorchReferenceRuntime:
    """The `Runtime` protocol over `bench.models.yolov5_reference` (FP16 on the GPU, host in and
    out)."""

    name = "torch-reference"

    def __init__(self, target: Target) -> None:
        import torch

        from bench.models.yolov5_reference import build
        from detection.runtimes.base import InputSpec

        torch.backends.cudnn.benchmark = True
        self._torch = torch
        self._target = target
        self._model = build(target.yolo_scale, device=target.device, half=target.half)
        self._spec = InputSpec(height=IMGSZ, width=IMGSZ, layout="NCHW", max_batch_size=None)

    @property
    def input_spec(self) -> Any:
        """640x640 NCHW, any batch."""
        return self._spec

    def infer(self, images: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """float32 host batch in, float32 host output."""
        torch = self._torch
        with torch.inference_mode():
            batch = torch.from_numpy(images).to(self._target.device)
            batch = batch.half() if self._target.half else batch
            output = self._model(batch.contiguous(memory_format=torch.channels_last))
            return np.asarray(output.float().cpu().numpy(), dtype=np.float32)

    def close(self) -> None:
        """Drop the model."""
        self._model = None


def _engine(model: Path | None, target: Target) -> tuple[dict[str, Any], str]:
    """(engine config section, label), registering the torch stand-in where needed."""
    import onnxruntime as ort

    has_cuda_ep = "CUDAExecutionProvider" in ort.get_available_providers()
    if model is not None and (has_cuda_ep or target.smoke):
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        runtime = {"type": "onnxruntime", "model_path": str(model), "providers": providers}
        label = "ORT CPU (smoke)" if target.smoke else "ORT CUDA EP fp32"
        return {"runtime": runtime, "input_size": [IMGSZ, IMGSZ]}, label
    from detection.runtimes.base import register_runtime

    register_runtime("onnxruntime")(lambda _config: TorchReferenceRuntime(target))
    runtime = {"type": "onnxruntime", "model_path": "torch-reference.onnx"}
    label = "torch fp16 stand-in (ORT has no CUDA EP here)"
    return {"runtime": runtime, "input_size": [IMGSZ, IMGSZ]}, label


@dataclass
class StreamLoad:
    """What every camera stream sends and when, and what comes back (shared, locked)."""

    stub: Any
    pb: Any
    jpeg: bytes
    size: tuple[int, int]
    window_frames: int
    measure_from: float
    stop_at: float
    latencies_ms: list[float] = field(default_factory=list)
    detections: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run_stream(self, camera: str) -> None:
        """One bidi stream keeping `window_frames` frames in flight until `stop_at`."""
        slots = threading.Semaphore(self.window_frames)
        sent_at: dict[int, float] = {}

        def requests() -> Any:
            frame_id = 0
            while time.perf_counter() < self.stop_at:
                if not slots.acquire(timeout=0.5):
                    continue
                frame_id += 1
                sent_at[frame_id] = time.perf_counter()
                yield self.pb.FrameRequest(
                    agent_id="bench",
                    camera_id=camera,
                    frame_id=frame_id,
                    request_id=f"{camera}/{frame_id}",
                    jpeg=self.jpeg,
                    original_width=self.size[0],
                    original_height=self.size[1],
                )

        timeout_s = self.stop_at - time.perf_counter() + RPC_SLACK_S
        for result in self.stub.StreamFrames(requests(), timeout=timeout_s):
            now = time.perf_counter()
            slots.release()
            started = sent_at.pop(result.frame_id, now)
            if started < self.measure_from or now > self.stop_at:
                continue
            with self.lock:
                self.codes[str(result.status.code)] += 1
                if result.status.code == 0:
                    self.latencies_ms.append((now - started) * 1000.0)
                    self.detections += len(result.detections)


def _measure(config: Any, args: argparse.Namespace, jpeg: bytes) -> StreamLoad:
    """Build and start the service of `config`, load it from many streams, stop it."""
    import grpc

    from cloud_service.app import build_service
    from protos.analytics.v1 import analytics_pb2 as pb
    from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub

    service = build_service(config)
    service.server.start()
    options = [("grpc.max_send_message_length", 16 * 1024 * 1024)]
    channel = grpc.insecure_channel(f"127.0.0.1:{service.port}", options=options)
    start = time.perf_counter()
    load = StreamLoad(
        stub=InferenceServiceStub(channel),
        pb=pb,
        jpeg=jpeg,
        size=(1280, 720),
        window_frames=args.e2e_window_frames,
        measure_from=start + WARM_UP_S,
        stop_at=start + WARM_UP_S + args.e2e_seconds,
    )
    threads = [
        threading.Thread(target=load.run_stream, args=(f"cam-{i}",), daemon=True)
        for i in range(args.e2e_streams)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=args.e2e_seconds + WARM_UP_S + RPC_SLACK_S)
    channel.close()
    service.server.stop(0).wait(10)
    service.close()
    return load


def e2e_section(
    report: Report, args: argparse.Namespace, model: Path | None, target: Target
) -> None:
    """Frames/s and latency through the real server; skipped with the reason if it cannot run."""
    report.line("\n## 3. End to end through gRPC (720p JPEG, bidi streams on loopback)\n")
    try:
        from bench.cloud.jpeg_decoders import sample_jpegs
        from cloud_service.config import CloudServiceConfig
    except ImportError as exc:
        report.line(f"skipped: {exc} (carry the missing wheels, see the report)")
        return
    engine_section, label = _engine(model, target)
    jpeg = sample_jpegs(85)[0]["720p"]
    header = ["engine", "decoder (asked)", "streams x window", "max batch", "frames/s OK"]
    report.table([*header, "p50 ms", "p95 ms", "detections/frame", "statuses"])
    for decoder_type in ("cpu",) if target.smoke else ("nvjpeg", "cpu"):
        config = CloudServiceConfig.model_validate(
            {
                "server": {"listen_address": "127.0.0.1:0", "worker_threads": 64},
                "batching": {"max_batch_size": args.e2e_max_batch, "default_deadline_ms": 10_000},
                "decoder": {"type": decoder_type, "threads": 8},
                # random weights score ~0.5 everywhere: keep NMS to what a quiet scene costs
                "engine": {**engine_section, "confidence_threshold": 0.9},
                "metrics": {"enabled": False},
            }
        )
        load = _measure(config, args, jpeg)
        latencies = load.latencies_ms
        p50 = statistics.median(latencies) if latencies else float("nan")
        p95 = float(np.percentile(latencies, 95)) if latencies else float("nan")
        report.row(
            [
                label,
                decoder_type,
                f"{args.e2e_streams} x {args.e2e_window_frames}",
                args.e2e_max_batch,
                f"{len(latencies) / args.e2e_seconds:.0f}",
                f"{p50:.0f}",
                f"{p95:.0f}",
                f"{load.detections / max(len(latencies), 1):.1f}",
                dict(load.codes),
            ]
        )
