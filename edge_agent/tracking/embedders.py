"""Appearance embedders: one L2-normalised feature row per box, or none at all."""

from __future__ import annotations

import logging
from typing import Protocol

import cv2
import numpy as np
import numpy.typing as npt

from detection.errors import ModelLoadError
from edge_agent.config.tracker import TrackerConfig
from edge_agent.tracking.cnn_embedder import MobileNetV2Embedder

logger = logging.getLogger(__name__)

Float32Array = npt.NDArray[np.float32]


class Embedder(Protocol):
    """Turns the boxes of one frame into appearance features."""

    def embed(self, frame: npt.NDArray[np.uint8], xyxy: npt.ArrayLike) -> Float32Array | None:
        """Features `(n, d)` float32 for `xyxy (n, 4)`, or None.

        Rows are unit length, except all-zero rows for boxes with no pixels in the frame.
        """
        ...


class NoEmbedder:
    """No appearance features: the tracker falls back to IoU matching."""

    def embed(self, frame: npt.NDArray[np.uint8], xyxy: npt.ArrayLike) -> Float32Array | None:
        """Always None."""
        return None


class HistogramEmbedder:
    """Joint HSV colour histogram of each crop, a cheap appearance cue for CPU-only edges.

    Expects BGR `(H, W, 3)` uint8 frames; boxes are clipped to the frame, and a box with
    no pixels left gets a uniform histogram.
    """

    def __init__(self, hue_bins: int = 8, saturation_bins: int = 4, value_bins: int = 4) -> None:
        for name, bins in (
            ("hue_bins", hue_bins),
            ("saturation_bins", saturation_bins),
            ("value_bins", value_bins),
        ):
            if not 1 <= bins <= 256:
                raise ValueError(f"{name} must be in [1, 256], got {bins}")
        self.bins = (int(hue_bins), int(saturation_bins), int(value_bins))

    @property
    def dimension(self) -> int:
        """Length of one feature row."""
        return self.bins[0] * self.bins[1] * self.bins[2]

    def embed(self, frame: npt.NDArray[np.uint8], xyxy: npt.ArrayLike) -> Float32Array | None:
        """One unit-length histogram row per box."""
        image = np.asarray(frame)
        if image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"frame must have shape (H, W, 3), got {image.shape}")
        boxes = np.asarray(xyxy, dtype=np.float64).reshape(-1, 4)
        height, width = image.shape[:2]
        out = np.empty((boxes.shape[0], self.dimension), dtype=np.float32)
        for i, (x1, y1, x2, y2) in enumerate(boxes):
            left, top = int(np.clip(np.floor(x1), 0, width)), int(np.clip(np.floor(y1), 0, height))
            right, bottom = (
                int(np.clip(np.ceil(x2), 0, width)),
                int(np.clip(np.ceil(y2), 0, height)),
            )
            out[i] = self._histogram(image[top:bottom, left:right])
        return out

    def _histogram(self, crop: npt.NDArray[np.uint8]) -> Float32Array:
        if crop.size == 0:
            hist = np.ones(self.dimension, dtype=np.float64)
        else:
            # OpenCV's full-range HSV (hue 0..255) and calcHist: ~20x the speed of numpy here.
            hsv = cv2.cvtColor(np.ascontiguousarray(crop), cv2.COLOR_BGR2HSV_FULL)
            hist = (
                cv2.calcHist([hsv], [0, 1, 2], None, list(self.bins), [0, 256, 0, 256, 0, 256])
                .astype(np.float64)
                .reshape(-1)
            )
        return (hist / np.linalg.norm(hist)).astype(np.float32)


def build_embedder(config: TrackerConfig, threads: int = 1) -> Embedder:
    """The embedder `config.embedder` names; `threads`: CPU threads of a CNN embedder.

    Raises `ModelLoadError` when the `mobilenetv2` model file is missing or cannot be loaded.
    """
    if config.embedder == "none":
        return NoEmbedder()
    if config.embedder == "histogram":
        return HistogramEmbedder()
    if config.embedder_model_path is None:  # the config validator already refuses this
        raise ModelLoadError("the mobilenetv2 embedder needs `embedder_model_path`")
    return MobileNetV2Embedder(config.embedder_model_path, threads=threads)
