"""Accuracy of the committed models on held-out generated scenes of every scenario.

    python -m bench.models.model_accuracy [--scenes 3] [--frames-per-scene 125] [--every 5] [--fit]

Prints the per-scenario table (mAP50-95, mAP50, recall, small-object mAP50 and recall) for the
edge model in FP32 ONNX and INT8 TFLite and the cloud model, then the two comparisons that
matter: the cost of INT8 on the edge model, and the cloud model's gain over the edge model.
`--fit` adds the edge FP32 model with `letterbox: fit` (each 16:9 frame at its fitted rectangle
instead of the padded square) and prints its difference to the square input.
Test scenes use seeds the training never saw.
"""

from __future__ import annotations

import argparse
import json
import statistics

from bench.harness import REPO_ROOT
from testbed.accuracy import (
    AccuracyRow,
    ModelUnderTest,
    evaluate_all,
    markdown_table,
    write_test_sets,
)

MODELS = REPO_ROOT / "models"
LABELS = {
    "edge_onnx": "edge FP32",
    "edge_tflite_int8": "edge INT8",
    "edge_tflite_int8_320x192": "edge INT8 320x192",
    "cloud_onnx_fp16_weights": "cloud",
}


def committed_models() -> list[ModelUnderTest]:
    """The models listed in `models/manifest.json`, each at its evaluation size."""
    manifest = json.loads((MODELS / "manifest.json").read_text())
    return [
        ModelUnderTest(LABELS[key], MODELS / entry["file"], int(entry["eval_imgsz"]))
        for key, entry in manifest["models"].items()
    ]


def _mean(rows: list[AccuracyRow], model: str, field: str) -> float:
    return statistics.fmean(getattr(r, field) for r in rows if r.model == model)


def main(argv: list[str] | None = None) -> int:
    """Evaluate and print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenes", type=int, default=3, help="test scenes per scenario")
    parser.add_argument("--frames-per-scene", type=int, default=125)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1, help="test-set seed (training used 0)")
    parser.add_argument("--fit", action="store_true", help="also the edge FP32 model, fitted")
    args = parser.parse_args(argv)
    root = (
        REPO_ROOT / ".cache" / f"bench-accuracy-s{args.seed}-{args.scenes}x{args.frames_per_scene}"
    )
    test_sets = write_test_sets(
        root, REPO_ROOT / ".cache" / "media", args.seed, args.scenes, args.frames_per_scene,
        args.every,
    )  # fmt: skip
    models = committed_models()
    if args.fit:
        square = next(m for m in models if m.label == "edge FP32")
        models.append(ModelUnderTest("edge FP32 fit", square.path, square.imgsz, "fit"))
    rows = evaluate_all(models, test_sets)
    print(markdown_table(rows))
    print()
    if args.fit:
        for field in ("map50_95", "map50", "small_map50", "recall"):
            square_mean = _mean(rows, "edge FP32", field)
            fit_mean = _mean(rows, "edge FP32 fit", field)
            print(
                f"mean {field}: square {square_mean:.4f}, fitted {fit_mean:.4f} "
                f"({100 * (fit_mean - square_mean):+.2f} points)"
            )
    for field in ("map50_95", "map50", "small_map50"):
        fp32, int8 = _mean(rows, "edge FP32", field), _mean(rows, "edge INT8", field)
        cloud = _mean(rows, "cloud", field)
        print(
            f"mean {field}: edge FP32 {fp32:.3f}, edge INT8 {int8:.3f} "
            f"(INT8 cost {100 * (fp32 - int8):+.1f} points), cloud {cloud:.3f} "
            f"(cloud gain over edge FP32 {100 * (cloud - fp32):+.1f} points)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
