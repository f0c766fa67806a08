"""Alerts on a box slower than its camera: the live edge agent on `events` scenes with its
analysis held to 25 %, 20 % and 10 % of the camera's frame rate.

    python -m bench.edge.slow_box_alerts [--seeds 1,980001,980002] [--shares 0.25,0.2,0.1]
                                    [--quota-cores 0.3] [--no-previous]

Each run is the real agent (`EdgeAgent`: capture thread, newest-frame slot, detector, tracker,
rules) reading a scene's video paced at its 25 frames/s like a camera, in real time, with no
cloud. Its analysis is held down in one of two ways:

* a **slow runtime**: the committed INT8 edge model wrapped so that each inference takes
  1 / (share x 25) s (`PacedRuntime`: the real inference, then a wait); the capture keeps
  reading at the camera's rate and the agent analyses the newest frame, dropping the rest as a
  slow box does;
* a **CPU quota** (`--quota-cores`): the bench process itself in a cgroup v1 `cpu` group of
  that many cores (where this machine lets it write one), the model unpaced; the rate is what the
  quota leaves, measured.

The alerts of each run (`start` phases less retractions, from the frame outcomes) are matched
against the scene's scripted events (`testbed.alert_check.match_events`, 1 s tolerance; times from
the first frame, on the capture clock). Rows with `previous` run the settings before the slow-box
fixes (`tracker.skip_iou_buffer: 0`, `tracker.skip_backdate_origin: false`, rules
`confirm_within_s: 0`). Prints a markdown table and
writes `bench/results/slow_box_alerts.{md,json}`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bench import harness
from bench.harness import REPO_ROOT, RESULTS
from detection.detector import Detector
from detection.runtimes.base import InputSpec, Runtime, create_runtime, runtime_metadata
from edge_agent.alerts import AlertPublisher
from edge_agent.config import EdgeAgentConfig
from edge_agent.pipeline import EdgeAgent, FrameOutcome
from edge_agent.pipeline.model_swap import effective_detector_config
from edge_agent.rules import RuleEvent
from testbed.alert_check import SceneEvent, load_expected, match_events, scene_agent_config
from testbed.processes import CpuGroup, free_tcp_port
from testbed.tracking_eval import Scene, ensure_scene

SCENES_DIR = REPO_ROOT / ".cache" / "frame-drops-scenes"  # shared with bench.edge.frame_drops
MEDIA_CACHE_DIR = REPO_ROOT / ".cache" / "media"
EDGE_MODEL = REPO_ROOT / "models" / "edge" / "edge-yolov5n-320-int8.tflite"
TOLERANCE_S = 1.0
TAIL_S = 2.0  # run on after the clip so the last frames are analysed
START_TIMEOUT_S = 30.0

logger = logging.getLogger(__name__)


class PacedRuntime:
    """A runtime that takes `period_s` per inference: the wrapped one's inference, then a wait
    for the rest of the period (a slower chip running the same model)."""

    def __init__(self, runtime: Runtime, period_s: float) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self._runtime = runtime
        self.period_s = period_s
        self.name = f"{runtime.name} paced to {1000 * period_s:.0f} ms"
        self.metadata = runtime_metadata(runtime)
        self.late = 0  # inferences that took longer than the period on their own

    @property
    def input_spec(self) -> InputSpec:
        """The wrapped runtime's input."""
        return self._runtime.input_spec

    def infer(self, images: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The wrapped inference, returned no sooner than `period_s` after the call."""
        started = time.perf_counter()
        output = self._runtime.infer(images)
        left = self.period_s - (time.perf_counter() - started)
        if left > 0:
            time.sleep(left)
        else:
            self.late += 1
        return output

    def close(self) -> None:
        """Close the wrapped runtime."""
        self._runtime.close()


@dataclass
class Collector:
    """The agent's outcome hook: analysed frames and their rule events."""

    frames: list[tuple[int, float]] = field(default_factory=list)  # (index, capture time)
    events: list[RuleEvent] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, outcome: FrameOutcome) -> None:
        with self._lock:
            self.frames.append((outcome.frame.index, outcome.frame.capture_time_s))
            self.events += outcome.events


@dataclass
class Run:
    """One live run on one scene."""

    scene: str
    mode: str  # "paced" or "quota"
    target_share: float | None  # paced: the share of the camera's frame rate asked for
    cores: float | None  # quota: the cgroup's cores
    settings: str  # "current" or "previous"
    analysed: int
    analysed_fps: float
    expected: int
    matched: int
    missing: list[str]
    unexpected: list[str]


