"""The source model itself (an ultralytics `.pt`) behind the `Runtime` protocol (`tools` extra).

Its raw head output goes through the project's own decode and NMS, so a source model and its
exports are compared like with like. Registered as runtime `torch` only when this module is
imported: it is a toolchain tool, never one of the edge or cloud runtimes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from configkit.base import StrictModel
from detection.errors import ModelLoadError, RuntimeUnavailableError
from detection.runtimes._io import FloatArray, check_images
from detection.runtimes.base import InputSpec, register_runtime

logger = logging.getLogger(__name__)


class TorchRuntimeConfig(StrictModel):
    """An ultralytics `.pt` checkpoint run by torch on the CPU, at a fixed square input size."""

    type: Literal["torch"] = "torch"
    model_path: Path = Field(description="Ultralytics `.pt` checkpoint.")
    input_size_px: int = Field(
        default=640, ge=32, le=4096, multiple_of=32, description="Square model input side."
    )


@register_runtime("torch")
class TorchRuntime:
    """An ultralytics detection model in float32 eval mode; returns its raw head output."""

    name: str = "torch"

    def __init__(self, config: TorchRuntimeConfig) -> None:
        try:
            import torch  # noqa: F401 - fail here with a clear message, not deep in ultralytics
        except ImportError as exc:
            raise RuntimeUnavailableError(
                "torch is not installed; the torch runtime needs the `tools` extra"
            ) from exc
        from detection.errors import ExportError
        from detection.toolchain.export import build_model

        path = config.model_path
        if not path.is_file():
            raise ModelLoadError(f"model weights file not found: {path}")
        try:
            yolo = build_model(str(path))
        except ExportError as exc:
            raise ModelLoadError(str(exc)) from exc
        self._model: Any = yolo.model.float().eval()
        names = getattr(yolo, "names", None) or {}
        self.class_names: tuple[str, ...] = tuple(str(names[k]) for k in sorted(names))
        size = config.input_size_px
        self._spec = InputSpec(height=size, width=size, layout="NCHW", max_batch_size=None)
        logger.info("loaded torch model %s (%d classes) at %s px", path, len(names), size)

    @property
    def input_spec(self) -> InputSpec:
        """Fixed square input of the configured size, any batch."""
        return self._spec

    def infer(self, images: FloatArray) -> FloatArray:
        """Raw head output for `images (B,3,H,W)` float32 RGB 0..1."""
        import torch

        check_images(images, self._spec)
        if self._model is None:
            raise RuntimeError("torch runtime is closed")
        with torch.inference_mode():
            output = self._model(torch.from_numpy(np.ascontiguousarray(images)))
        if isinstance(output, tuple | list):
            output = output[0]
        return np.asarray(output.float().numpy(), dtype=np.float32)

    def close(self) -> None:
        """Drop the model."""
        self._model = None
