"""Shared detection core: batch type, letterbox, YOLO decoding, NMS, runtimes and the Detector."""

from detection.decode import OutputLayout, decode_yolo, detect_layout
from detection.detections import Detections
from detection.errors import (
    DetectionError,
    InvalidDetectionsError,
    ModelLoadError,
    RuntimeUnavailableError,
    UnknownOutputLayoutError,
)
from detection.letterbox import LetterboxInfo, letterbox, letterbox_batch
from detection.nms import batched_nms, box_iou, nms

__all__ = [
    "DetectionError",
    "Detections",
    "InvalidDetectionsError",
    "LetterboxInfo",
    "ModelLoadError",
    "OutputLayout",
    "RuntimeUnavailableError",
    "UnknownOutputLayoutError",
    "batched_nms",
    "box_iou",
    "decode_yolo",
    "detect_layout",
    "letterbox",
    "letterbox_batch",
    "nms",
]
