"""An ultralytics checkpoint rebuilt from an ONNX export, to export a committed model again.

The committed models are exports (ONNX, INT8 TFLite); the training checkpoint stays in the build
cache. To export the same network at another input shape (a fixed-shape INT8 model for a 16:9
camera, 320x192) without training again, `checkpoint_from_onnx` builds the architecture,
fuses it as ultralytics does before exporting (convolutions and batch norms folded), loads the
ONNX file's initializers by name into it, and checks that the rebuilt model gives the ONNX
model's output on a probe input before it saves the `.pt`. A file whose weights do not fit the
architecture, or whose outputs differ, is refused (`ExportError`).

A fused model exports, but it does not fine-tune: ultralytics' trainer builds the unfused
architecture and keeps only the weights whose names match, so the folded biases would be lost,
and a network without batch norms trains badly. `trainable_checkpoint_from_onnx` puts the batch
norms back: it runs the fused network over sample images, records each convolution's per-channel
output mean and variance (the statistics a batch norm sees in training), and sets every batch
norm to those statistics with a scale and shift that undo them exactly. The result computes the
same function as the ONNX file in eval mode (checked as above), and in train mode its batch norms
normalise by batch statistics close to the recorded ones, so fine-tuning starts from the
exported model rather than from a disturbed one.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detection.errors import ExportError
from detection.toolchain.export import offline_environment

logger = logging.getLogger(__name__)

# Largest output difference accepted between the rebuilt model and the ONNX file, in the
# output's units (box pixels at the probe size, class scores): ONNX Runtime's fused kernels and
# graph simplification round differently from torch.
MAX_OUTPUT_DIFFERENCE = 0.01
PROBE_SIZE = (320, 320)


def _initializers(onnx_path: Path) -> dict[str, np.ndarray[Any, Any]]:
    import onnx
    from onnx import numpy_helper

    try:
        model = onnx.load(str(onnx_path))
    except (OSError, ValueError, onnx.onnx_cpp2py_export.checker.ValidationError) as exc:
        raise ExportError(f"cannot read ONNX model {onnx_path}: {exc}") from exc
    from detection.toolchain.fp16 import FP16_SUFFIX

    out = {}
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        if init.name.endswith(FP16_SUFFIX):  # stored as float16 by store_weights_fp16
            out[init.name.removesuffix(FP16_SUFFIX)] = array.astype(np.float32)
        else:
            out[init.name] = array
    return out


def _output_difference(model: Any, onnx_path: Path, size: tuple[int, int]) -> float:
    import onnxruntime as ort
    import torch

    probe = np.random.default_rng(0).random((1, 3, *size), dtype=np.float32)
    with torch.no_grad():
        output = model(torch.from_numpy(probe))
    rebuilt = (output[0] if isinstance(output, list | tuple) else output).numpy()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    reference = session.run(None, {session.get_inputs()[0].name: probe})[0]
    if rebuilt.shape != reference.shape:
        raise ExportError(
            f"the rebuilt model outputs {rebuilt.shape}, {onnx_path.name} {reference.shape}"
        )
    return float(np.abs(rebuilt - reference).max())


def _fused_model(onnx_path: Path, architecture: str, class_names: Sequence[str]) -> Any:
    """`architecture`, fused, holding `onnx_path`'s weights (shapes checked)."""
    offline_environment()
    import torch

    tasks: Any = importlib.import_module("ultralytics.nn.tasks")
    weights = _initializers(onnx_path)
    model: Any = tasks.DetectionModel(architecture, nc=len(class_names), verbose=False)
    model.fuse(verbose=False)
    state = model.state_dict()
    missing = [name for name in state if name not in weights]
    if missing:
        raise ExportError(
            f"{onnx_path.name} lacks {len(missing)} weights of a fused {architecture} "
            f"(e.g. {missing[:3]}): not an ultralytics export of it"
        )
    loaded = {}
    for name, tensor in state.items():
        value = torch.from_numpy(np.array(weights[name]))
        if tuple(value.shape) != tuple(tensor.shape):
            raise ExportError(
                f"{onnx_path.name}: {name} is {tuple(value.shape)}, {architecture} with "
                f"{len(class_names)} classes has {tuple(tensor.shape)}"
            )
        loaded[name] = value.to(tensor.dtype)
    model.load_state_dict(loaded)
    model.eval()
    model.names = dict(enumerate(class_names))
    return model


