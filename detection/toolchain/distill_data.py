"""A camera's kept escalations as training and held-out data for distillation.

The label store (`detection.label_format`) holds, per camera, the images the edge escalated and
the cloud's boxes for them. Distillation needs three things from it:

- a **time split**: the newest `holdout_fraction` of the records is held out, the rest trains.
  Neighbouring frames look alike, so a random split would score the model on near-copies of its
  training images; a time split scores it on what the camera shows later, as in service.
- **labels with a confidence cut**: a cloud box at or above `label_score` is a label. A box
  between `ignore_score` and `label_score` is uncertain: in a training image its area is painted
  over in the letterbox grey (neither taught as an object nor as background); in the held-out
  set it is ignored (neither a hit nor a miss). Boxes below `ignore_score` are dropped.
- **replay** (optional): images of the general training set mixed in, so the fine-tuned model
  keeps what it knew (no catastrophic forgetting).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import yaml

from detection.coco_eval import GroundTruth
from detection.errors import ExportError
from detection.label_format import LabelRecord
from detection.letterbox import PAD_VALUE
from detection.toolchain.dataset import LabelledDataset, LabelledImage, load_dataset, yolo_lines

logger = logging.getLogger(__name__)

MIN_RECORDS = 10


@dataclass(frozen=True)
class LabelCut:
    """Which cloud boxes are labels (`>= label_score`) and which are uncertain (`>= ignore`)."""

    # measured (bench.models.edge_distill): the cloud's boxes from 0.3 up were mostly right, and its
    # recall on a hard camera is low, so a higher cut leaves most objects unlabelled
    label_score: float = 0.3
    ignore_score: float = 0.15

    def __post_init__(self) -> None:
        if not 0.0 <= self.ignore_score <= self.label_score <= 1.0:
            raise ExportError(
                f"need 0 <= ignore score <= label score <= 1, got {self.ignore_score} and "
                f"{self.label_score}"
            )

    def split(self, record: LabelRecord) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """(label mask, uncertain mask) over the record's boxes."""
        labels = record.score >= self.label_score
        return labels, ~labels & (record.score >= self.ignore_score)


def split_by_time(
    records: Sequence[LabelRecord], holdout_fraction: float, max_records: int | None = None
) -> tuple[list[LabelRecord], list[LabelRecord]]:
    """(train, held out): the newest `max_records` (all when None), the latest
    `holdout_fraction` of them held out. Records come oldest first."""
    if not 0.0 < holdout_fraction < 1.0:
        raise ExportError(f"holdout fraction must be in (0, 1), got {holdout_fraction}")
    chosen = list(records[-max_records:] if max_records else records)
    if len(chosen) < MIN_RECORDS:
        raise ExportError(
            f"only {len(chosen)} labelled images for this camera; distillation needs at least "
            f"{MIN_RECORDS} (keep labels for longer, or escalate more)"
        )
    held = max(1, round(len(chosen) * holdout_fraction))
    return chosen[:-held], chosen[-held:]


def held_out_dataset(
    records: Sequence[LabelRecord], cut: LabelCut, class_names: Sequence[str]
) -> LabelledDataset:
    """The held-out records as a labelled set: the cloud's confident boxes as truth, its
    uncertain ones ignored."""
    images = []
    for record in records:
        labels, uncertain = cut.split(record)
        keep = labels | uncertain
        truth = GroundTruth(
            xyxy=record.xyxy[keep], class_id=record.class_id[keep], ignore=uncertain[keep]
        )
        images.append(LabelledImage(record.image, truth, (record.size[1], record.size[0])))
    root = records[0].image.parent.parent if records else Path()
    return LabelledDataset(root=root, images=tuple(images), class_names=tuple(class_names))


def _write_record(
    record: LabelRecord, cut: LabelCut, images: Path, labels: Path
) -> tuple[int, int]:
    """Write one training image (uncertain boxes painted over) and its labels; returns
    (labels written, boxes masked)."""
    label_mask, uncertain = cut.split(record)
    stem = f"{record.image.parent.name}_{record.image.stem}"
    if uncertain.any():
        image = cv2.imread(str(record.image), cv2.IMREAD_COLOR)
        if image is None:
            raise ExportError(f"cannot read labelled image {record.image}")
        for x1, y1, x2, y2 in record.xyxy[uncertain].round().astype(int):
            image[y1:y2, x1:x2] = PAD_VALUE
        if not cv2.imwrite(str(images / f"{stem}.jpg"), image, [cv2.IMWRITE_JPEG_QUALITY, 95]):
            raise ExportError(f"cannot write {images / stem}.jpg")
    else:
        shutil.copyfile(record.image, images / f"{stem}.jpg")
    size = (record.size[1], record.size[0])
    lines = yolo_lines(record.xyxy[label_mask], record.class_id[label_mask], size)
    (labels / f"{stem}.txt").write_text("".join(f"{line}\n" for line in lines))
    return int(label_mask.sum()), int(uncertain.sum())


def _replay(dataset: LabelledDataset, count: int, seed: int, images: Path, labels: Path) -> int:
    order = np.random.default_rng(seed).permutation(len(dataset.images))
    chosen = [dataset.images[int(i)] for i in order[:count]]
    for number, item in enumerate(chosen):
        stem = f"replay{number:05d}_{item.path.stem}"
        shutil.copyfile(item.path, images / f"{stem}{item.path.suffix.lower()}")
        lines = yolo_lines(item.ground_truth.xyxy, item.ground_truth.class_id, item.size)
        (labels / f"{stem}.txt").write_text("".join(f"{line}\n" for line in lines))
    return len(chosen)


@dataclass(frozen=True)
class TrainingSet:
    """A written YOLO training folder: its `data.yaml` and how many images of each kind."""

    data_yaml: Path
    images: Path
    camera_images: int
    replay_images: int
    label_boxes: int
    masked_boxes: int


def write_training_set(
    records: Sequence[LabelRecord],
    cut: LabelCut,
    class_names: Sequence[str],
    folder: Path,
    *,
    replay: Path | None = None,
    replay_fraction: float = 0.5,
    seed: int = 0,
) -> TrainingSet:
    """`folder/{images,labels}/train` and `folder/data.yaml` from the camera's training records
    (plus `replay_fraction` x as many images from the YOLO set `replay`, its `train` split)."""
    if folder.exists():
        shutil.rmtree(folder)
    images, labels = folder / "images" / "train", folder / "labels" / "train"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    label_boxes = masked = 0
    for record in records:
        written, painted = _write_record(record, cut, images, labels)
        label_boxes += written
        masked += painted
    replayed = 0
    if replay is not None and replay_fraction > 0:
        general = load_dataset(replay, "train")
        replayed = _replay(general, round(len(records) * replay_fraction), seed, images, labels)
    data_yaml = folder / "data.yaml"
    document = {
        "path": str(folder.resolve()),
        "train": "images/train",
        "val": "images/train",
        "names": dict(enumerate(class_names)),
    }
    data_yaml.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    logger.info(
        "distillation set %s: %d camera images (%d labels, %d masked), %d replayed",
        folder,
        len(records),
        label_boxes,
        masked,
        replayed,
    )
    return TrainingSet(data_yaml, images, len(records), replayed, label_boxes, masked)
