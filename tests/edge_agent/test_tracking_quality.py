"""Tracking quality stays above the floor in `tests/baselines/tracking_floor.json`.

Two seeded scenes (crowded, events) are rendered once into `.cache/tracking-floor-scenes/`.
Detections come from the committed edge INT8 TFLite model through the real `Detector` (one
thread, so the numbers do not depend on the machine's cores) and from the ground truth with
box jitter and dropped boxes (the oracle, which pins down the tracker alone). `CameraTracker`
with each embedder tracks them; MOTA and IDF1 must not fall below the recorded floors. Only the
combinations with a floor in the file are tested (mobilenetv2 on crowded is left out: its
embedding costs most of a minute there).

To measure again after a deliberate change (prints the scores, their seconds and the floors
`margin` below them, to paste into the file):

    python -m tests.edge_agent.test_tracking_quality
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from detection.config import DetectorConfig
from detection.detections import Detections
from edge_agent.config.tracker import TrackerConfig
from edge_agent.detect_command import runtime_config_for
from testbed.tracking_eval import (
    EMBEDDER_NAMES,
    EmbedderUnavailableError,
    OracleSettings,
    Scene,
    TrackingScores,
    detect_video,
    ensure_scene,
    evaluate_tracking,
    make_embedder,
    oracle_detections,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS = REPO_ROOT / "models"
FLOOR_FILE = REPO_ROOT / "tests" / "baselines" / "tracking_floor.json"
SCENES_DIR = REPO_ROOT / ".cache" / "tracking-floor-scenes"
MEDIA_CACHE_DIR = REPO_ROOT / ".cache" / "media"
SETTINGS = json.loads(FLOOR_FILE.read_text())
DETECTORS = ("edge_int8", "oracle")
METRICS = ("mota", "idf1")

pytestmark = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg not installed")


def _detector_config() -> DetectorConfig:
    manifest = json.loads((MODELS / "manifest.json").read_text())
    entry = manifest["models"]["edge_tflite_int8"]
    size = int(entry["eval_imgsz"])
    return DetectorConfig(
        runtime=runtime_config_for(MODELS / entry["file"], SETTINGS["detector_threads"]),
        class_names=list(manifest["class_names"]),
        input_size=(size, size),
    )


@cache
def _scene(scenario: str) -> Scene:
    seed, frames = SETTINGS["scenes"][scenario], SETTINGS["frames"]
    return ensure_scene(scenario, seed, SCENES_DIR, MEDIA_CACHE_DIR, frames)


@cache
def _detections(scenario: str, detector: str) -> list[Detections]:
    scene = _scene(scenario)
    if detector == "oracle":
        return oracle_detections(scene.ground_truth, OracleSettings(**SETTINGS["oracle"]))
    return detect_video(scene.video, _detector_config()).detections


def measure(scenario: str, detector: str, embedder_name: str) -> TrackingScores:
    """Scores of one embedder on one scene with one detector (default tracker settings)."""
    evaluation = evaluate_tracking(
        _scene(scenario),
        _detections(scenario, detector),
        TrackerConfig(),
        make_embedder(embedder_name),
        _detector_config().confidence_threshold,
    )
    return evaluation.scores


CASES = [
    (scenario, detector, embedder)
    for detector, scenes in SETTINGS["floor"].items()
    for scenario, embedders in scenes.items()
    for embedder in embedders
]


@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "detector", "embedder_name"), CASES)
def test_tracking_stays_above_the_recorded_floor(
    scenario: str, detector: str, embedder_name: str
) -> None:
    floor = SETTINGS["floor"][detector][scenario][embedder_name]
    try:
        scores = measure(scenario, detector, embedder_name)
    except EmbedderUnavailableError as exc:
        pytest.skip(str(exc))
    below = [
        f"{name} {getattr(scores, name):.3f} < floor {floor[name]}"
        for name in METRICS
        if getattr(scores, name) < floor[name]
    ]
    assert not below, f"{embedder_name} on {scenario} ({detector}): " + ", ".join(below)


def _measure_all() -> None:
    """Print every available combination's scores, seconds and the floor they suggest."""
    measured: dict[str, Any] = {}
    floor: dict[str, Any] = {}
    for detector in DETECTORS:
        for scenario in sorted(SETTINGS["scenes"]):
            for name in EMBEDDER_NAMES:
                started = time.perf_counter()
                try:
                    scores = measure(scenario, detector, name)
                except EmbedderUnavailableError:
                    continue
                seconds = time.perf_counter() - started
                row = {metric: round(getattr(scores, metric), 4) for metric in METRICS}
                measured.setdefault(detector, {}).setdefault(scenario, {})[name] = row
                floor.setdefault(detector, {}).setdefault(scenario, {})[name] = {
                    metric: math.floor((value - SETTINGS["margin"]) * 1000) / 1000
                    for metric, value in row.items()
                }
                print(f"{detector} {scenario} {name}: {row} in {seconds:.1f} s", file=sys.stderr)
    print(json.dumps({"measured": measured, "floor": floor}, indent=1))


if __name__ == "__main__":
    _measure_all()