def scene_config(seed: int, work: Path, previous: bool) -> tuple[Scene, EdgeAgentConfig, list[str]]:
    """The scene of `seed` (rendered once) and the agent config watching its video file."""
    scene = ensure_scene("events", seed, SCENES_DIR, MEDIA_CACHE_DIR)
    manifest = json.loads((REPO_ROOT / "models" / "manifest.json").read_text())
    names = [str(n) for n in manifest["class_names"]]
    document = scene_agent_config(
        scene.root,
        camera_url=str(scene.video),
        model_path=EDGE_MODEL,
        class_names=names,
        mqtt_port=free_tcp_port(),  # nothing listens: alerts wait in the outbox, unread
        outbox_path=work / f"outbox-{seed}.sqlite3",
        loop_file=False,
    )
    if previous:
        document["tracker"].update(skip_iou_buffer=0.0, skip_backdate_origin=False)
        for rule in document["cameras"][0]["rules"]:
            if rule["kind"] in ("zone_enter", "zone_exit", "line_cross"):
                rule["confirm_within_s"] = 0.0
    return scene, EdgeAgentConfig.model_validate(document), names


@contextlib.contextmanager
def cpu_quota(cores: float | None) -> Iterator[CpuGroup | None]:
    """This process in a cgroup of `cores` cores for the block (None: no quota); `RuntimeError`
    where no cgroup can be made here."""
    if cores is None:
        yield None
        return
    group = CpuGroup.create(f"slow-box-bench-{os.getpid()}", cores=cores)
    if group is None:
        raise RuntimeError("--quota-cores needs a writable cgroup v1 cpu controller (root)")
    group.add(os.getpid())
    try:
        yield group
    finally:
        (group.path.parent / "cgroup.procs").write_text(str(os.getpid()))
        group.remove()


def run_once(
    seed: int, work: Path, *, share: float | None, cores: float | None, previous: bool
) -> Run:
    """The agent on the scene of `seed`, paced to `share` of its frame rate or under `cores`."""
    scene, config, names = scene_config(seed, work, previous)
    fps = float(json.loads((scene.root / "events.json").read_text())["fps"])
    effective = effective_detector_config(config)
    runtime: Runtime = create_runtime(effective.runtime)
    if share is not None:
        runtime = PacedRuntime(runtime, 1.0 / (share * fps))
    detector = Detector(runtime, effective)
    publisher = AlertPublisher(config.mqtt, config.agent.id)
    agent = EdgeAgent(config, detector, publisher)
    collector = Collector()
    agent.hooks.append(collector)
    stop = threading.Event()
    duration_s = scene.n_frames / fps + TAIL_S
    with cpu_quota(cores):
        agent.start()
        thread = threading.Thread(target=agent.run, args=(stop,), name="frame-loop")
        thread.start()
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not collector.frames and time.monotonic() < deadline:
                time.sleep(0.05)
            stop.wait(duration_s)
        finally:
            stop.set()
            thread.join(30.0)
            agent.close(flush_timeout_s=0.5)
    return score(seed, scene, names, fps, collector, share=share, cores=cores, previous=previous)


def score(
    seed: int,
    scene: Scene,
    names: list[str],
    fps: float,
    collector: Collector,
    *,
    share: float | None,
    cores: float | None,
    previous: bool,
) -> Run:
    """Match the run's alerts against the scripted events of its scene."""
    frames = collector.frames
    expected = load_expected(scene.root / "events.json")
    if not frames:
        return Run(
            f"events-s{seed}", "paced" if share else "quota", share, cores,
            "previous" if previous else "current", 0, 0.0, len(expected), 0,
            [str(e) for e in expected], [],
        )  # fmt: skip
    # The least delayed frame dates the clip's first frame on the capture clock.
    start_s = min(t - index / fps for index, t in frames)
    span_s = max(t for _, t in frames) - min(t for _, t in frames)
    retracted = {
        (e.rule, e.track_id, e.timestamp_s) for e in collector.events if e.phase == "retract"
    }
    observed = [
        SceneEvent(
            e.kind, names[e.class_id], e.zone or e.line or "", e.direction, e.timestamp_s - start_s
        )
        for e in collector.events
        if e.phase == "start"
        and 0 <= e.class_id < len(names)
        and (e.rule, e.track_id, e.timestamp_s) not in retracted
    ]
    match = match_events(expected, observed, tolerance_s=TOLERANCE_S)
    return Run(
        scene=f"events-s{seed}",
        mode="paced" if share is not None else "quota",
        target_share=share,
        cores=cores,
        settings="previous" if previous else "current",
        analysed=len(frames),
        analysed_fps=(len(frames) - 1) / span_s if span_s > 0 else 0.0,
        expected=len(expected),
        matched=len(match.matched),
        missing=[str(e) for e in match.missing],
        unexpected=[str(e) for e in match.unexpected],
    )


@dataclass
class Row:
    """Runs of one condition over every scene."""

    condition: str
    settings: str
    runs: int = 0
    exact_runs: int = 0
    expected: int = 0
    matched: int = 0
    missing: int = 0
    unexpected: int = 0
    analysed_fps: list[float] = field(default_factory=list)