def _check_and_save(model: Any, onnx_path: Path, architecture: str, out: Path) -> Path:
    import torch

    model.eval()
    difference = _output_difference(model, onnx_path, PROBE_SIZE)
    if difference > MAX_OUTPUT_DIFFERENCE:
        raise ExportError(
            f"the rebuilt {architecture} differs from {onnx_path.name} by {difference:.4g} "
            f"(> {MAX_OUTPUT_DIFFERENCE}) on a probe input"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    model.args = {"imgsz": PROBE_SIZE[0], "task": "detect"}
    torch.save({"model": model, "train_args": {"task": "detect"}, "date": None}, out)
    logger.info(
        "rebuilt %s from %s (max output difference %.2g); saved %s",
        architecture,
        onnx_path,
        difference,
        out,
    )
    return out


def checkpoint_from_onnx(
    onnx_path: Path, architecture: str, class_names: Sequence[str], out: Path
) -> Path:
    """Write `out` (an ultralytics `.pt`) holding `architecture` with `onnx_path`'s weights,
    fused (for exports).

    `architecture`: the ultralytics YAML the ONNX model was exported from (e.g.
    `yolov5n.yaml`); `class_names`: its classes, in id order.
    """
    model = _fused_model(onnx_path, architecture, class_names)
    return _check_and_save(model, onnx_path, architecture, out)


def trainable_checkpoint_from_onnx(
    onnx_path: Path,
    architecture: str,
    class_names: Sequence[str],
    images: Sequence[np.ndarray[Any, Any]],
    out: Path,
    imgsz: int = 320,
) -> Path:
    """Write `out`: `architecture` unfused, with batch norms re-inserted from statistics measured
    on `images` (BGR uint8, at least one), computing the ONNX file's function (see the module
    docstring). The checkpoint to fine-tune when only the export is at hand."""
    if not images:
        raise ExportError("re-inserting batch norms needs at least one sample image")
    import torch

    fused = _fused_model(onnx_path, architecture, class_names)
    tasks: Any = importlib.import_module("ultralytics.nn.tasks")
    model: Any = tasks.DetectionModel(architecture, nc=len(class_names), verbose=False)
    fused_state = fused.state_dict()
    convs = {
        name: module
        for name, module in model.named_modules()
        if hasattr(module, "bn") and hasattr(module, "conv")
    }
    state = model.state_dict()
    with torch.no_grad():
        for name, tensor in state.items():
            if name in fused_state and fused_state[name].shape == tensor.shape:
                tensor.copy_(fused_state[name])
        # first, each batch norm as "add the folded bias": x / sqrt(1 + eps) * sqrt(1 + eps) + b
        for name, module in convs.items():
            bn = module.bn
            bn.running_mean.zero_()
            bn.running_var.fill_(1.0)
            bn.weight.fill_(float(np.sqrt(1.0 + bn.eps)))
            bn.bias.copy_(fused_state[f"{name}.conv.bias"])
    sums: dict[str, list[Any]] = {}

    def recorder(name: str) -> Any:
        def hook(_module: Any, inputs: tuple[Any, ...]) -> None:
            x = inputs[0].double()
            total = sums.setdefault(name, [0.0, 0.0, 0])
            total[0] = total[0] + x.sum(dim=(0, 2, 3))
            total[1] = total[1] + (x * x).sum(dim=(0, 2, 3))
            total[2] += x.shape[0] * x.shape[2] * x.shape[3]

        return hook

    from detection.letterbox import letterbox_batch

    handles = [m.bn.register_forward_pre_hook(recorder(n)) for n, m in convs.items()]
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(images), 8):
                batch, _infos = letterbox_batch(images[start : start + 8], (imgsz, imgsz))
                model(torch.from_numpy(batch))
    finally:
        for handle in handles:
            handle.remove()
    with torch.no_grad():
        for name, module in convs.items():
            total, squares, count = sums[name]
            mean = total / count
            var = (squares / count - mean * mean).clamp(min=1e-6)
            bn = module.bn
            bias = fused_state[f"{name}.conv.bias"].double()
            bn.running_mean.copy_(mean.float())
            bn.running_var.copy_(var.float())
            bn.weight.copy_(torch.sqrt(var + bn.eps).float())
            bn.bias.copy_((mean + bias).float())
    model.names = dict(enumerate(class_names))
    return _check_and_save(model, onnx_path, architecture, out)


def trainable_checkpoint(
    source: Path, architecture: str, sample: Sequence[Path], work: Path, imgsz: int = 320
) -> Path:
    """`source` as a checkpoint to fine-tune: an ultralytics `.pt` as it is; an ONNX export of
    `architecture` rebuilt with its batch norms re-inserted from the `sample` images, saved in
    `work`."""
    if not source.is_file():
        raise ExportError(f"model not found: {source}")
    suffix = source.suffix.lower()
    if suffix == ".pt":
        return source
    if suffix != ".onnx":
        raise ExportError(f"expected an ultralytics .pt or its ONNX export, got {source}")
    import cv2

    from detection.toolchain.evaluate import onnx_class_names

    names = onnx_class_names(source)
    if not names:
        raise ExportError(f"{source} does not name its classes (metadata `names`)")
    images = []
    for path in sample:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            raise ExportError(f"cannot read sample image {path}")
        images.append(np.asarray(image, np.uint8))
    target = work / f"{source.stem}.trainable.pt"
    return trainable_checkpoint_from_onnx(source, architecture, names, images, target, imgsz)
