"""Per-block INT8 sensitivity search on the edge model: which blocks to keep in float.

    python -m bench.edge.int8_sensitivity [--max-drop 0.015] [--max-float-blocks 4] \
        [--test-scenes 2]

Rebuilds the edge network from its committed ONNX export, exports it to float TFLite, and runs
`detection.toolchain.sensitivity.search` with the committed model's calibration (the seed-0
training frames, 200 images, as `testbed.build_models`), scoring mAP50-95 on the build's
validation scenes. Then scores FP32, the committed INT8 model, the search's all-INT8 model and the
chosen mixed one on two held-out test sets (seeds 1 and 2, every scenario), and times each TFLite
model in LiteRT (one thread). Prints the tables; writes `bench/results/int8_sensitivity.{md,json}`.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import REPO_ROOT, RESULTS
from detection.toolchain.dataset import LabelledDataset

MODELS = REPO_ROOT / "models"
EDGE_ONNX = MODELS / "edge" / "edge-yolov5n-320.onnx"
EDGE_INT8 = MODELS / "edge" / "edge-yolov5n-320-int8.tflite"
WORK = REPO_ROOT / ".cache" / "int8-sensitivity"
IMGSZ = 320


def _data() -> tuple[Path, Path]:
    """(calibration folder, data.yaml) of the committed models' build (seed 0)."""
    from testbed.build_models import committed_data

    data, calibration = committed_data(WORK)
    return calibration, data / "data.yaml"


def held_out_sets(names: list[str], scenes: int) -> dict[int, LabelledDataset]:
    """Test sets of seeds 1 and 2 (never trained on), every scenario merged into one each."""
    from detection.toolchain.dataset import load_dataset
    from testbed.accuracy import write_test_sets

    merged = {}
    for seed in (1, 2):
        root = WORK / f"test-seed{seed}"
        sets = write_test_sets(root, REPO_ROOT / ".cache" / "media", seed, scenes, 125, 5)
        images = tuple(i for data_yaml in sets.values() for i in load_dataset(data_yaml, "test"))
        merged[seed] = LabelledDataset(root, images, tuple(names))
    return merged


def main(argv: list[str] | None = None) -> int:
    """Search, score, print, write."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-drop", type=float, default=0.015, help="mAP50-95 below FP32")
    parser.add_argument("--max-float-blocks", type=int, default=4)
    parser.add_argument("--test-scenes", type=int, default=2, help="per scenario and seed")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "ultralytics", "tensorflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from detection.toolchain.dataset import load_dataset
    from detection.toolchain.evaluate import evaluate_model, model_latency_ms
    from detection.toolchain.export import export_tflite_float
    from detection.toolchain.onnx_weights import checkpoint_from_onnx
    from detection.toolchain.sensitivity import search

    started = time.perf_counter()
    calibration, val_yaml = _data()
    val = load_dataset(val_yaml, "val")
    names = json.loads((MODELS / "manifest.json").read_text())["class_names"]
    checkpoint = checkpoint_from_onnx(EDGE_ONNX, "yolov5n.yaml", names, WORK / "edge.pt")
    float_model = export_tflite_float(str(checkpoint), WORK / "float", IMGSZ)
    images = sorted(calibration.glob("*.jpg"))

    def score(model: Path) -> float:
        return evaluate_model(model, val, IMGSZ).map50_95

    fp32_val = score(EDGE_ONNX)
    result = search(
        float_model,
        images,
        (IMGSZ, IMGSZ),
        score,
        fp32_val,
        WORK / "search",
        max_drop=args.max_drop,
        max_float_blocks=args.max_float_blocks,
    )
    chosen = result.chosen

    merged = held_out_sets(names, args.test_scenes)
    variants = {
        "FP32 ONNX": EDGE_ONNX,
        "INT8 committed": EDGE_INT8,
        "INT8 all blocks (search)": result.all_int8.path,
        f"INT8, float: {', '.join(chosen.float_blocks) or 'none'}": chosen.path,
    }
    rows: list[dict[str, Any]] = []
    for label, path in variants.items():
        scores = [evaluate_model(path, merged[seed], IMGSZ).map50_95 for seed in (1, 2)]
        rows.append(
            {
                "model": label,
                "file": str(path.relative_to(REPO_ROOT)),
                "val_map50_95": score(path),
                "test_seed1_map50_95": scores[0],
                "test_seed2_map50_95": scores[1],
                "test_mean_map50_95": statistics.fmean(scores),
                "latency_ms": model_latency_ms(path, IMGSZ) if path.suffix == ".tflite" else None,
                "bytes": path.stat().st_size,
            }
        )
    fp32 = rows[0]["test_mean_map50_95"]
    lines = [
        "## INT8 per-block sensitivity search (edge YOLOv5n, 320 px)",
        "",
        f"Search set: the build's validation scenes ({len(val)} images), FP32 mAP50-95 "
        f"{fp32_val:.4f}; target: within {args.max_drop * 100:.1f} points of FP32. "
        f"Test: held-out seeds 1 and 2, {args.test_scenes} scenes per scenario each "
        f"({len(merged[1])} + {len(merged[2])} images).",
        "",
        "| model | val mAP50-95 | test seed 1 | test seed 2 | mean | vs FP32 (points) "
        "| LiteRT ms (1 thread) | MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        latency = "–" if row["latency_ms"] is None else f"{row['latency_ms']:.1f}"
        lines.append(
            f"| {row['model']} | {row['val_map50_95']:.4f} | {row['test_seed1_map50_95']:.4f} | "
            f"{row['test_seed2_map50_95']:.4f} | {row['test_mean_map50_95']:.4f} | "
            f"{(row['test_mean_map50_95'] - fp32) * 100:+.2f} | {latency} | "
            f"{row['bytes'] / 1e6:.2f} |"
        )
    lines += [
        "",
        "Per-block sensitivity (val mAP50-95 given back by keeping that block alone in float):",
        "",
        "| block | gain (points) |",
        "|---|---:|",
    ]
    for block, gain in sorted(result.sensitivity.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {block} | {gain * 100:+.2f} |")
    lines += ["", "Greedy steps (val mAP50-95):", ""]
    lines += [
        f"- {', '.join(s.float_blocks)}: {s.score:.4f} ({(s.score - fp32_val) * 100:+.2f})"
        for s in result.steps
    ]
    lines += [
        "",
        f"{time.perf_counter() - started:.0f} s; `{harness.command_line(__spec__.name, argv)}`",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        record = {
            "fp32_val_map50_95": fp32_val,
            "sensitivity": result.sensitivity,
            "steps": [
                {"float_blocks": list(s.float_blocks), "val_map50_95": s.score}
                for s in result.steps
            ],
            "chosen_float_blocks": list(chosen.float_blocks),
            "rows": rows,
        }
        harness.write_results("int8_sensitivity", text, record, RESULTS, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
