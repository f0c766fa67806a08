"""Alerts when the box cannot keep up: the agent's frame loop on `events` scenes with frames
dropped, as a slow edge box drops them (it analyses the newest frame and skips the rest).

    python -m bench.edge.frame_drops [--seeds 1,980001,980002] [--runs 10]

Each scene is detected once with the edge INT8 model (the e2e tests' detector settings); then
the agent's `CameraPipeline` (tracker, rules) runs over the frames each drop pattern keeps,
stamped on the clip's clock, and its alerts are matched against the scene's scripted events
(`testbed.alert_check.match_events`, 1 s tolerance). A run is exact when every scripted event
is raised and nothing else. Patterns: every frame, every 2nd / 3rd frame, and frames dropped
at random (30 % and 50 %, `--runs` seeds each). Prints a table; writes
`bench/results/frame_drops.{md,json}`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bench import harness
from bench.edge.edge_pipeline import detector_for
from bench.harness import REPO_ROOT, RESULTS
from bench.hybrid._hybrid_sim import SCENE_START_S, observed_events
from detection.detections import Detections
from edge_agent.capture import CapturedFrame
from edge_agent.config import EdgeAgentConfig
from edge_agent.detect_command import read_frames
from edge_agent.pipeline.core import CameraPipeline
from edge_agent.tracking import CameraTracker, NoEmbedder
from testbed.alert_check import SceneEvent, load_expected, match_events, scene_agent_config
from testbed.tracking_eval import ensure_scene

SCENES_DIR = REPO_ROOT / ".cache" / "frame-drops-scenes"
MEDIA_CACHE_DIR = REPO_ROOT / ".cache" / "media"
EDGE_MODEL = REPO_ROOT / "models" / "edge" / "edge-yolov5n-320-int8.tflite"

Keep = Callable[[int], bool]


@dataclass(frozen=True)
class Pattern:
    """Which frames a slow box analyses: `keeps(run)` gives the frame filter of one run."""

    name: str
    runs: int
    keeps: Callable[[int, int], Keep]  # (run, frame count) -> keep(frame index)


def _random_drop(fraction: float) -> Callable[[int, int], Keep]:
    def keeps(run: int, frames: int) -> Keep:
        rng = random.Random(run)
        dropped = {i for i in range(frames) if i > 0 and rng.random() < fraction}
        return lambda i: i not in dropped

    return keeps


def patterns(runs: int) -> list[Pattern]:
    """Every frame, regular skips, random drops."""
    return [
        Pattern("every frame", 1, lambda _run, _n: lambda _i: True),
        Pattern("every 2nd frame", 1, lambda _run, _n: lambda i: i % 2 == 0),
        Pattern("every 3rd frame", 1, lambda _run, _n: lambda i: i % 3 == 0),
        Pattern("30 % dropped at random", runs, _random_drop(0.3)),
        Pattern("50 % dropped at random", runs, _random_drop(0.5)),
    ]


@dataclass
class Tally:
    """One pattern over every scene and run."""

    pattern: str
    runs: int = 0
    exact_runs: int = 0
    expected: int = 0
    matched: int = 0
    missing: int = 0
    unexpected: int = 0
    analysed_fraction: float = 0.0


@dataclass(frozen=True)
class SceneRun:
    """A scene's detections, ready for the frame loop."""

    name: str
    config: EdgeAgentConfig
    class_names: list[str]
    fps: float
    images: list[npt.NDArray[np.uint8]]
    detections: list[Detections]
    expected: list[SceneEvent]  # the scene's scripted events


