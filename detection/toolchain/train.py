"""Train a YOLO detector with ultralytics on a YOLO-format dataset, reproducibly, on CPU or GPU.

Part of the `tools` extra: ultralytics and torch are imported inside the functions.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detection.errors import ExportError
from detection.toolchain.export import offline_environment

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainSpec:
    """What to train: architecture YAML, input size, schedule and seed."""

    model_yaml: str
    imgsz: int
    epochs: int
    batch: int
    seed: int
    close_mosaic_epochs: int = 2
    lr0: float = 0.01
    device: str = "cpu"
    workers: int = 2

    def __post_init__(self) -> None:
        if not self.model_yaml.endswith((".yaml", ".yml")):
            raise ExportError(f"model_yaml must name a YOLO YAML, got {self.model_yaml!r}")
        if self.imgsz % 32 or not 64 <= self.imgsz <= 2048:
            raise ExportError(f"imgsz must be a multiple of 32 in 64..2048, got {self.imgsz}")
        if self.epochs < 1 or self.batch < 1:
            raise ExportError(f"epochs and batch must be >= 1, got {self.epochs}, {self.batch}")


@dataclass(frozen=True)
class TrainResult:
    """The trained weights and how long training took."""

    weights: Path
    seconds: float


def train_detector(spec: TrainSpec, data_yaml: Path, out_dir: Path, name: str) -> TrainResult:
    """Train from random weights; the final weights land at `out_dir/<name>.pt`."""
    return _train(spec.model_yaml, spec, data_yaml, out_dir, name, pretrained=False)


@dataclass(frozen=True)
class FineTuneSpec:
    """How to fine-tune trained weights: a short schedule at a low learning rate."""

    imgsz: int
    epochs: int
    batch: int = 16
    lr0: float = 0.002
    seed: int = 0
    mosaic: float = 1.0
    close_mosaic_epochs: int = 2
    warmup_epochs: float = 0.0
    optimizer: str = "SGD"
    device: str = "cpu"
    workers: int = 2

    def __post_init__(self) -> None:
        if self.imgsz % 32 or not 64 <= self.imgsz <= 2048:
            raise ExportError(f"imgsz must be a multiple of 32 in 64..2048, got {self.imgsz}")
        if self.epochs < 1 or self.batch < 1:
            raise ExportError(f"epochs and batch must be >= 1, got {self.epochs}, {self.batch}")
        if not 0.0 < self.lr0 <= 0.1:
            raise ExportError(f"lr0 must be in (0, 0.1], got {self.lr0}")


def finetune_detector(
    weights: Path,
    spec: FineTuneSpec,
    data_yaml: Path,
    out_dir: Path,
    name: str,
    *,
    keep_architecture: bool = False,
) -> TrainResult:
    """Fine-tune the ultralytics checkpoint `weights` (unfused: see `onnx_weights`); the final
    weights land at `out_dir/<name>.pt`.

    `keep_architecture`: train the checkpoint's own module as it is (a pruned network, whose
    layer widths its YAML no longer describes), instead of ultralytics' default of building the
    YAML's network and copying the matching weights into it.
    """
    if not weights.is_file():
        raise ExportError(f"weights to fine-tune not found: {weights}")
    return _train(
        str(weights),
        spec,
        data_yaml,
        out_dir,
        name,
        pretrained=True,
        trainer=_module_trainer() if keep_architecture else None,
    )


def _module_trainer() -> Any:
    """A `DetectionTrainer` that trains the loaded model module instead of rebuilding it."""
    from ultralytics.models.yolo.detect import DetectionTrainer

    class ModuleTrainer(DetectionTrainer):
        def get_model(self, cfg: Any = None, weights: Any = None, verbose: bool = True) -> Any:
            if weights is None:
                raise ExportError("keep_architecture needs a checkpoint holding the model")
            for parameter in weights.parameters():
                parameter.requires_grad_(True)
            return weights

    return ModuleTrainer


def _train(
    model_spec: str,
    spec: TrainSpec | FineTuneSpec,
    data_yaml: Path,
    out_dir: Path,
    name: str,
    *,
    pretrained: bool,
    trainer: Any = None,
) -> TrainResult:
    if not data_yaml.is_file():
        raise ExportError(f"dataset YAML not found: {data_yaml}")
    offline_environment()
    import torch
    from ultralytics.models import YOLO

    torch.manual_seed(spec.seed)
    model = YOLO(model_spec, task="detect")
    runs = out_dir / "runs"
    extra = (
        {
            "mosaic": spec.mosaic,
            "warmup_epochs": spec.warmup_epochs,
            "optimizer": spec.optimizer,
        }
        if isinstance(spec, FineTuneSpec)
        else {}
    )
    started = time.perf_counter()
    model.train(
        trainer=trainer,
        data=str(data_yaml),
        epochs=spec.epochs,
        imgsz=spec.imgsz,
        batch=spec.batch,
        seed=spec.seed,
        deterministic=True,
        device=spec.device,
        workers=spec.workers,
        lr0=spec.lr0,
        close_mosaic=spec.close_mosaic_epochs,
        pretrained=pretrained,
        amp=False,
        val=False,  # the project's own evaluation runs afterwards, on held-out data
        plots=False,
        project=str(runs),
        name=name,
        exist_ok=True,
        verbose=False,
        **extra,
    )
    seconds = time.perf_counter() - started
    last = runs / name / "weights" / "last.pt"
    if not last.is_file():
        raise ExportError(f"training of {name} finished without weights at {last}")
    weights = out_dir / f"{name}.pt"
    shutil.copyfile(last, weights)
    logger.info("trained %s in %.0f s -> %s", name, seconds, weights)
    return TrainResult(weights=weights, seconds=seconds)
