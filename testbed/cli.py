"""`python -m testbed`: generate labelled scenes and YOLO datasets.

    python -m testbed scene --preset crowded --seed 3 --out DIR [--frames N] [--static-camera]
    python -m testbed dataset --out DIR --train-scenes N --val-scenes N --test-scenes N \
        --frames-per-scene N --every N --seed S
    python -m testbed clip vtest bikes [--source]   # fetch real clips, print their paths
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

CACHE_DIR_ENV = "TESTBED_CACHE_DIR"
DEFAULT_CACHE_DIR = Path(__file__).resolve().parents[1] / ".cache" / "media"


def default_cache_dir() -> Path:
    """Sample clip cache: `$TESTBED_CACHE_DIR`, else the repository's `.cache/media`."""
    return Path(os.environ.get(CACHE_DIR_ENV, str(DEFAULT_CACHE_DIR)))


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `python -m testbed`."""
    from testbed.scenes.scenario import DEFAULT_FPS, PRESETS

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache-dir", type=Path, default=None, help="sample clip cache")
    common.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ...")
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    scene = sub.add_parser(
        "scene", parents=[common], help="render one scene: video.mp4 + MOT ground truth"
    )
    scene.add_argument("--preset", choices=PRESETS, required=True)
    scene.add_argument("--seed", type=int, default=0)
    scene.add_argument("--out", type=Path, required=True, help="parent folder of the scene")
    scene.add_argument("--frames", type=_positive, default=None, help="frames (preset default)")
    scene.add_argument("--width", type=_positive, default=640, help="width in pixels")
    scene.add_argument("--height", type=_positive, default=360, help="height in pixels")
    scene.add_argument("--fps", type=float, default=DEFAULT_FPS)
    scene.add_argument("--no-video", action="store_true", help="ground truth only")
    scene.add_argument(
        "--static-camera",
        action="store_true",
        help="hold the background's first frame (a fixed camera); the name ends in -static",
    )
    data = sub.add_parser(
        "dataset", parents=[common], help="write a YOLO-format dataset from seeded scenes"
    )
    data.add_argument("--out", type=Path, required=True)
    data.add_argument("--train-scenes", type=_non_negative, default=20)
    data.add_argument("--val-scenes", type=_non_negative, default=4)
    data.add_argument("--test-scenes", type=_non_negative, default=4)
    data.add_argument("--frames-per-scene", type=_positive, default=250)
    data.add_argument("--every", type=_positive, default=10, help="keep every Nth frame")
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--presets", nargs="+", choices=PRESETS, default=None)
    data.add_argument("--min-visibility", type=float, default=0.25, help="label threshold")
    clip = sub.add_parser(
        "clip", parents=[common], help="fetch real sample clips and print their cached paths"
    )
    clip.add_argument("names", nargs="+", help="clip names (testbed.media.sample_clip_names)")
    clip.add_argument("--source", action="store_true", help="the original files, not transcoded")
    return parser


def _print_clips(names: Sequence[str], cache_dir: Path, source: bool) -> int:
    from testbed.media import MediaError, clip_source, sample_clip, sample_clip_names

    for name in names:
        if name not in sample_clip_names():
            print(f"unknown clip {name!r}; expected one of {sample_clip_names()}", file=sys.stderr)
            return 2
    try:
        for name in names:
            print(clip_source(cache_dir, name) if source else sample_clip(cache_dir, name=name))
    except MediaError as exc:
        print(f"python -m testbed clip: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    cache_dir = args.cache_dir or default_cache_dir()
    if args.command == "clip":
        return _print_clips(args.names, cache_dir, args.source)
    started = time.perf_counter()
    if args.command == "scene":
        from testbed.scenes.scenario import make_scenario
        from testbed.scenes.writer import write_scene

        spec = make_scenario(
            args.preset, args.seed, n_frames=args.frames,
            width_px=args.width, height_px=args.height, fps=args.fps,
            static_camera=args.static_camera,
        )  # fmt: skip
        folder = write_scene(spec, args.out, cache_dir, write_video=not args.no_video)
        print(f"{folder.root}  ({spec.n_frames} frames, {time.perf_counter() - started:.1f} s)")
        return 0
    from testbed.scenes.dataset import DEFAULT_PRESETS, DatasetConfig, write_dataset

    config = DatasetConfig(
        scenes_per_split=(args.train_scenes, args.val_scenes, args.test_scenes),
        frames_per_scene=args.frames_per_scene,
        every_n_frames=args.every,
        seed=args.seed,
        presets=tuple(args.presets) if args.presets else DEFAULT_PRESETS,
        min_label_visibility=args.min_visibility,
    )
    data_yaml = write_dataset(config, args.out, cache_dir)
    print(f"{data_yaml}  ({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
