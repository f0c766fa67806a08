"""Post-training INT8 quantisation of a float TFLite detector with ai-edge-quantizer.

Weights and activations become int8 (per-channel weights), except the detection head's final 1x1
convolutions and its box decoding (DFL, distance-to-box, stride scaling, the output concat),
which stay float32. Quantising those costs most of the accuracy for little speed: their int8
step is 1-5 px in box coordinates, and the single output tensor shares one scale between
boxes and class scores. Measured on the project's edge model (README, models/ACCURACY.md).
Calibration frames are letterboxed exactly as the runtime does it (`detection.letterbox`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from detection.errors import ExportError
from detection.letterbox import letterbox_batch

logger = logging.getLogger(__name__)

# Tensor names that litert-torch gives ultralytics' Detect head (regexes ai-edge-quantizer matches)
FLOAT_HEAD_PATTERNS: tuple[str, ...] = (
    r".*(Detect_\d+;\d+|DFL_dfl|_NormalizeCoords;|serving_default_output).*",
    r".*Detect_\d+/torch\.nn\.modules\.container\.Sequential_\d+/torch\.nn\.modules\.conv\.Conv2d_2.*",
)
SIGNATURE = "serving_default"


def _input_name(model: Path) -> str:
    from ai_edge_litert.interpreter import Interpreter

    signature = Interpreter(model_path=str(model)).get_signature_list().get(SIGNATURE)
    if not signature or len(signature["inputs"]) != 1:
        raise ExportError(f"{model} must have one input in signature {SIGNATURE!r}")
    return str(signature["inputs"][0])


CalibrationResult = dict[str, Any]


def _quantizer(float_model: Path, float_patterns: Sequence[str]) -> Any:
    from ai_edge_quantizer import qtyping, quantizer, recipe

    no_quantize = recipe.AlgorithmName.NO_QUANTIZE
    qt = quantizer.Quantizer(str(float_model))
    qt.load_quantization_recipe(recipe.static_wi8_ai8())
    # float32 graph input and output: runtimes and delegates take them as they are
    for op in (qtyping.TFLOperationName.INPUT, qtyping.TFLOperationName.OUTPUT):
        qt.update_quantization_recipe(regex=".*", operation_name=op, algorithm_key=no_quantize)
    for pattern in float_patterns:
        qt.update_quantization_recipe(
            regex=pattern,
            operation_name=qtyping.TFLOperationName.ALL_SUPPORTED,
            algorithm_key=no_quantize,
        )
    return qt


def calibrate_int8(
    float_model: Path,
    calibration_images: Sequence[Path],
    input_size: tuple[int, int],
    float_patterns: Sequence[str] = FLOAT_HEAD_PATTERNS,
) -> CalibrationResult:
    """Activation ranges of `float_model` on the images ({tensor name: ranges}): the slow part
    of quantisation, reusable by every `quantize_int8` that keeps at least `float_patterns`
    in float (the per-block search quantises many variants from one calibration)."""
    if not calibration_images:
        raise ExportError("INT8 calibration needs at least one image")
    name = _input_name(float_model)
    samples = []
    for path in calibration_images:
        image = cv2.imread(str(path))
        if image is None:
            raise ExportError(f"cannot read calibration image {path}")
        batch, _ = letterbox_batch([np.asarray(image, dtype=np.uint8)], input_size)
        samples.append({name: batch})
    result: CalibrationResult = _quantizer(float_model, float_patterns).calibrate(
        {SIGNATURE: samples}
    )
    return result


def quantize_int8(
    float_model: Path,
    target: Path,
    calibration_images: Sequence[Path],
    input_size: tuple[int, int],
    float_patterns: Sequence[str] = FLOAT_HEAD_PATTERNS,
    calibration: CalibrationResult | None = None,
) -> Path:
    """Write `target`: `float_model` with int8 weights and activations, calibrated on the images
    (or with the ranges of an earlier `calibrate_int8`)."""
    if calibration is None:
        calibration = calibrate_int8(float_model, calibration_images, input_size, float_patterns)
    qt = _quantizer(float_model, float_patterns)
    target.parent.mkdir(parents=True, exist_ok=True)
    qt.quantize(calibration_result=calibration).export_model(str(target), overwrite=True)
    logger.info(
        "INT8 %s from %s (%d calibration images)", target, float_model, len(calibration_images)
    )
    return target
