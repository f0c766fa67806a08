"""Scene generator throughput: frames/s per preset at 640x360, with ground truth.

    python -m bench.hybrid.scene_generator [--frames 500] [--seed 0]

Two columns: rendering with ground truth (MOT rows built for every frame), and rendering plus
writing the scene folder (H.264 via an ffmpeg pipe, gt.txt, ...). Background decoding happens
once per process and is reported apart ("setup"). Target: >= 100 frames/s rendering with truth.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from testbed.cli import default_cache_dir
from testbed.scenes.scenario import PRESETS, build_renderer, make_scenario
from testbed.scenes.writer import mot_rows, write_scene

TARGET_FPS = 100.0


def _render_fps(preset: str, seed: int, frames: int, cache_dir: Path) -> tuple[float, float, float]:
    """(setup seconds, frames/s rendering with truth, mean boxes per frame)."""
    spec = make_scenario(preset, seed, n_frames=frames)
    started = time.perf_counter()
    renderer = build_renderer(spec, cache_dir)
    setup_s = time.perf_counter() - started
    boxes = 0
    started = time.perf_counter()
    for index in range(spec.n_frames):
        _, truth = renderer.render(index)
        boxes += len(mot_rows(index, truth))
    return setup_s, spec.n_frames / (time.perf_counter() - started), boxes / spec.n_frames


def _write_fps(preset: str, seed: int, frames: int, cache_dir: Path) -> float:
    spec = make_scenario(preset, seed, n_frames=frames)
    with tempfile.TemporaryDirectory(prefix="scene-bench-") as out:
        started = time.perf_counter()
        write_scene(spec, Path(out), cache_dir)
        return spec.n_frames / (time.perf_counter() - started)


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cache_dir = default_cache_dir()
    print(f"640x360, {args.frames} frames per preset, seed {args.seed}")
    header = f"{'preset':<10} {'boxes/frame':>11} {'setup s':>8} {'render+GT fps':>14} "
    print(header + f"{'+ write MP4 fps':>16} {'meets target':>13}")
    for preset in PRESETS:
        setup_s, render_fps, boxes = _render_fps(preset, args.seed, args.frames, cache_dir)
        write_fps = _write_fps(preset, args.seed, args.frames, cache_dir)
        ok = "yes" if render_fps >= TARGET_FPS else "NO"
        print(
            f"{preset:<10} {boxes:>11.1f} {setup_s:>8.2f} {render_fps:>14.0f} "
            f"{write_fps:>16.0f} {ok:>13}"
        )


if __name__ == "__main__":
    main()
