"""Helpers the runtimes share: checking the `infer` input, layout changes and batch splitting."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt

from detection.runtimes.base import InputSpec, Layout

FloatArray = npt.NDArray[np.float32]


def layout_of(shape: tuple[int, ...]) -> Layout | None:
    """`NCHW` or `NHWC` for a rank-4 image shape with 3 channels, else None."""
    if len(shape) != 4:
        return None
    if shape[1] == 3:
        return "NCHW"
    if shape[3] == 3:
        return "NHWC"
    return None


def check_images(images: FloatArray, spec: InputSpec) -> None:
    """Raise `ValueError` unless `images` is float32 `(B, 3, H, W)` matching the model's size."""
    if not isinstance(images, np.ndarray) or images.dtype != np.float32:
        dtype = getattr(images, "dtype", type(images).__name__)
        raise ValueError(f"images must be a float32 numpy array, got {dtype}")
    if images.ndim != 4 or images.shape[1] != 3 or images.shape[0] < 1:
        raise ValueError(f"images must have shape (B>=1, 3, H, W), got {images.shape}")
    for axis, name, expected in ((2, "height", spec.height), (3, "width", spec.width)):
        if expected is not None and images.shape[axis] != expected:
            raise ValueError(f"model input {name} is {expected}, got {images.shape[axis]}")


def to_layout(images: FloatArray, layout: Layout) -> FloatArray:
    """`images (B,3,H,W)` as a contiguous array in the model's layout."""
    if layout == "NHWC":
        return np.ascontiguousarray(images.transpose(0, 2, 3, 1))
    return np.ascontiguousarray(images)


def chunks(images: FloatArray, size: int) -> Iterator[FloatArray]:
    """Split along the batch axis into pieces of at most `size`."""
    for start in range(0, images.shape[0], size):
        yield images[start : start + size]


def run_fixed_batch(
    images: FloatArray, batch: int, run: Callable[[FloatArray], FloatArray]
) -> FloatArray:
    """Run a fixed-batch model: split into `batch`-sized pieces, zero-pad the last, trim output."""
    outputs = []
    for piece in chunks(images, batch):
        n = piece.shape[0]
        if n < batch:
            pad = np.zeros((batch - n, *piece.shape[1:]), dtype=piece.dtype)
            piece = np.concatenate([piece, pad])
        outputs.append(run(piece)[:n])
    return np.concatenate(outputs)
