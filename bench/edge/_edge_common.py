"""Shared pieces of the edge-agent benches: the scene, the broker, agent configs and stats.

Used by `bench.edge.edge_pipeline` (throughput) and `bench.edge.edge_latency_soak` (latency over
time).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from bench.harness import REPO_ROOT
from edge_agent.config import EdgeAgentConfig
from edge_agent.tracking import Embedder, HistogramEmbedder, NoEmbedder
from testbed.alert_check import scene_agent_config

MODELS = {
    "litert-int8": REPO_ROOT / "models" / "edge" / "edge-yolov5n-320-int8.tflite",
    # the same network exported at 320x192 for 16:9 cameras (python -m testbed.reexport_edge)
    "litert-int8-320x192": REPO_ROOT / "models" / "edge" / "edge-yolov5n-320x192-int8.tflite",
    "onnx": REPO_ROOT / "models" / "edge" / "edge-yolov5n-320.onnx",
}
SCENE_PRESET = "events"
SCENE_SEED = 1


def class_names() -> list[str]:
    """The class names the committed edge models were trained on."""
    manifest = json.loads((REPO_ROOT / "models" / "manifest.json").read_text())
    return [str(name) for name in manifest["class_names"]]


def ensure_scene(scene_dir: Path | None) -> Path:
    """The `events` scene folder (video.mp4, events.json): `scene_dir`, or one generated once."""
    if scene_dir is not None:
        return scene_dir
    root = REPO_ROOT / ".cache" / "bench-edge-scenes"
    folder = root / f"{SCENE_PRESET}-s{SCENE_SEED}"
    if not (folder / "video.mp4").is_file():
        command = [sys.executable, "-m", "testbed", "scene", "--preset", SCENE_PRESET]
        command += ["--seed", str(SCENE_SEED), "--out", str(root)]
        subprocess.run(command, check=True, cwd=REPO_ROOT)  # noqa: S603 (our own CLI)
    return folder


def embedder_named(name: str) -> Embedder:
    """`none` or `histogram` (the two CPU-cheap embedders)."""
    if name == "none":
        return NoEmbedder()
    if name == "histogram":
        return HistogramEmbedder()
    raise ValueError(f"embedder must be 'none' or 'histogram', got {name!r}")


def agent_config(
    scene_dir: Path,
    *,
    camera_urls: Sequence[str],
    model: str,
    threads: int,
    embedder: str,
    target_fps: float,
    mqtt_port: int,
    outbox_path: Path,
    agent_id: str = "bench-agent",
) -> EdgeAgentConfig:
    """The scene's agent config with one camera per URL (same zones and rules on each)."""
    document = scene_agent_config(
        scene_dir,
        camera_url=camera_urls[0],
        model_path=MODELS[model],
        class_names=class_names(),
        mqtt_port=mqtt_port,
        outbox_path=outbox_path,
        agent_id=agent_id,
        threads=threads,
        embedder=embedder,
        target_fps=target_fps,
    )
    (camera,) = document["cameras"]
    cameras: list[dict[str, Any]] = []
    for i, url in enumerate(camera_urls):
        cameras.append({**camera, "name": f"cam-{i}", "url": url})
    document["cameras"] = cameras
    return EdgeAgentConfig.model_validate(document)


def decode_all(video: Path) -> list[npt.NDArray[np.uint8]]:
    """Every frame of `video`, decoded once (BGR); `RuntimeError` when none decodes."""
    capture = cv2.VideoCapture(str(video), cv2.CAP_FFMPEG)
    frames: list[npt.NDArray[np.uint8]] = []
    while True:
        ok, image = capture.read()
        if not ok:
            break
        frames.append(np.asarray(image, dtype=np.uint8))
    capture.release()
    if not frames:
        raise RuntimeError(f"no frame decoded from {video}")
    return frames


def temp_dir(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary folder for outboxes and broker configs."""
    return tempfile.TemporaryDirectory(prefix=prefix)


def rss_mib(pid: int | str = "self") -> float:
    """Resident memory (VmRSS) of a process in MiB, from /proc; NaN when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return math.nan
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return math.nan
