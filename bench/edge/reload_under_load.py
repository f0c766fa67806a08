"""Config reloads under load: does a camera that a reload does not touch lose frames?

One agent runs the `events` scene's video as two live cameras (`file_replay: live`, looping, 25
fps, each analysed at `--target-fps`) for `--seconds`. Variants, side by side in one
run:

- `steady`: no reload;
- `reloads`: every `--every-s` a reload changes the second camera (its zone moves), so it is
  stopped and rebuilt while the first camera is untouched (the requests go through
  `EdgeAgent.request_reload`, as the status page's and SIGHUP's do);
- `model swaps`: every `--every-s` a reload points the `detector:` section at the other of two
  copies of the model (as a fleet update does: a new file in the updater's cache), so the model
  is loaded and warmed aside and swapped in between two batches while both cameras run on.

For the untouched camera it reports frames analysed per second, frames its newest-frame slot
dropped (replaced before the loop took them), and the longest gap between two of its analysed
frames; for the reloads, how long the frame loop spent applying each. Prints a table and writes
`bench/results/reload_under_load.md` and `.json`.

    python -m bench.edge.reload_under_load [--seconds 30] [--every-s 2]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import harness
from bench.edge._edge_common import MODELS, agent_config, ensure_scene, temp_dir
from bench.harness import RESULTS
from detection.detector import Detector
from edge_agent.config import EdgeAgentConfig
from edge_agent.pipeline import EdgeAgent, FrameOutcome

UNTOUCHED = "cam-0"


@dataclass(frozen=True)
class Result:
    """One variant's numbers for the untouched camera."""

    name: str
    seconds: float
    reloads: int
    fps: float
    slot_drops: int
    drops_per_min: float
    max_gap_ms: float
    reload_apply_ms_median: float
    reload_apply_ms_max: float


def _with_second(config: EdgeAgentConfig, shifted: bool) -> EdgeAgentConfig:
    """Two cameras on the same clip; the second one's zones moved 1 % right when `shifted`."""
    first = config.cameras[0]
    zones = [
        zone.model_copy(update={"points": [(min(1.0, x + 0.01), y) for x, y in zone.points]})
        for zone in first.zones
    ]
    second = first.model_copy(update={"name": "cam-1", "zones": zones if shifted else first.zones})
    return config.model_copy(update={"cameras": [first, second]})


def _with_model(config: EdgeAgentConfig, model_path: Path) -> EdgeAgentConfig:
    """`config` with its detector reading `model_path` (same runtime, same classes)."""
    runtime = config.detector.runtime.model_copy(update={"model_path": model_path})
    detector = config.detector.model_copy(update={"runtime": runtime})
    return config.model_copy(update={"detector": detector})


Change = Callable[[EdgeAgentConfig, bool], EdgeAgentConfig]


def camera_change(config: EdgeAgentConfig, flipped: bool) -> EdgeAgentConfig:
    """The `reloads` variant's change: the second camera's zones moved (or back)."""
    return _with_second(config, flipped)


def model_change(copy: Path) -> Change:
    """The `model swaps` variant's change: the detector on `copy` of its model (or back)."""

    def change(config: EdgeAgentConfig, flipped: bool) -> EdgeAgentConfig:
        return _with_second(_with_model(config, copy) if flipped else config, False)

    return change


