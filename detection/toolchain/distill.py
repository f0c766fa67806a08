"""Distillation: fine-tune the edge model on one camera's escalations, labelled by the cloud.

    vision-toolchain distill --labels /var/lib/edge-agent/labels --camera gate \\
        --base models/edge/edge-yolov5n-320.onnx \\
        --current models/edge/edge-yolov5n-320-int8.tflite \\
        --general-data val/ --replay-data train/ --out models/site/

Steps (`distill`):
1. read the camera's records from the label store and split them by time (`distill_data`);
2. make the base network trainable: a `.pt` checkpoint as it is, an ONNX export rebuilt with its
   batch norms re-inserted (`onnx_weights.trainable_checkpoint_from_onnx`);
3. fine-tune it on the camera's training records, the cloud's confident boxes as labels, with
   replayed general images;
4. export INT8 TFLite through the same path as the committed edge model, calibrated on the
   camera's own images;
5. evaluate the model in service (`--current`) and the new one on the camera's held-out records
   and on the general validation set, and hand the new one over only if it is better on the
   camera (by at least `min_camera_gain` mAP50) and loses at most `max_general_drop` mAP50 on the
   general set. Otherwise `DistillRefused`: nothing is written to `--out`.

The hand-over is a file in `--out` named after the camera and the time
(`edge-<camera>-<UTC stamp>-int8.tflite`, which is the model's name in the agent's status and
metrics) with its report (`.distill.json`, `.distill.md`) beside it; the agent picks it up when
its `detector:` section names it and it reloads (SIGHUP), with probation and roll-back.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from detection.coco_eval import MetricsResult
from detection.errors import DetectionError, ExportError
from detection.label_format import read_camera_records
from detection.toolchain.dataset import LabelledDataset, load_dataset
from detection.toolchain.distill_data import (
    LabelCut,
    held_out_dataset,
    split_by_time,
    write_training_set,
)
from detection.toolchain.evaluate import evaluate_model, onnx_class_names
from detection.toolchain.export import export_tflite_int8
from detection.toolchain.onnx_weights import trainable_checkpoint
from detection.toolchain.train import FineTuneSpec, finetune_detector

logger = logging.getLogger(__name__)

CALIBRATION_IMAGES = 100
BN_SAMPLE_IMAGES = 64


class DistillRefused(DetectionError):
    """The distilled model is worse on the camera's held-out images or on the general set;
    `report` says by how much."""

    def __init__(self, message: str, report: DistillReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class DistillSettings:
    """Everything `distill` needs besides the fine-tuning schedule."""

    labels: Path
    camera: str
    base: Path  # the network to fine-tune: ultralytics .pt, or its ONNX export
    current: Path  # the model in service, compared against (any format)
    general_data: Path  # labelled YOLO folder / data.yaml: the forgetting check
    out: Path
    work: Path
    architecture: str = "yolov5n.yaml"  # of an ONNX base
    replay_data: Path | None = None
    replay_fraction: float = 0.5
    cut: LabelCut = field(default_factory=LabelCut)
    holdout_fraction: float = 0.2
    max_records: int | None = 500
    min_camera_gain: float = 0.0
    max_general_drop: float = 0.005


@dataclass(frozen=True)
class Scores:
    """mAP50 / mAP50-95 of one model on the camera's held-out images and the general set."""

    camera_map50: float
    camera_map50_95: float
    general_map50: float
    general_map50_95: float

    @classmethod
    def of(cls, camera: MetricsResult, general: MetricsResult) -> Scores:
        return cls(camera.map50, camera.map50_95, general.map50, general.map50_95)


@dataclass(frozen=True)
class DistillReport:
    """What was trained on, how both models score, and whether the new one was handed over."""

    camera: str
    train_images: int
    replay_images: int
    held_out_images: int
    label_boxes: int
    masked_boxes: int
    skipped_records: int
    before: Scores
    after: Scores
    accepted: bool
    reason: str
    model: str  # the handed-over file, or the refused one in the work folder
    train_seconds: float
    seconds: float
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        def clean(value: Any) -> Any:
            if isinstance(value, float) and math.isnan(value):
                return None
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            return value

        return {k: clean(v) for k, v in asdict(self).items()}

    def markdown(self) -> str:
        b, a = self.before, self.after
        rows = [
            ("camera held-out mAP50", b.camera_map50, a.camera_map50),
            ("camera held-out mAP50-95", b.camera_map50_95, a.camera_map50_95),
            ("general mAP50", b.general_map50, a.general_map50),
            ("general mAP50-95", b.general_map50_95, a.general_map50_95),
        ]
        lines = [
            f"## Distillation for camera `{self.camera}`: "
            f"{'handed over' if self.accepted else 'refused'}",
            "",
            f"{self.reason}",
            "",
            f"Trained on {self.train_images} camera images ({self.label_boxes} cloud boxes as "
            f"labels, {self.masked_boxes} uncertain ones masked) and {self.replay_images} replayed "
            f"general images in {self.train_seconds:.0f} s; scored on the camera's "
            f"{self.held_out_images} newest images (the cloud's boxes as truth).",
            "",
            "| metric | in service | distilled | delta |",
            "|---|---:|---:|---:|",
        ]
        lines += [f"| {n} | {x:.4f} | {y:.4f} | {y - x:+.4f} |" for n, x, y in rows]
        return "\n".join(lines) + "\n"


