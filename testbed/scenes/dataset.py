"""A YOLO-format training set sampled from many seeded scenes of mixed presets.

```
<out>/images/{train,val,test}/<scene>_f<frame>.jpg
<out>/labels/{train,val,test}/<scene>_f<frame>.txt   one `cls cx cy w h` per line, 0..1
<out>/data.yaml                                       absolute path, split folders, class names
<out>/manifest.json                                   scenes (preset, seed) per split, counts
```
Each split draws its scene seeds from its own disjoint range, so no scene (hence no background
crop, no track) is shared between splits. Objects less visible than `min_label_visibility` or
smaller than `min_label_side_px` are left out of the labels (they stay in the scene's MOT truth).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml

from testbed.scenes.render import FrameTruth
from testbed.scenes.scenario import build_renderer, make_scenario
from testbed.scenes.sprites import CLASS_NAMES

logger = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("train", "val", "test")
# Seeds of split k are base * SEED_STRIDE + k * SPLIT_SEED_OFFSET + i, i < SPLIT_SEED_OFFSET.
SPLIT_SEED_OFFSET = 100_000
SEED_STRIDE = len(SPLITS) * SPLIT_SEED_OFFSET
DEFAULT_PRESETS: tuple[str, ...] = ("quiet", "crowded", "small_far", "events")


@dataclass(frozen=True)
class DatasetConfig:
    """What to generate.

    `scenes_per_split`: scenes for train/val/test; `frames_per_scene`: frames each scene lasts;
    `every_n_frames`: keep every Nth frame; `presets`: cycled over the scenes of a split;
    `jpeg_quality`: of the written images (the renderer itself is JPEG-free).
    """

    scenes_per_split: tuple[int, int, int]
    frames_per_scene: int = 250
    every_n_frames: int = 10
    seed: int = 0
    presets: tuple[str, ...] = DEFAULT_PRESETS
    min_label_visibility: float = 0.25
    min_label_side_px: int = 2
    jpeg_quality: int = 95
    width_px: int = 640
    height_px: int = 360

    def __post_init__(self) -> None:
        if any(n < 0 or n >= SPLIT_SEED_OFFSET for n in self.scenes_per_split):
            raise ValueError(f"scenes_per_split must be in 0..{SPLIT_SEED_OFFSET - 1}")
        if self.frames_per_scene < 1 or self.every_n_frames < 1:
            raise ValueError("frames_per_scene and every_n_frames must be >= 1")
        if not self.presets:
            raise ValueError("presets must not be empty")
        if not 0.0 <= self.min_label_visibility <= 1.0:
            raise ValueError(
                f"min_label_visibility must be in [0, 1], got {self.min_label_visibility}"
            )


def split_seeds(base_seed: int, split: str, count: int) -> list[int]:
    """Scene seeds of `split` (disjoint ranges per split)."""
    k = SPLITS.index(split)
    return [base_seed * SEED_STRIDE + k * SPLIT_SEED_OFFSET + i for i in range(count)]


def yolo_labels(
    truth: FrameTruth,
    width_px: int,
    height_px: int,
    *,
    min_visibility: float,
    min_side_px: int,
) -> list[str]:
    """YOLO label lines `cls cx cy w h` (normalised) for the boxes visible enough."""
    lines = []
    for k in range(len(truth)):
        x, y, w, h = (int(v) for v in truth.box_xywh[k])
        if truth.visibility[k] < min_visibility or min(w, h) < min_side_px:
            continue
        cx, cy = (x + w / 2.0) / width_px, (y + h / 2.0) / height_px
        lines.append(
            f"{int(truth.class_id[k])} {cx:.6f} {cy:.6f} {w / width_px:.6f} {h / height_px:.6f}"
        )
    return lines


def _write_split(
    config: DatasetConfig, out: Path, split: str, count: int, cache_dir: Path
) -> list[dict[str, Any]]:
    images, labels = out / "images" / split, out / "labels" / split
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    scenes = []
    for i, seed in enumerate(split_seeds(config.seed, split, count)):
        preset = config.presets[i % len(config.presets)]
        spec = make_scenario(
            preset, seed, n_frames=config.frames_per_scene,
            width_px=config.width_px, height_px=config.height_px,
        )  # fmt: skip
        renderer = build_renderer(spec, cache_dir)
        n_images = n_boxes = 0
        for index in range(0, spec.n_frames, config.every_n_frames):
            image, truth = renderer.render(index)
            stem = f"{spec.name}_f{index:05d}"
            params = [cv2.IMWRITE_JPEG_QUALITY, config.jpeg_quality]
            if not cv2.imwrite(str(images / f"{stem}.jpg"), image, params):
                raise OSError(f"could not write {images / stem}.jpg")
            lines = yolo_labels(
                truth, spec.width_px, spec.height_px,
                min_visibility=config.min_label_visibility, min_side_px=config.min_label_side_px,
            )  # fmt: skip
            (labels / f"{stem}.txt").write_text("".join(line + "\n" for line in lines))
            n_images += 1
            n_boxes += len(lines)
        scenes.append(
            {
                "name": spec.name,
                "preset": preset,
                "seed": seed,
                "images": n_images,
                "boxes": n_boxes,
            }
        )
        logger.info("%s: scene %s, %d images, %d boxes", split, spec.name, n_images, n_boxes)
    return scenes


def write_dataset(config: DatasetConfig, out: Path, cache_dir: Path) -> Path:
    """Generate the dataset into `out`; returns the path of `data.yaml`."""
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"seed": config.seed, "class_names": list(CLASS_NAMES), "splits": {}}
    for split, count in zip(SPLITS, config.scenes_per_split, strict=True):
        manifest["splits"][split] = _write_split(config, out, split, count, cache_dir)
    data = {
        "path": str(out),
        "train": "images/train",
        "val": "images/val",
        "test": "images/test",
        "nc": len(CLASS_NAMES),
        "names": dict(enumerate(CLASS_NAMES)),
    }
    data_yaml = out / "data.yaml"
    data_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return data_yaml


def read_labels(path: Path) -> np.ndarray[Any, np.dtype[np.float64]]:
    """A YOLO label file as an `(n, 5)` array `cls cx cy w h`."""
    text = path.read_text().strip()
    return np.array([[float(v) for v in line.split()] for line in text.splitlines()]).reshape(-1, 5)
