"""Structured channel pruning of the edge model, fine-tuned back: FLOPs, latency and mAP.

    python -m bench.edge.edge_prune [--ratio 0.15] [--epochs 15] [--test-scenes 2]

Rebuilds the edge network from its committed ONNX export with batch norms re-inserted
(`onnx_weights.trainable_checkpoint_from_onnx`), prunes `--ratio` of the channels of every
prunable convolution (`detection.toolchain.prune`), fine-tunes the pruned network on the
committed models' training scenes (seed 0, as `testbed.build_models`), and exports it to ONNX.
Scores the committed FP32 model, the pruned one before and after fine-tuning on two held-out test
sets (seeds 1 and 2, every scenario) and times both ONNX models in ONNX Runtime (one thread,
320x320). Prints a table; writes `bench/results/edge_prune.{md,json}`.
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
from bench.edge.int8_sensitivity import EDGE_ONNX, MODELS, REPO_ROOT, RESULTS, _data, held_out_sets

WORK = REPO_ROOT / ".cache" / "edge-prune"
IMGSZ = 320


def main(argv: list[str] | None = None) -> int:
    """Prune, fine-tune, export, score; print and write."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ratio", type=float, default=0.15, help="channels removed per layer")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--lr0", type=float, default=0.005)
    parser.add_argument("--test-scenes", type=int, default=2, help="per scenario and seed")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from detection.toolchain.evaluate import evaluate_model, model_latency_ms
    from detection.toolchain.prune import prune_and_finetune
    from detection.toolchain.train import FineTuneSpec

    started = time.perf_counter()
    _calibration, data_yaml = _data()
    names = json.loads((MODELS / "manifest.json").read_text())["class_names"]
    schedule = FineTuneSpec(imgsz=IMGSZ, epochs=args.epochs, lr0=args.lr0, batch=16)
    done = prune_and_finetune(EDGE_ONNX, data_yaml, args.ratio, schedule, WORK)
    pruned = done.pruned
    tests = held_out_sets(names, args.test_scenes)
    variants: list[tuple[str, Path, float, int, bool]] = [
        ("FP32 committed", EDGE_ONNX, pruned.macs_before, pruned.params_before, True),
        ("pruned, not fine-tuned", pruned.path, pruned.macs_after, pruned.params_after, False),
        (f"pruned, fine-tuned {args.epochs} epochs", done.onnx, done.macs, done.params, True),
    ]
    rows: list[dict[str, Any]] = []
    for label, path, macs, params, timed in variants:
        scores = [evaluate_model(path, tests[seed], IMGSZ) for seed in (1, 2)]
        rows.append(
            {
                "model": label,
                "file": str(path.relative_to(REPO_ROOT)),
                "mmacs": macs / 1e6,
                "params": params,
                "ort_ms": model_latency_ms(path, IMGSZ) if timed else None,
                "test_seed1_map50_95": scores[0].map50_95,
                "test_seed2_map50_95": scores[1].map50_95,
                "test_mean_map50_95": statistics.fmean(s.map50_95 for s in scores),
                "test_mean_map50": statistics.fmean(s.map50 for s in scores),
            }
        )
    base = rows[0]
    lines = [
        f"## Structured pruning of the edge model (ratio {args.ratio:g}, 320x320)",
        "",
        f"Held-out seeds 1 and 2, {args.test_scenes} scenes per scenario each "
        f"({len(tests[1])} + {len(tests[2])} images). Fine-tuning: {args.epochs} epochs on the "
        f"committed models' training scenes, SGD lr0 {args.lr0:g}, {done.train_seconds:.0f} s.",
        "",
        "| model | MMACs | params | ORT ms (1 thread) | mAP50-95 seed 1 | seed 2 | mean "
        "| vs FP32 (points) | mAP50 mean |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        latency = "–" if row["ort_ms"] is None else f"{row['ort_ms']:.1f}"
        lines.append(
            f"| {row['model']} | {row['mmacs']:.0f} ({row['mmacs'] / base['mmacs'] - 1:+.0%}) | "
            f"{row['params']:,} | {latency} | {row['test_seed1_map50_95']:.4f} | "
            f"{row['test_seed2_map50_95']:.4f} | {row['test_mean_map50_95']:.4f} | "
            f"{(row['test_mean_map50_95'] - base['test_mean_map50_95']) * 100:+.2f} | "
            f"{row['test_mean_map50']:.4f} |"
        )
    command = harness.command_line(__spec__.name, argv)
    lines += ["", f"{time.perf_counter() - started:.0f} s; `{command}`"]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        record = {"ratio": args.ratio, "epochs": args.epochs, "lr0": args.lr0, "rows": rows}
        harness.write_results("edge_prune", text, record, RESULTS, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
