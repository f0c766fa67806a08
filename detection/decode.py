"""Decode raw YOLO head output into per-image candidate boxes (before NMS).

Two layouts are supported, told apart by shape:
- the original YOLOv5 export `(B, N, 5+C)`: `cx, cy, w, h, objectness, class scores...`;
- the anchor-free heads (YOLOv5u / v8 and later) `(B, 4+C, N)`: `cx, cy, w, h, class scores...`.
Box coordinates come in model-input pixels or normalised to 0..1 (LiteRT exports).
"""

from __future__ import annotations

import enum
from typing import Literal

import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from detection.errors import DetectionError, UnknownOutputLayoutError

BoxUnits = Literal["auto", "pixels", "normalized"]
# In "auto" mode boxes whose coordinates all stay below this are taken as normalised (0..1);
# a pixel-space box of a >= 32 px input practically never does.
_NORMALIZED_MAX_COORD = 2.0


class OutputLayout(enum.Enum):
    """The memory layout of a YOLO detection head's output."""

    YOLOV5 = "yolov5"  # (B, N, 5+C) with objectness
    ANCHOR_FREE = "anchor_free"  # (B, 4+C, N)


def detect_layout(shape: tuple[int, ...], num_classes: int | None = None) -> OutputLayout:
    """Tell the layout from an output shape; `num_classes` settles the ambiguous cases."""
    if len(shape) != 3:
        raise UnknownOutputLayoutError(
            f"YOLO output must be 3-D (B, N, 5+C) or (B, 4+C, N), got shape {shape}"
        )
    _, rows, cols = shape
    if num_classes is not None:
        if rows == 4 + num_classes and cols != 5 + num_classes:
            return OutputLayout.ANCHOR_FREE
        if cols == 5 + num_classes and rows != 4 + num_classes:
            return OutputLayout.YOLOV5
        raise UnknownOutputLayoutError(
            f"output shape {shape} fits neither (B, N, {5 + num_classes}) nor "
            f"(B, {4 + num_classes}, N) for {num_classes} classes"
        )
    if rows < cols and rows >= 5:
        return OutputLayout.ANCHOR_FREE
    if cols < rows and cols >= 6:
        return OutputLayout.YOLOV5
    raise UnknownOutputLayoutError(
        f"cannot tell the layout of output shape {shape}: expected (B, N, 5+C) with N > 5+C "
        "or (B, 4+C, N) with N > 4+C; set num_classes to disambiguate"
    )


def _split(
    output: npt.NDArray[np.float32], layout: OutputLayout
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Return `cxcywh (B, N, 4)` and final class scores `(B, N, C)`."""
    if layout is OutputLayout.ANCHOR_FREE:
        rows = output.transpose(0, 2, 1)
        return rows[..., :4], rows[..., 4:]
    return output[..., :4], output[..., 5:] * output[..., 4:5]


def _scale_boxes(
    cxcywh: npt.NDArray[np.float32], input_shape: tuple[int, int], box_units: BoxUnits
) -> npt.NDArray[np.float32]:
    normalized = box_units == "normalized" or (
        box_units == "auto"
        and cxcywh.size > 0
        and float(np.nanmax(np.abs(cxcywh))) <= _NORMALIZED_MAX_COORD
    )
    if not normalized:
        return cxcywh
    h, w = input_shape
    return cxcywh * np.array([w, h, w, h], dtype=np.float32)


def _to_xyxy(cxcywh: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    half = np.clip(cxcywh[:, 2:4], 0, None) / 2
    return np.concatenate([cxcywh[:, :2] - half, cxcywh[:, :2] + half], axis=1)


def decode_yolo(
    output: npt.NDArray[np.float32],
    input_shape: tuple[int, int],
    confidence_threshold: float,
    box_units: BoxUnits = "auto",
    num_classes: int | None = None,
) -> list[Detections]:
    """Candidates above `confidence_threshold` per image, xyxy in model-input pixels, before NMS.

    Each box takes its best class (score = objectness x class score for YOLOv5). Rows with
    non-finite values are dropped rather than poisoning NMS.
    """
    if not 0.0 <= confidence_threshold <= 1.0:
        raise DetectionError(f"confidence_threshold must be in [0, 1], got {confidence_threshold}")
    output = np.asarray(output, dtype=np.float32)
    layout = detect_layout(output.shape, num_classes)
    cxcywh, class_scores = _split(output, layout)
    results: list[Detections] = []
    for boxes, scores in zip(cxcywh, class_scores, strict=True):
        class_id = scores.argmax(axis=1)
        confidence = scores[np.arange(scores.shape[0]), class_id]
        keep = (confidence > confidence_threshold) & np.isfinite(boxes).all(axis=1)
        keep &= np.isfinite(confidence)
        boxes_kept = _scale_boxes(boxes[keep], input_shape, box_units)
        results.append(
            Detections(
                xyxy=_to_xyxy(boxes_kept),
                confidence=confidence[keep],
                class_id=class_id[keep],
            )
        )
    return results
