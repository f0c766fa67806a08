"""Post-training INT8 (QDQ) of an ONNX detector with ONNX Runtime's static quantiser.

The backbone and neck become int8 (per-channel symmetric weights, uint8 activations, min/max
calibration on real frames letterboxed exactly as the runtime does it); the nodes whose names
start with one of `keep_float_prefixes` (the baked-in pre-processing and box decoding) stay
float32: the decode's softmax over box bins and the class sigmoid lose most of the accuracy for
little speed when quantised, as the YOLO head does in the TFLite route (`quantize.py`).
The QDQ model runs on any ONNX Runtime (CPU kernels fuse it into QLinearConv etc.) and TensorRT.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from detection.errors import ExportError
from detection.letterbox import letterbox_batch

logger = logging.getLogger(__name__)

QUANTISED_OPS: tuple[str, ...] = (
    "Conv",
    "LeakyRelu",
    "Add",
    "Concat",
    "MaxPool",
    "Resize",
    "Mul",
    "Sigmoid",
)


def quantize_onnx_int8(
    float_model: Path,
    target: Path,
    frames: Sequence[npt.NDArray[np.uint8]],
    input_size: tuple[int, int],
    keep_float_prefixes: Sequence[str] = (),
) -> Path:
    """Write `target`: `float_model` quantised to INT8 QDQ, calibrated on BGR `frames`."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if not frames:
        raise ExportError("INT8 calibration needs at least one frame")
    model = onnx.load(str(float_model))
    input_name = model.graph.input[0].name
    keep_float = [
        n.name for n in model.graph.node if any(n.name.startswith(p) for p in keep_float_prefixes)
    ]

    class _Frames(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._batches: Iterator[npt.NDArray[np.uint8]] = iter(frames)

        def get_next(self) -> dict[str, npt.NDArray[np.float32]] | None:
            frame = next(self._batches, None)
            if frame is None:
                return None
            batch, _ = letterbox_batch([frame], input_size)
            return {input_name: batch}

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="int8-") as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        quant_pre_process(str(float_model), str(prepared), skip_symbolic_shape=True)
        quantize_static(
            str(prepared),
            str(target),
            _Frames(),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(QUANTISED_OPS),
            nodes_to_exclude=keep_float,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
        )
    # the quantiser drops metadata: carry class names and identity over
    quantised = onnx.load(str(target))
    props = {p.key: p.value for p in model.metadata_props}
    props["precision"] = "int8"
    onnx.helper.set_model_props(quantised, props)
    onnx.save(quantised, str(target))
    logger.info("INT8 %s from %s (%d calibration frames)", target, float_model, len(frames))
    return target
