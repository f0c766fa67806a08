"""Cut a YOLO dataset into fixed-size tiles at native scale.

A detector trained on tiles of `tile_px` and run on whole frames at their native size sees objects
at the scale it learned them: the cheap way, on CPUs, to train a model for a large input size.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import yaml

logger = logging.getLogger(__name__)

MIN_TILE_BOX_SIDE_PX = 2


def _read_boxes(label: Path, width: int, height: int) -> npt.NDArray[np.float64]:
    """YOLO label lines as `(n, 5)` rows of class, x1, y1, x2, y2 in pixels."""
    rows = [line.split() for line in label.read_text().splitlines() if line.strip()]
    if not rows:
        return np.empty((0, 5))
    data = np.array(rows, dtype=np.float64)
    cx, cy, w, h = data[:, 1] * width, data[:, 2] * height, data[:, 3] * width, data[:, 4] * height
    return np.stack([data[:, 0], cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)


def tile_labels(boxes: npt.NDArray[np.float64], x0: int, y0: int, tile_px: int) -> list[str]:
    """YOLO lines for the parts of `boxes` inside the tile at (x0, y0); slivers are dropped."""
    lines = []
    for cls, x1, y1, x2, y2 in boxes:
        x1, x2 = np.clip([x1 - x0, x2 - x0], 0, tile_px)
        y1, y2 = np.clip([y1 - y0, y2 - y0], 0, tile_px)
        if min(x2 - x1, y2 - y1) < MIN_TILE_BOX_SIDE_PX:
            continue
        cx, cy = (x1 + x2) / 2 / tile_px, (y1 + y2) / 2 / tile_px
        w, h = (x2 - x1) / tile_px, (y2 - y1) / tile_px
        lines.append(f"{int(cls)} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}")
    return lines


def tile_split(
    src: Path, dst: Path, split: str, tile_px: int, tiles_per_image: int, seed: int
) -> int:
    """Write `tiles_per_image` random tiles of every image of `split`; returns the tile count."""
    rng = np.random.default_rng(seed)
    images_out, labels_out = dst / "images" / split, dst / "labels" / split
    images_out.mkdir(parents=True, exist_ok=True)
    labels_out.mkdir(parents=True, exist_ok=True)
    count = 0
    for image_path in sorted((src / "images" / split).glob("*.jpg")):
        image = cv2.imread(str(image_path))
        if image is None:
            raise OSError(f"cannot read {image_path}")
        height, width = image.shape[:2]
        boxes = _read_boxes(src / "labels" / split / f"{image_path.stem}.txt", width, height)
        for k in range(tiles_per_image):
            x0 = int(rng.integers(0, max(width - tile_px, 0) + 1))
            y0 = int(rng.integers(0, max(height - tile_px, 0) + 1))
            tile = image[y0 : y0 + tile_px, x0 : x0 + tile_px]
            stem = f"{image_path.stem}_t{k}"
            cv2.imwrite(str(images_out / f"{stem}.jpg"), tile, [cv2.IMWRITE_JPEG_QUALITY, 95])
            lines = tile_labels(boxes, x0, y0, tile_px)
            (labels_out / f"{stem}.txt").write_text("".join(f"{line}\n" for line in lines))
            count += 1
    return count


def tile_dataset(src_yaml: Path, dst: Path, tile_px: int, tiles_per_image: int, seed: int) -> Path:
    """Tile the train split of the dataset at `src_yaml` (val is kept whole); returns the YAML."""
    data = yaml.safe_load(src_yaml.read_text())
    src = Path(data["path"])
    dst = dst.resolve()
    count = tile_split(src, dst, "train", tile_px, tiles_per_image, seed)
    shutil.copytree(src / "images" / "val", dst / "images" / "val", dirs_exist_ok=True)
    shutil.copytree(src / "labels" / "val", dst / "labels" / "val", dirs_exist_ok=True)
    out = dict(data, path=str(dst), train="images/train", val="images/val")
    out.pop("test", None)
    out_yaml = dst / "data.yaml"
    out_yaml.write_text(yaml.safe_dump(out, sort_keys=False))
    logger.info("tiled %s into %d tiles of %d px at %s", src, count, tile_px, dst)
    return out_yaml
