"""Fitted vs square letterbox on the edge ONNX model: detector time per frame, side by side.

    python -m bench.edge.letterbox_fit [--frames 150] [--threads 2]

The `events` scene (640x360, 16:9) through the committed dynamic-shape edge model at
`input_size` 320x320: `fixed` pads every frame to the square, `fit` runs it at 192x320 (the
same scale, less padding). The two detectors take turns frame by frame, so machine noise hits
both alike. Accuracy of the same choice: `python -m bench.models.model_accuracy --fit`. Writes
`bench/results/letterbox_fit.md` and `.json`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Literal

from bench import harness
from bench.edge._edge_common import MODELS, class_names, decode_all, ensure_scene
from bench.harness import RESULTS
from detection.config import DetectorConfig
from detection.detector import Detector
from detection.runtimes.config import OnnxRuntimeConfig

VARIANTS: tuple[Literal["fixed", "fit"], ...] = ("fixed", "fit")


def main(argv: list[str] | None = None) -> int:
    """Time both letterboxes and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    frames = decode_all(ensure_scene(None) / "video.mp4")[: args.frames]
    detectors = {
        name: Detector.from_config(
            DetectorConfig(
                runtime=OnnxRuntimeConfig(model_path=MODELS["onnx"], intra_op_threads=args.threads),
                class_names=class_names(),
                input_size=(320, 320),
                letterbox=name,
            )
        )
        for name in VARIANTS
    }
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    boxes: dict[str, int] = dict.fromkeys(VARIANTS, 0)
    for i, frame in enumerate(frames):
        order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]
        for name in order:
            started = time.perf_counter()
            (found,) = detectors[name].detect([frame])
            if i >= 5:  # warm-up frames untimed
                times[name].append(time.perf_counter() - started)
                boxes[name] += len(found)
    shapes = {name: detectors[name].input_shapes_for([frames[0]], [True])[0] for name in VARIANTS}
    for detector in detectors.values():
        detector.close()
    fixed_ms = 1000 * statistics.median(times["fixed"])
    rows = [
        {
            "letterbox": name,
            "input": f"{shapes[name][0]}x{shapes[name][1]}",
            "ms_per_frame_median": round(1000 * statistics.median(times[name]), 2),
            "speedup_vs_fixed": round(fixed_ms / (1000 * statistics.median(times[name])), 2),
            "boxes": boxes[name],
        }
        for name in VARIANTS
    ]
    lines = [
        "| letterbox | input (h x w) | ms/frame (median) | vs fixed | boxes found |",
        "|---|---|---|---|---|",
        *(
            f"| {r['letterbox']} | {r['input']} | {r['ms_per_frame_median']} "
            f"| {r['speedup_vs_fixed']}x | {r['boxes']} |"
            for r in rows
        ),
    ]
    table = "\n".join(lines)
    print(table)
    header = (
        f"# Fitted vs square letterbox\n\n"
        f"`python -m bench.edge.letterbox_fit --frames {args.frames} "
        f"--threads {args.threads}`: edge ONNX model, `events` scene 640x360, "
        f"{len(times['fixed'])} timed frames each, interleaved.\n\n"
    )
    harness.write_results("letterbox_fit", header + table, rows, RESULTS, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
