"""An ultralytics checkpoint rebuilt from an ONNX export, to export a committed model again.

The committed models are exports (ONNX, INT8 TFLite); the training checkpoint stays in the build
cache. To export the same network at another input shape (a fixed-shape INT8 model for a 16:9
camera, 320x192) without training again, `checkpoint_from_onnx` builds the architecture,
fuses it as ultralytics does before exporting (convolutions and batch norms folded), loads the
ONNX file's initializers by name into it, and checks that the rebuilt model gives the ONNX
model's output on a probe input before it saves the `.pt`. A file whose weights do not fit the
architecture, or whose outputs differ, is refused (`ExportError`).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detection.toolchain.export import ExportError, offline_environment

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
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


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


def checkpoint_from_onnx(
    onnx_path: Path, architecture: str, class_names: Sequence[str], out: Path
) -> Path:
    """Write `out` (an ultralytics `.pt`) holding `architecture` with `onnx_path`'s weights.

    `architecture`: the ultralytics YAML the ONNX model was exported from (e.g.
    `yolov5n.yaml`); `class_names`: its classes, in id order.
    """
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
