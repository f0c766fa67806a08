"""Structured channel pruning of a YOLO detector (torch-pruning), before fine-tuning it back.

`prune_checkpoint` removes whole output channels of convolutions, the same share (`ratio`) of
each prunable layer, ranked by the L2 magnitude of the channel's weights across every layer
coupled to it (torch-pruning's dependency graph keeps the residual adds, concatenations and
batch norms of C3 blocks consistent). The detection head's final convolutions and its DFL stay
whole: their channels are the output layout. The result is a smaller dense network, so every
runtime (ONNX Runtime, LiteRT, TensorRT) gets faster without sparse kernels; it loses accuracy
until it is fine-tuned (`train.finetune_detector(..., keep_architecture=True)`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detection.errors import ExportError
from detection.toolchain.export import offline_environment

logger = logging.getLogger(__name__)

# Layer widths stay multiples of 4: CPU kernels vectorise over channels, and odd widths made the
# pruned network slower than the original in ONNX Runtime (bench.edge.edge_prune, ratio 0.2: 36 %
# fewer MACs, 15.1 vs 12.5 ms). Multiples of 8 would halve YOLOv5n's 16-channel layers.
ROUND_TO = 4


@dataclass(frozen=True)
class PruneResult:
    """The pruned checkpoint and the network's multiply-accumulates and parameters."""

    path: Path
    macs_before: float
    macs_after: float
    params_before: int
    params_after: int

    @property
    def macs_saved(self) -> float:
        """Share of the multiply-accumulates removed."""
        return 1.0 - self.macs_after / self.macs_before


def count_macs(model: Any, imgsz: int) -> tuple[float, int]:
    """(multiply-accumulates, parameters) of `model` on one `imgsz` x `imgsz` image."""
    import torch
    import torch_pruning as tp

    example = torch.zeros(1, 3, imgsz, imgsz)
    macs, params = tp.utils.count_ops_and_params(model.eval(), example)
    return float(macs), int(params)


def check_ratio(ratio: float) -> None:
    """A pruning ratio must leave every layer some channels."""
    if not 0.0 < ratio < 0.9:
        raise ExportError(f"pruning ratio must be in (0, 0.9), got {ratio}")


def prune_checkpoint(
    checkpoint: Path, out: Path, ratio: float, imgsz: int = 320, round_to: int = ROUND_TO
) -> PruneResult:
    """Write `out`: `checkpoint`'s network (an unfused ultralytics `.pt`) with `ratio` of the
    output channels of every prunable convolution removed, widths kept multiples of
    `round_to`."""
    check_ratio(ratio)
    if not checkpoint.is_file():
        raise ExportError(f"checkpoint to prune not found: {checkpoint}")
    offline_environment()
    import torch
    import torch_pruning as tp
    from ultralytics.nn.modules import Detect

    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    model = (saved.get("ema") or saved["model"]).float()
    heads = [m for m in model.modules() if isinstance(m, Detect)]
    if len(heads) != 1:
        raise ExportError(f"{checkpoint} is not an ultralytics detection model")
    head: Any = heads[0]
    if not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()):
        raise ExportError(f"{checkpoint} is fused (no batch norms): prune the trainable model")
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    macs_before, params_before = count_macs(model, imgsz)
    ignored = [head.cv2[i][-1] for i in range(head.nl)] + [head.cv3[i][-1] for i in range(head.nl)]
    ignored.append(head.dfl)
    example = torch.zeros(1, 3, imgsz, imgsz)
    pruner = tp.pruner.MetaPruner(
        model,
        example,
        importance=tp.importance.GroupMagnitudeImportance(p=2),
        pruning_ratio=ratio,
        ignored_layers=ignored,
        round_to=round_to,
    )
    pruner.step()
    macs_after, params_after = count_macs(model, imgsz)
    out.parent.mkdir(parents=True, exist_ok=True)
    train_args = dict(saved.get("train_args") or {"task": "detect"})
    torch.save({"model": model, "train_args": train_args, "date": None}, out)
    result = PruneResult(out, macs_before, macs_after, params_before, params_after)
    logger.info(
        "pruned %s at ratio %.2f: %.0f -> %.0f MMACs (-%.0f %%), %d -> %d parameters",
        checkpoint,
        ratio,
        macs_before / 1e6,
        macs_after / 1e6,
        result.macs_saved * 100,
        params_before,
        params_after,
    )
    return result


@dataclass(frozen=True)
class PrunedModel:
    """The pruned, fine-tuned network exported to ONNX, with its counts and training time."""

    onnx: Path
    weights: Path
    pruned: PruneResult
    macs: float
    params: int
    train_seconds: float


def prune_and_finetune(
    source: Path,
    data_yaml: Path,
    ratio: float,
    schedule: Any,
    work: Path,
    architecture: str = "yolov5n.yaml",
) -> PrunedModel:
    """Prune `source` (`.pt` or its ONNX export), fine-tune the pruned network on `data_yaml`'s
    train split with `schedule` (a `train.FineTuneSpec`) and export it to ONNX in `work`."""
    import torch

    from detection.toolchain.dataset import load_dataset
    from detection.toolchain.export import export_onnx
    from detection.toolchain.onnx_weights import trainable_checkpoint
    from detection.toolchain.train import finetune_detector

    check_ratio(ratio)  # before anything slow
    work.mkdir(parents=True, exist_ok=True)
    train = load_dataset(data_yaml, "train").images
    sample = [i.path for i in train[:: max(1, len(train) // 64)][:64]]
    trainable = trainable_checkpoint(source, architecture, sample, work)
    pruned = prune_checkpoint(trainable, work / "pruned.pt", ratio, schedule.imgsz)
    tuned = finetune_detector(
        pruned.path, schedule, data_yaml, work, "pruned-tuned", keep_architecture=True
    )
    onnx = export_onnx(str(tuned.weights), work / "onnx", schedule.imgsz, dynamic=True)
    model = torch.load(tuned.weights, map_location="cpu", weights_only=False)["model"]
    macs, params = count_macs(model.float(), schedule.imgsz)
    return PrunedModel(onnx, tuned.weights, pruned, macs, params, tuned.seconds)
