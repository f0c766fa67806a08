"""Latency per frame of each model and runtime on this machine, side by side in one run.

    python -m bench.models.model_latency [--repeats 5] [--skip-yolov5x]

Rows: the committed edge and cloud models (models/manifest.json), then YOLOv5s and YOLOv5x built
from ultralytics' YAML (random weights: the real compute cost of the architectures the design
names), exported to ONNX (dynamic batch) and, for v5s, INT8 TFLite. ONNX Runtime is timed at
batch 1, 2 and 4 (ms per frame), LiteRT at batch 1. Threads: 2 (this machine's cores).
The median of `--repeats` runs after one warm-up; ratios to the edge ONNX model make the table
comparable across noisy machines.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bench.harness import REPO_ROOT
from detection.runtimes.base import create_runtime
from detection.runtimes.config import LiteRTConfig, OnnxRuntimeConfig
from detection.toolchain.evaluate import infer_ms

THREADS = 2


def _yaml_models(skip_x: bool) -> list[tuple[str, Path, int]]:
    """(label, file, size) of YOLOv5s/x from YAML, exported once into the build cache."""
    os.environ.setdefault("YOLO_CONFIG_DIR", str(REPO_ROOT / ".cache" / "ultralytics-config"))
    from detection.toolchain.cache import cache_key, cached
    from detection.toolchain.export import export_onnx, export_tflite_int8

    root = REPO_ROOT / ".cache" / "models"
    calibration = REPO_ROOT / ".cache" / "build-models" / "calibration"
    rows = []
    for arch in ("yolov5s", "yolov5x")[: 1 if skip_x else 2]:
        onnx = cached(
            root,
            cache_key("bench-onnx", model=arch, imgsz=640),
            lambda work, arch=arch: export_onnx(f"{arch}.yaml", work, 640),  # type: ignore[misc]
        )
        rows.append((f"{arch} (YAML) ONNX FP32", onnx, 640))
        if arch == "yolov5s" and calibration.is_dir():
            tflite = cached(
                root,
                cache_key("bench-tflite-int8", model=arch, imgsz=640),
                lambda work: export_tflite_int8("yolov5s.yaml", work, 640, calibration),
            )
            rows.append(("yolov5s (YAML) TFLite INT8", tflite, 640))
    return rows


def _committed_models() -> list[tuple[str, Path, int]]:
    manifest_path = REPO_ROOT / "models" / "manifest.json"
    if not manifest_path.is_file():
        return []
    manifest = json.loads(manifest_path.read_text())
    rows = []
    for key, entry in manifest["models"].items():
        rows.append((f"committed {key}", REPO_ROOT / "models" / entry["file"], entry["eval_imgsz"]))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the latency table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-yolov5x", action="store_true", help="v5x is ~10x slower")
    args = parser.parse_args(argv)
    rows = _committed_models() + _yaml_models(args.skip_yolov5x)
    print("| model | size | runtime | batch 1 ms/frame | batch 2 | batch 4 | vs first |")
    print("|---|---|---|---|---|---|---|")
    reference: float | None = None
    for label, path, size in rows:
        batches: tuple[int, ...]
        if path.suffix == ".tflite":
            runtime = create_runtime(LiteRTConfig(model_path=path, num_threads=THREADS))
            name, batches = "LiteRT", (1,)
        else:
            config = OnnxRuntimeConfig(model_path=path, intra_op_threads=THREADS)
            runtime = create_runtime(config)
            name, batches = "ONNX Runtime", (1, 2, 4)
        try:
            times = [infer_ms(runtime, b, size, args.repeats) for b in batches]
        finally:
            runtime.close()
        reference = reference or times[0]
        cells = [f"{t:.1f}" for t in times] + ["–"] * (3 - len(times))
        print(f"| {label} | {size} | {name} | {' | '.join(cells)} | {times[0] / reference:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