def run_variant(
    name: str,
    config: EdgeAgentConfig,
    seconds: float,
    every_s: float | None,
    change: Change = camera_change,
) -> Result:
    """Run the agent for `seconds`, applying `change` by a reload every `every_s` (None:
    never)."""
    agent = EdgeAgent.from_config(_with_second(config, False))
    arrivals: list[float] = []

    def hook(outcome: FrameOutcome) -> None:
        if outcome.camera == UNTOUCHED:
            arrivals.append(time.monotonic())

    agent.hooks.append(hook)
    applied_ms: list[float] = []
    original_reload = agent.reload

    def timed_reload(new: EdgeAgentConfig, detector: Detector | None = None) -> object:
        started = time.perf_counter()
        try:
            return original_reload(new, detector)
        finally:
            applied_ms.append((time.perf_counter() - started) * 1000.0)

    agent.reload = timed_reload  # type: ignore[method-assign,assignment]
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    agent.start()
    runner.start()
    untouched = agent.workers[0]
    time.sleep(2.0)  # warm-up: the stream opens, the model warms
    drops_before = untouched.source.slot.drops
    started = time.monotonic()
    first_arrival = len(arrivals)
    shifted = False
    next_reload = started + (every_s or seconds + 1.0)
    while (now := time.monotonic()) < started + seconds:
        if every_s is not None and now >= next_reload:
            shifted = not shifted
            agent.request_reload(change(config, shifted)).result(30.0)
            next_reload += every_s
        time.sleep(0.01)
    elapsed = time.monotonic() - started
    drops = untouched.source.slot.drops - drops_before
    window = arrivals[first_arrival:]
    stop.set()
    runner.join(10.0)
    agent.close(flush_timeout_s=2.0)
    gaps = [b - a for a, b in zip(window, window[1:], strict=False)]
    return Result(
        name=name,
        seconds=round(elapsed, 1),
        reloads=len(applied_ms),
        fps=round(len(window) / elapsed, 1),
        slot_drops=drops,
        drops_per_min=round(drops * 60.0 / elapsed, 1),
        max_gap_ms=round(1000.0 * max(gaps, default=0.0), 1),
        reload_apply_ms_median=round(statistics.median(applied_ms), 2) if applied_ms else 0.0,
        reload_apply_ms_max=round(max(applied_ms), 2) if applied_ms else 0.0,
    )


def table(results: list[Result]) -> str:
    """The results as a Markdown table."""
    lines = [
        "| variant | reloads | untouched fps | slot drops (per min) | max gap ms "
        "| reload applied in ms (median / max) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.reloads} | {r.fps} | {r.slot_drops} ({r.drops_per_min}) "
            f"| {r.max_gap_ms} | {r.reload_apply_ms_median} / {r.reload_apply_ms_max} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the variants and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--every-s", type=float, default=2.0)
    parser.add_argument("--model", default="litert-int8", choices=["litert-int8", "onnx"])
    parser.add_argument("--target-fps", type=float, default=10.0, help="Analysed per camera.")
    args = parser.parse_args(argv)
    from testbed.broker import start_broker

    scene = ensure_scene(None)
    results: list[Result] = []
    with temp_dir("bench-reload-") as work:
        broker = start_broker("mosquitto", Path(work))
        try:
            model = Path(work) / f"model-copy{MODELS[args.model].suffix}"
            shutil.copyfile(MODELS[args.model], model)
            variants: tuple[tuple[str, float | None, Change], ...] = (
                ("steady", None, camera_change),
                ("reloads", args.every_s, camera_change),
                ("model swaps", args.every_s, model_change(model)),
            )
            for name, every, change in variants:
                config = agent_config(
                    scene,
                    camera_urls=[str(scene / "video.mp4")],
                    model=args.model,
                    threads=1,
                    embedder="histogram",
                    target_fps=args.target_fps,
                    mqtt_port=broker.port,
                    outbox_path=Path(work) / f"{name}.sqlite3",
                )
                camera = config.cameras[0].model_copy(update={"loop_file": True})
                config = config.model_copy(update={"cameras": [camera]})
                results.append(run_variant(name, config, args.seconds, every, change))
        finally:
            broker.stop()
    text = table(results)
    print(text)
    header = (
        "# Reloads under load\n\n`python -m bench.edge.reload_under_load "
        f"--seconds {args.seconds:g} --every-s {args.every_s:g} --model {args.model} "
        f"--target-fps {args.target_fps:g}` (2-core machine; two cameras replay the events scene "
        "live at 25 fps, each analysed at the target rate; slot drops are frames the loop did "
        "not take before the next one came)."
        "\n\n"
    )
    document = [asdict(r) for r in results]
    harness.write_results("reload_under_load", header + text, document, RESULTS, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