def rows_of(runs: list[Run], camera_fps: float) -> list[Row]:
    """One row per condition and settings, in the order first run."""
    rows: dict[tuple[str, str], Row] = {}
    for run in runs:
        if run.mode == "paced":
            assert run.target_share is not None  # noqa: S101 - paced runs have one
            condition = (
                f"slow runtime: {100 * run.target_share:.0f} % of the camera's frame rate "
                f"({run.target_share * camera_fps:g} f/s)"
            )
        else:
            condition = f"CPU quota: {run.cores:g} core"
        row = rows.setdefault((condition, run.settings), Row(condition, run.settings))
        row.runs += 1
        row.exact_runs += int(not run.missing and not run.unexpected)
        row.expected += run.expected
        row.matched += run.matched
        row.missing += len(run.missing)
        row.unexpected += len(run.unexpected)
        row.analysed_fps.append(run.analysed_fps)
    return list(rows.values())


def markdown(rows: list[Row], runs: list[Run], scenes: list[str], wall_s: float, load: str) -> str:
    """The results table and what was missed."""
    lines = [
        "# Alerts on a box slower than its camera",
        "",
        "`python -m bench.edge.slow_box_alerts`",
        "",
        f"Scenes: {', '.join(scenes)} (`events` preset, 640x360, 25 fps, 14.4 s), each read "
        "from its file paced at 25 frames/s like a camera; the live edge agent (capture thread, "
        "newest-frame slot, INT8 edge model, tracker, rules; no cloud), its analysis held down by "
        "a slow runtime (each inference takes 1 / (share x 25) s) or a CPU quota on the whole "
        "process. Alerts matched to the scripted events within 1 s. `current`: this release; "
        "`previous`: `tracker.skip_iou_buffer: 0`, `skip_backdate_origin: false` and "
        "`confirm_within_s: 0` (the settings before the slow-box fixes). Machine load during the "
        f"run: {load}. Wall time "
        f"{wall_s:.0f} s.",
        "",
        "| analysis held to | settings | runs | exact runs | analysed f/s (min-max) | "
        "scripted events matched | missing | unexpected |",
        "|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        low, high = min(r.analysed_fps), max(r.analysed_fps)
        lines.append(
            f"| {r.condition} | {r.settings} | {r.runs} | {r.exact_runs} | "
            f"{low:.1f}-{high:.1f} | {r.matched}/{r.expected} | {r.missing} | {r.unexpected} |"
        )
    misses = [
        f"- {run.scene}, {run.mode} {run.target_share or run.cores:g}, {run.settings}: "
        + "; ".join(
            [f"missing {m}" for m in run.missing] + [f"unexpected {u}" for u in run.unexpected]
        )
        for run in runs
        if run.missing or run.unexpected
    ]
    if misses:
        lines += ["", "What was missed or extra:", "", *misses]
    return "\n".join(lines) + "\n"


def _load_text() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    """Run the bench; writes the results."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seeds", default="1,980001,980002", help="events scene seeds")
    parser.add_argument("--shares", default="0.25,0.2,0.1", help="paced analysis rates")
    parser.add_argument("--quota-cores", default="", help="CPU quotas to run under, in cores")
    parser.add_argument("--no-previous", action="store_true", help="skip the previous settings")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
        shares = [float(s) for s in args.shares.split(",") if s]
        quotas = [float(s) for s in args.quota_cores.split(",") if s]
    except ValueError as exc:
        parser.error(f"--seeds, --shares and --quota-cores are comma-separated numbers: {exc}")
    if any(not 0 < s <= 1 for s in shares) or any(not q > 0 for q in quotas):
        parser.error("--shares must be in (0, 1], --quota-cores > 0")
    load = _load_text()
    started = time.perf_counter()
    runs: list[Run] = []
    settings = [False] if args.no_previous else [False, True]
    with tempfile.TemporaryDirectory(prefix="slow-box-") as tmp:
        work = Path(tmp)
        conditions: list[tuple[float | None, float | None]] = [(s, None) for s in shares]
        conditions += [(None, q) for q in quotas]
        for share, cores in conditions:
            for previous in settings:
                for seed in seeds:
                    run = run_once(seed, work, share=share, cores=cores, previous=previous)
                    runs.append(run)
                    print(
                        f"{run.scene} {run.mode} {share or cores:g} {run.settings}: "
                        f"{run.analysed_fps:.1f} f/s, {run.matched}/{run.expected} matched, "
                        f"{len(run.unexpected)} unexpected",
                        file=sys.stderr,
                        flush=True,
                    )
    wall_s = time.perf_counter() - started
    rows = rows_of(runs, 25.0)
    scenes = sorted({r.scene for r in runs}, key=[r.scene for r in runs].index)
    text = markdown(rows, runs, scenes, wall_s, load)
    print(text)
    document = {
        "scenes": scenes,
        "wall_s": round(wall_s, 1),
        "load": load,
        "rows": [asdict(r) for r in rows],
        "runs": [asdict(r) for r in runs],
    }
    harness.write_results("slow_box_alerts", text, document, args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
