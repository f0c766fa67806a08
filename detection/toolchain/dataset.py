"""Read a labelled image folder in YOLO format into images with pixel-space ground truth.

Accepted layouts:
- a folder with `images/` and `labels/` side by side (`images/a.jpg` <-> `labels/a.txt`);
- a `data.yaml` (or a folder holding one) whose `path` + split entry (`val` by default) names
  the image folder; labels are found by swapping the last `images` path part for `labels`, as
  ultralytics does.
A label line is `class cx cy w h`, normalised to 0..1; an image without a label file has no boxes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import yaml

from detection.coco_eval import GroundTruth
from detection.errors import DetectionError
from detection.toolchain.export import IMAGE_SUFFIXES

logger = logging.getLogger(__name__)


class DatasetError(DetectionError, ValueError):
    """A labelled folder is missing, empty or holds a malformed label file."""


@dataclass(frozen=True)
class LabelledImage:
    """One image file and its ground truth in pixels (`xyxy`, `class_id`)."""

    path: Path
    ground_truth: GroundTruth
    size: tuple[int, int]  # (height, width)

    def load(self) -> npt.NDArray[np.uint8]:
        """The image as BGR uint8."""
        image = cv2.imread(str(self.path), cv2.IMREAD_COLOR)
        if image is None:
            raise DatasetError(f"cannot read image {self.path}")
        return np.asarray(image, dtype=np.uint8)


@dataclass(frozen=True)
class LabelledDataset:
    """Images with ground truth, and class names where the dataset names them."""

    root: Path
    images: tuple[LabelledImage, ...]
    class_names: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.images)

    def __iter__(self) -> Iterator[LabelledImage]:
        return iter(self.images)


def _image_size(path: Path) -> tuple[int, int]:
    image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if image is None:
        raise DatasetError(f"cannot read image {path}")
    return int(image.shape[0]), int(image.shape[1])


def _parse_line(text: str, path: Path, number: int) -> tuple[int, list[float]]:
    fields = text.split()
    if len(fields) != 5:
        raise DatasetError(
            f"{path}:{number}: expected 5 fields `class cx cy w h`, got {len(fields)}: {text!r}"
        )
    try:
        cls_value = float(fields[0])
        values = [float(v) for v in fields[1:]]
    except ValueError:
        raise DatasetError(f"{path}:{number}: fields must be numbers: {text!r}") from None
    if cls_value < 0 or not cls_value.is_integer():
        raise DatasetError(f"{path}:{number}: class must be a whole number >= 0: {fields[0]!r}")
    cx, cy, w, h = values
    inside = all(np.isfinite(values)) and all(0.0 <= v <= 1.0 for v in values)
    if not inside:
        raise DatasetError(f"{path}:{number}: cx cy w h must be normalised to 0..1: {text!r}")
    return int(cls_value), values


def read_labels(path: Path, size: tuple[int, int]) -> GroundTruth:
    """Boxes of one YOLO label file as pixel `xyxy` for an image of `size` (height, width)."""
    height, width = size
    classes: list[int] = []
    boxes: list[list[float]] = []
    if path.is_file():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            cls, (cx, cy, w, h) = _parse_line(line, path, number)
            x1, y1 = max(cx - w / 2, 0.0) * width, max(cy - h / 2, 0.0) * height
            x2, y2 = min(cx + w / 2, 1.0) * width, min(cy + h / 2, 1.0) * height
            classes.append(cls)
            boxes.append([x1, y1, x2, y2])
    return GroundTruth(
        xyxy=np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
        class_id=np.asarray(classes, dtype=np.int64),
    )


def yolo_lines(
    xyxy: npt.NDArray[np.float32], class_id: npt.NDArray[np.int64], size: tuple[int, int]
) -> list[str]:
    """Pixel `xyxy` boxes of an image of `size` (height, width) as YOLO label lines
    `class cx cy w h` (normalised): what `read_labels` reads back."""
    height, width = size
    lines = []
    for (x1, y1, x2, y2), cls in zip(xyxy, class_id, strict=True):
        cx, cy = (x1 + x2) / 2 / width, (y1 + y2) / 2 / height
        w, h = (x2 - x1) / width, (y2 - y1) / height
        lines.append(f"{int(cls)} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}")
    return lines


def _labels_dir(images_dir: Path) -> Path:
    parts = list(images_dir.parts)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            return Path(*parts)
    return images_dir.parent / "labels"


def _names(value: Any) -> tuple[str, ...]:
    if isinstance(value, dict):
        return tuple(str(value[k]) for k in sorted(value, key=int))
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return ()


def _from_yaml(path: Path, split: str) -> tuple[Path, tuple[str, ...]]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise DatasetError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or split not in data:
        raise DatasetError(f"{path}: no {split!r} entry naming the image folder")
    base = Path(str(data.get("path", "")))
    if not base.is_absolute():
        base = path.parent / base
    images = Path(str(data[split]))
    return (images if images.is_absolute() else base / images), _names(data.get("names"))


def load_dataset(location: Path, split: str = "val") -> LabelledDataset:
    """Read a YOLO-format folder (or `data.yaml`) into a `LabelledDataset`, sorted by file name."""
    location = Path(location)
    if not location.exists():
        raise DatasetError(f"dataset not found: {location}")
    names: tuple[str, ...] = ()
    if location.is_file():
        if location.suffix not in (".yaml", ".yml"):
            raise DatasetError(f"dataset must be a folder or a data.yaml, got {location}")
        images_dir, names = _from_yaml(location, split)
    elif (location / "data.yaml").is_file():
        images_dir, names = _from_yaml(location / "data.yaml", split)
    elif (location / "images").is_dir():
        images_dir = location / "images"
    else:
        raise DatasetError(f"{location}: expected an images/ folder (with labels/) or a data.yaml")
    if not images_dir.is_dir():
        raise DatasetError(f"image folder not found: {images_dir}")
    files = sorted(p for p in images_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise DatasetError(f"{images_dir} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    labels_dir = _labels_dir(images_dir)
    images = []
    for file in files:
        size = _image_size(file)
        images.append(LabelledImage(file, read_labels(labels_dir / f"{file.stem}.txt", size), size))
    boxes = sum(len(i.ground_truth) for i in images)
    logger.info("dataset %s: %d images, %d boxes", images_dir, len(images), boxes)
    return LabelledDataset(root=images_dir, images=tuple(images), class_names=names)
