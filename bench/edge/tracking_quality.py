"""Tracking quality of the edge pipeline on generated scenes of every scenario, per embedder.

    python -m bench.edge.tracking_quality [--quick] [--seed 1] [--frames N] [--threads 2] \
        [--set tracker_field=value ...]

For each scenario (quiet, crowded, small_far, events) one seeded scene is rendered into
`.cache/tracking-scenes/<length>/` (and reused), the edge INT8 TFLite detector runs once over
it, and `CameraTracker` with each available embedder (none, histogram, mobilenetv2 where its
code and `models/embedder/*.onnx` exist) tracks the detections. A second detector, `oracle`,
feeds the ground truth with 5 % box jitter and 10 % dropped boxes, which shows the tracker's own
share of the errors. Prints MOTA, IDF1, ID switches, false positives, misses and the tracker's
time per frame (embedding included, detection and decoding not). `--quick`: 100 frames per scene.
`--set` overrides a `TrackerConfig` field (value parsed as JSON, else taken as a string), e.g.
`--set embed_policy=all --set max_cosine_distance=0.1`.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass

from pydantic import ValidationError

from bench.harness import REPO_ROOT
from detection.config import DetectorConfig
from detection.detections import Detections
from edge_agent.config.tracker import TrackerConfig
from edge_agent.detect_command import runtime_config_for
from testbed.accuracy import SCENARIOS
from testbed.tracking_eval import (
    OracleSettings,
    Scene,
    SceneEvaluation,
    available_embedders,
    detect_video,
    ensure_scene,
    evaluate_tracking,
    make_embedder,
    oracle_detections,
)

MODELS = REPO_ROOT / "models"
CACHE = REPO_ROOT / ".cache"
SEED_BASE = 950_000  # far from the training (0..299 999) and accuracy test seeds
NOISY_ORACLE = OracleSettings(jitter_frac=0.05, drop_rate=0.1, seed=0)


@dataclass(frozen=True)
class BenchRow:
    """One tracker on one scene with one detector."""

    scenario: str
    detector: str
    embedder: str
    evaluation: SceneEvaluation
    detect_ms_per_frame: float | None


def edge_int8_config(threads: int) -> DetectorConfig:
    """The committed edge INT8 TFLite detector, at its evaluation size."""
    manifest = json.loads((MODELS / "manifest.json").read_text())
    entry = manifest["models"]["edge_tflite_int8"]
    size = int(entry["eval_imgsz"])
    return DetectorConfig(
        runtime=runtime_config_for(MODELS / entry["file"], threads),
        class_names=list(manifest["class_names"]),
        input_size=(size, size),
    )


def tracker_config(overrides: list[str]) -> TrackerConfig:
    """Default tracker settings with `field=value` overrides (JSON values, else strings)."""
    fields: dict[str, object] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects field=value, got {item!r}")
        try:
            fields[key] = json.loads(text)
        except json.JSONDecodeError:
            fields[key] = text
    try:
        return TrackerConfig.model_validate(fields)
    except ValidationError as exc:
        raise SystemExit(f"bad --set: {exc}") from exc


def bench_scene(
    scenario: str,
    scene: Scene,
    detector: DetectorConfig,
    tracker: TrackerConfig,
    embedders: list[str],
) -> list[BenchRow]:
    """Every embedder on `scene`, with the real detector and with the noisy oracle."""
    real = detect_video(scene.video, detector)
    sources: list[tuple[str, list[Detections], float | None]] = [
        ("edge INT8", real.detections, real.ms_per_frame),
        ("oracle", oracle_detections(scene.ground_truth, NOISY_ORACLE), None),
    ]
    rows = []
    for label, detections, detect_ms in sources:
        for name in embedders:
            evaluation = evaluate_tracking(
                scene,
                detections,
                tracker,  # its `embedder` field is not read: the embedder is passed here
                make_embedder(name),
                detector.confidence_threshold,
            )
            rows.append(BenchRow(scenario, label, name, evaluation, detect_ms))
    return rows


def markdown_table(rows: list[BenchRow]) -> str:
    """A row per scenario, detector and embedder."""
    lines = [
        "| scenario | detector | embedder | MOTA | IDF1 | IDsw | FP | FN | GT boxes "
        "| track ms/frame | detect ms/frame |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, t = r.evaluation.scores, r.evaluation.track
        detect = "-" if r.detect_ms_per_frame is None else f"{r.detect_ms_per_frame:.1f}"
        lines.append(
            f"| {r.scenario} | {r.detector} | {r.embedder} | {s.mota:.3f} | {s.idf1:.3f} | "
            f"{s.id_switches} | {s.false_positives} | {s.misses} | {s.num_objects} | "
            f"{t.ms_per_frame:.2f} | {detect} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Render or reuse the scenes, evaluate, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="scene seed (offset by 950000)")
    parser.add_argument("--frames", type=int, default=None, help="frames per scene (preset)")
    parser.add_argument("--quick", action="store_true", help="100 frames per scene")
    parser.add_argument("--threads", type=int, default=2, help="detector threads")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="tracker setting"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    frames = 100 if args.quick else args.frames
    embedders = available_embedders()
    detector = edge_int8_config(args.threads)
    tracker = tracker_config(args.set)
    scenes_dir = CACHE / "tracking-scenes" / (f"{frames}f" if frames else "preset-length")
    rows: list[BenchRow] = []
    for scenario in SCENARIOS:
        scene = ensure_scene(scenario, SEED_BASE + args.seed, scenes_dir, CACHE / "media", frames)
        rows += bench_scene(scenario, scene, detector, tracker, embedders)
    print(markdown_table(rows))
    print(
        f"\nembedders: {', '.join(embedders)}; oracle = ground truth with "
        f"{NOISY_ORACLE.jitter_frac:.0%} box jitter, {NOISY_ORACLE.drop_rate:.0%} boxes dropped"
    )
    settings = tracker.model_dump(mode="json", exclude={"embedder", "embedder_model_path"})
    print(f"tracker: {json.dumps(settings)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