def _class_names(settings: DistillSettings) -> tuple[str, ...]:
    base = settings.base
    if base.suffix.lower() == ".onnx":
        names = onnx_class_names(base)
    else:
        from ultralytics.models import YOLO

        names = tuple(str(n) for n in YOLO(str(base), task="detect").names.values())
    if not names:
        raise ExportError(f"{base} does not name its classes")
    return names


def _calibration(images: Path, folder: Path) -> Path:
    """Up to `CALIBRATION_IMAGES` training images, camera and replayed ones in their proportion
    (calibrating on the camera alone would set activation ranges the general set overflows)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    files = sorted(images.iterdir())
    step = max(1, len(files) // CALIBRATION_IMAGES)
    for path in files[::step][:CALIBRATION_IMAGES]:
        shutil.copyfile(path, folder / path.name)
    return folder


def _scores(model: Path, camera: LabelledDataset, general: LabelledDataset, imgsz: int) -> Scores:
    return Scores.of(evaluate_model(model, camera, imgsz), evaluate_model(model, general, imgsz))


def _verdict(settings: DistillSettings, before: Scores, after: Scores) -> tuple[bool, str]:
    gain = after.camera_map50 - before.camera_map50
    drop = before.general_map50 - after.general_map50
    camera = (
        f"camera held-out mAP50 {before.camera_map50:.4f} -> {after.camera_map50:.4f} ({gain:+.4f})"
    )
    general = (
        f"general mAP50 {before.general_map50:.4f} -> {after.general_map50:.4f} ({-drop:+.4f})"
    )
    failures = []
    if not gain > settings.min_camera_gain or math.isnan(gain):
        failures.append(
            f"not better on the camera: {camera} (needs > {settings.min_camera_gain:+g})"
        )
    if drop > settings.max_general_drop or math.isnan(drop):
        failures.append(
            f"forgets the general set: {general} (allowed drop {settings.max_general_drop:g})"
        )
    if failures:
        return False, "; ".join(failures)
    return True, f"{camera}; {general}"


def distill(settings: DistillSettings, schedule: FineTuneSpec) -> DistillReport:
    """Run the steps of the module docstring; raises `DistillRefused` with the report written
    to the work folder when the new model is not handed over."""
    started = time.perf_counter()
    if not settings.current.is_file():
        raise ExportError(f"model in service not found: {settings.current}")
    found = read_camera_records(settings.labels, settings.camera)
    train, held = split_by_time(found.records, settings.holdout_fraction, settings.max_records)
    for part, records in (("training", train), ("held-out", held)):
        if not any(settings.cut.split(r)[0].any() for r in records):
            raise ExportError(
                f"the cloud answered no box scoring >= {settings.cut.label_score:g} in the "
                f"camera's {part} records: nothing to learn from or to score on (lower the label "
                "score, or collect more)"
            )
    names = _class_names(settings)
    general = load_dataset(settings.general_data)
    settings.work.mkdir(parents=True, exist_ok=True)
    data = write_training_set(
        train,
        settings.cut,
        names,
        settings.work / "data",
        replay=settings.replay_data,
        replay_fraction=settings.replay_fraction,
        seed=schedule.seed,
    )
    camera = held_out_dataset(held, settings.cut, names)
    sample = [r.image for r in train[:: max(1, len(train) // BN_SAMPLE_IMAGES)]]
    checkpoint = trainable_checkpoint(settings.base, settings.architecture, sample, settings.work)
    trained = finetune_detector(checkpoint, schedule, data.data_yaml, settings.work, "distilled")
    calibration = _calibration(data.images, settings.work / "calibration")
    exported = export_tflite_int8(
        str(trained.weights), settings.work / "export", schedule.imgsz, calibration
    )
    before = _scores(settings.current, camera, general, schedule.imgsz)
    after = _scores(exported, camera, general, schedule.imgsz)
    accepted, reason = _verdict(settings, before, after)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    model = exported
    if accepted:
        settings.out.mkdir(parents=True, exist_ok=True)
        model = settings.out / f"edge-{settings.camera}-{stamp}-int8.tflite"
        shutil.copyfile(exported, model)
    report = DistillReport(
        camera=settings.camera,
        train_images=data.camera_images,
        replay_images=data.replay_images,
        held_out_images=len(held),
        label_boxes=data.label_boxes,
        masked_boxes=data.masked_boxes,
        skipped_records=len(found.skipped),
        before=before,
        after=after,
        accepted=accepted,
        reason=reason,
        model=str(model),
        train_seconds=trained.seconds,
        seconds=time.perf_counter() - started,
        settings={
            "label_score": settings.cut.label_score,
            "ignore_score": settings.cut.ignore_score,
            "holdout_fraction": settings.holdout_fraction,
            "max_records": settings.max_records,
            "replay_fraction": settings.replay_fraction,
            **{k: v for k, v in asdict(schedule).items() if k not in ("device", "workers")},
        },
    )
    where = model if accepted else settings.work / "refused.tflite"
    where.with_name(f"{where.name}.distill.json").write_text(
        json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8"
    )
    where.with_name(f"{where.name}.distill.md").write_text(report.markdown(), encoding="utf-8")
    if not accepted:
        raise DistillRefused(f"distilled model refused: {reason}", report)
    return report
