"""Letterbox on the GPU for images that NVJPEG already decoded there (torch ops, lazy import).

Same geometry (`detection.letterbox.letterbox_geometry`, re-exported here) and `LetterboxInfo`
as `detection.letterbox.letterbox_batch` (which runs on the CPU with OpenCV), so boxes map back
to source pixels the same way, `scale_up=False` (native-scale region crops) included. Resizing
is bilinear, with antialiasing when shrinking (OpenCV uses INTER_AREA there): pixel values
differ by a few levels.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from detection.errors import DetectionError, RuntimeUnavailableError
from detection.letterbox import PAD_VALUE, LetterboxInfo, letterbox_geometry, scale_up_flags

logger = logging.getLogger(__name__)

DeviceTensor = Any  # torch.Tensor

__all__ = ["DeviceTensor", "letterbox_batch_gpu", "letterbox_geometry", "to_host"]


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise RuntimeUnavailableError(
            "torch is not installed (needed for the GPU letterbox)"
        ) from exc
    return torch


def _check_image(torch: Any, index: int, image: DeviceTensor) -> None:
    if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8:
        raise DetectionError(f"image {index}: expected a uint8 torch tensor, got {image!r:.60}")
    if image.ndim != 3 or image.shape[0] != 3 or 0 in image.shape:
        raise DetectionError(
            f"image {index}: expected shape (3, H, W) RGB, got {tuple(image.shape)}"
        )


def letterbox_batch_gpu(
    images: Sequence[DeviceTensor],
    new_shape: tuple[int, int],
    pad_value: int = PAD_VALUE,
    *,
    scale_up: bool | Sequence[bool] = True,
) -> tuple[DeviceTensor, list[LetterboxInfo]]:
    """Letterbox `uint8 (3, h, w)` RGB tensors into one float32 `(B, 3, H, W)` batch in 0..1.

    The batch stays on the images' device (all must share one); the infos map boxes back.
    `scale_up` (one flag, or one per image) as in `detection.letterbox.letterbox_batch`: False
    keeps a smaller image at native scale (region crops).
    """
    if len(images) == 0:
        raise DetectionError("letterbox_batch_gpu needs at least one image")
    flags = scale_up_flags(scale_up, len(images))
    torch = _import_torch()
    functional = torch.nn.functional
    dst_h, dst_w = new_shape
    device = images[0].device
    fill = pad_value / 255.0
    batch = torch.full((len(images), 3, dst_h, dst_w), fill, dtype=torch.float32, device=device)
    infos: list[LetterboxInfo] = []
    for index, (image, flag) in enumerate(zip(images, flags, strict=True)):
        _check_image(torch, index, image)
        source_shape = (int(image.shape[1]), int(image.shape[2]))
        (new_h, new_w), (top, left), info = letterbox_geometry(
            source_shape, new_shape, scale_up=flag
        )
        resized = image.unsqueeze(0).float()
        if (new_h, new_w) != tuple(image.shape[1:]):
            resized = functional.interpolate(
                resized,
                size=(new_h, new_w),
                mode="bilinear",
                align_corners=False,
                antialias=info.scale < 1,
            )
        # round to uint8 levels as the CPU path does, then scale to 0..1
        batch[index, :, top : top + new_h, left : left + new_w] = (
            resized[0].clamp(0, 255).round() / 255.0
        )
        infos.append(info)
    return batch, infos


def to_host(batch: DeviceTensor) -> npt.NDArray[np.float32]:
    """A contiguous float32 numpy copy of a device batch (for runtimes that take host arrays)."""
    return np.ascontiguousarray(batch.detach().cpu().numpy(), dtype=np.float32)