def load_scene(seed: int, work: Path) -> SceneRun:
    """Render (cached) and detect the `events` scene of `seed` with the agent's detector."""
    scene = ensure_scene("events", seed, SCENES_DIR, MEDIA_CACHE_DIR)
    manifest = json.loads((REPO_ROOT / "models" / "manifest.json").read_text())
    names = list(manifest["class_names"])
    document = scene_agent_config(
        scene.root,
        camera_url=str(scene.video),
        model_path=EDGE_MODEL,
        class_names=names,
        mqtt_port=1883,
        outbox_path=work / "unused.sqlite3",
    )
    config = EdgeAgentConfig.model_validate(document)
    detector = detector_for(config)
    images = list(read_frames(str(scene.video), scene.n_frames))
    detections = [detector.detect([image])[0] for image in images]
    events_json = scene.root / "events.json"
    fps = float(json.loads(events_json.read_text())["fps"])
    expected = load_expected(events_json)
    return SceneRun(scene.root.name, config, names, fps, images, detections, expected)


def run_pattern(scene: SceneRun, keep: Keep) -> tuple[int, int, int, int, float]:
    """The frame loop over the frames `keep` lets through: (expected, matched, missing,
    unexpected, analysed fraction)."""
    config = scene.config
    tracker = CameraTracker.from_config(
        config.tracker, config.detector.confidence_threshold, NoEmbedder()
    )
    pipeline = CameraPipeline(config.cameras[0], tracker, scene.class_names)
    events = []
    analysed = 0
    for index, (image, detections) in enumerate(zip(scene.images, scene.detections, strict=True)):
        if not keep(index):
            continue
        now = index / scene.fps
        frame = CapturedFrame(config.cameras[0].name, index, SCENE_START_S + now, now, image)
        if not pipeline.admit(frame):
            continue
        analysed += 1
        events += pipeline.process(frame, detections).events
    match = match_events(scene.expected, observed_events(events, scene.class_names))
    fraction = analysed / max(len(scene.images), 1)
    expected = len(scene.expected)
    return expected, len(match.matched), len(match.missing), len(match.unexpected), fraction


def markdown(tallies: Sequence[Tally], scenes: Sequence[str], wall_s: float) -> str:
    """The results table."""
    lines = [
        "# Alerts when frames are dropped",
        "",
        "`python -m bench.edge.frame_drops`",
        "",
        f"Scenes: {', '.join(scenes)} (`events` preset, 640x360, 25 fps, 14.4 s); edge INT8 "
        "model, tracker and rules as the e2e tests configure them; frames stamped on the clip's "
        f"clock. A run is exact when it raises every scripted event and nothing else. Wall "
        f"time {wall_s:.0f} s.",
        "",
        "| frames analysed | runs | exact runs | scripted events matched | missing | unexpected |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for t in tallies:
        lines.append(
            f"| {t.pattern} ({100 * t.analysed_fraction:.0f} % of frames) | {t.runs} | "
            f"{t.exact_runs} | {t.matched}/{t.expected} | {t.missing} | {t.unexpected} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,980001,980002", help="events scene seeds")
    parser.add_argument("--runs", type=int, default=10, help="runs per random pattern")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    work = REPO_ROOT / ".cache" / "frame-drops-work"
    work.mkdir(parents=True, exist_ok=True)
    scenes = [load_scene(int(seed), work) for seed in args.seeds.split(",")]
    tallies = []
    for pattern in patterns(args.runs):
        tally = Tally(pattern.name)
        fractions = []
        for scene in scenes:
            for run in range(pattern.runs):
                keep = pattern.keeps(run, len(scene.images))
                expected, matched, missing, unexpected, fraction = run_pattern(scene, keep)
                tally.runs += 1
                tally.exact_runs += int(missing == 0 and unexpected == 0)
                tally.expected += expected
                tally.matched += matched
                tally.missing += missing
                tally.unexpected += unexpected
                fractions.append(fraction)
        tally.analysed_fraction = sum(fractions) / len(fractions)
        tallies.append(tally)
        print(f"{tally.pattern}: {tally.exact_runs}/{tally.runs} exact", file=sys.stderr)
    wall_s = time.perf_counter() - started
    text = markdown(tallies, [s.name for s in scenes], wall_s)
    print(text)
    records = [{"name": t.pattern, **asdict(t)} for t in tallies]
    document = {"scenes": [s.name for s in scenes], "wall_s": round(wall_s, 1), "records": records}
    harness.write_results("frame_drops", text, document, args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
