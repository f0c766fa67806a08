"""The labelled test world: moving objects of four classes over real background video.

`scenario` decides a scene from a preset and a seed, `motion` moves objects on a ground plane,
`sprites` draws them, `render` composites frames with exact boxes and visibility, `events` knows
the zone/line events of the `events` preset, `writer` writes a scene folder (MP4 + MOT truth) and
`dataset` a YOLO training set. Needs OpenCV and ffmpeg; never torch.
"""

from testbed.scenes.dataset import DatasetConfig, write_dataset
from testbed.scenes.render import Effects, FrameTruth, SceneRenderer
from testbed.scenes.scenario import PRESETS, ScenarioSpec, build_renderer, make_scenario
from testbed.scenes.sprites import CLASS_NAMES
from testbed.scenes.writer import SceneFolder, write_scene

__all__ = [
    "CLASS_NAMES",
    "PRESETS",
    "DatasetConfig",
    "Effects",
    "FrameTruth",
    "ScenarioSpec",
    "SceneFolder",
    "SceneRenderer",
    "build_renderer",
    "make_scenario",
    "write_dataset",
    "write_scene",
]
