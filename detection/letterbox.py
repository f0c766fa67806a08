"""Letterbox resize (keep aspect ratio, pad) and the inverse mapping of boxes to the source."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

from detection.errors import DetectionError

PAD_VALUE = 114  # YOLOv5's grey: the padding the models were trained with


@dataclass(frozen=True)
class LetterboxInfo:
    """How a source frame was placed into the model input: `dst = src * scale + pad`."""

    scale: float
    pad_x: float
    pad_y: float
    source_shape: tuple[int, int]  # (h, w) of the source frame

    def to_source(self, xyxy: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Map boxes from model-input pixels back to source-frame pixels, clipped to the frame."""
        boxes = np.asarray(xyxy, dtype=np.float32).reshape(-1, 4).copy()
        boxes[:, [0, 2]] = (boxes[:, [0, 2]] - self.pad_x) / self.scale
        boxes[:, [1, 3]] = (boxes[:, [1, 3]] - self.pad_y) / self.scale
        h, w = self.source_shape
        boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, w)
        boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, h)
        return boxes

    def to_input(self, xyxy: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Map boxes from source-frame pixels into model-input pixels."""
        boxes = np.asarray(xyxy, dtype=np.float32).reshape(-1, 4).copy()
        boxes[:, [0, 2]] = boxes[:, [0, 2]] * self.scale + self.pad_x
        boxes[:, [1, 3]] = boxes[:, [1, 3]] * self.scale + self.pad_y
        return boxes


def _check_image(image: npt.NDArray[np.uint8]) -> None:
    if not isinstance(image, np.ndarray):
        raise DetectionError(f"image must be a numpy array, got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise DetectionError(f"image must be uint8, got {image.dtype}")
    if image.ndim != 3 or image.shape[2] != 3:
        raise DetectionError(f"image must have shape (H, W, 3), got {image.shape}")
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise DetectionError(f"image must not be empty, got {image.shape}")


def letterbox_geometry(
    source_shape: tuple[int, int], new_shape: tuple[int, int], *, scale_up: bool = True
) -> tuple[tuple[int, int], tuple[int, int], LetterboxInfo]:
    """((new_h, new_w), (top, left), info) placing a `source_shape` (h, w) image into `new_shape`.

    The image is fitted keeping its aspect ratio and centred; the rest is padding. With
    `scale_up=False` an image smaller than `new_shape` keeps its native size (scale 1, as
    ultralytics' `scaleup=False`); larger images still shrink to fit.
    """
    src_h, src_w = source_shape
    dst_h, dst_w = new_shape
    if dst_h <= 0 or dst_w <= 0:
        raise DetectionError(f"new_shape must be positive (h, w), got {new_shape}")
    if src_h <= 0 or src_w <= 0:
        raise DetectionError(f"source_shape must be positive (h, w), got {source_shape}")
    scale = min(dst_h / src_h, dst_w / src_w)
    if not scale_up:
        scale = min(scale, 1.0)
    new_w, new_h = round(src_w * scale), round(src_h * scale)
    pad_x, pad_y = (dst_w - new_w) / 2, (dst_h - new_h) / 2
    top, left = round(pad_y - 0.1), round(pad_x - 0.1)
    return (new_h, new_w), (top, left), LetterboxInfo(scale, left, top, (src_h, src_w))


def fitted_shape(
    source_shape: tuple[int, int],
    max_shape: tuple[int, int],
    *,
    scale_up: bool = True,
    stride: int = 32,
) -> tuple[int, int]:
    """The smallest stride-aligned (h, w) within `max_shape` that holds a `source_shape` frame
    letterboxed into `max_shape`: the same scale, only the padding beyond the next multiple of
    `stride` is cut (ultralytics' rectangular letterbox). A 640x360 frame in 320x320 gives
    192x320, in 320x416 gives 256x416; a 4:3 frame in 384x512 fills it."""
    (new_h, new_w), _, _ = letterbox_geometry(source_shape, max_shape, scale_up=scale_up)
    max_h, max_w = max_shape
    return (
        min(max_h, -(-new_h // stride) * stride),
        min(max_w, -(-new_w // stride) * stride),
    )


def scale_up_flags(scale_up: bool | Sequence[bool], count: int) -> list[bool]:
    """One `scale_up` flag per image: a single bool for all, or a sequence of `count` flags."""
    if isinstance(scale_up, bool):
        return [scale_up] * count
    flags = [bool(flag) for flag in scale_up]
    if len(flags) != count:
        raise DetectionError(f"scale_up has {len(flags)} flags for {count} images")
    return flags


def letterbox(
    image: npt.NDArray[np.uint8],
    new_shape: tuple[int, int],
    color: int = PAD_VALUE,
    *,
    scale_up: bool = True,
) -> tuple[npt.NDArray[np.uint8], LetterboxInfo]:
    """Resize `image` to fit `new_shape` (h, w) keeping its aspect ratio; pad the rest evenly.

    `scale_up=False` never enlarges: a smaller image is centred at its native size.
    """
    _check_image(image)
    src_h, src_w = image.shape[:2]
    (new_h, new_w), (top, left), info = letterbox_geometry(
        (src_h, src_w), new_shape, scale_up=scale_up
    )
    if (new_w, new_h) != (src_w, src_h):
        interpolation = cv2.INTER_AREA if info.scale < 1 else cv2.INTER_LINEAR
        image = np.asarray(
            cv2.resize(image, (new_w, new_h), interpolation=interpolation), dtype=np.uint8
        )
    dst_h, dst_w = new_shape
    bottom, right = dst_h - new_h - top, dst_w - new_w - left
    out = cv2.copyMakeBorder(
        image, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(color, color, color)
    )
    return np.asarray(out, dtype=np.uint8), info


def letterbox_batch(
    images: Sequence[npt.NDArray[np.uint8]],
    new_shape: tuple[int, int],
    *,
    scale_up: bool | Sequence[bool] = True,
) -> tuple[npt.NDArray[np.float32], list[LetterboxInfo]]:
    """Letterbox BGR frames into one float32 RGB batch `(B, 3, h, w)` scaled to 0..1.

    `scale_up` is one flag for all images or one per image (False: never enlarge that image,
    e.g. a crop that must stay at native scale); each image's `LetterboxInfo` maps its boxes back.
    """
    if len(images) == 0:
        raise DetectionError("letterbox_batch needs at least one image")
    flags = scale_up_flags(scale_up, len(images))
    batch = np.empty((len(images), 3, *new_shape), dtype=np.float32)
    infos: list[LetterboxInfo] = []
    for i, (image, flag) in enumerate(zip(images, flags, strict=True)):
        boxed, info = letterbox(image, new_shape, scale_up=flag)
        # BGR HWC uint8 -> RGB CHW float 0..1
        batch[i] = boxed[:, :, ::-1].transpose(2, 0, 1) * np.float32(1 / 255)
        infos.append(info)
    return batch, infos
