"""Image steps of media: checks, crops with a margin, scaling for clips, JPEG encoding."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import numpy.typing as npt

__all__ = ["MediaError", "crop_box", "encode_jpeg", "fit_width", "is_image"]

Image = npt.NDArray[np.uint8]


class MediaError(RuntimeError):
    """A picture or clip that cannot be made (bad frame, encoder failure)."""


def is_image(image: object) -> bool:
    """Whether `image` is a non-empty BGR uint8 array (height, width, 3)."""
    return (
        isinstance(image, np.ndarray)
        and image.dtype == np.uint8
        and image.ndim == 3
        and image.shape[2] == 3
        and image.shape[0] > 0
        and image.shape[1] > 0
    )


def encode_jpeg(image: Image, quality: int) -> bytes:
    """`image` (BGR) as JPEG bytes at `quality` (0..100)."""
    if not is_image(image):
        shape = getattr(image, "shape", None)
        raise MediaError(
            f"expected a BGR uint8 image (h, w, 3), got {type(image).__name__} {shape}"
        )
    ok, buffer = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise MediaError(f"JPEG encoder failed on a {image.shape} image")
    return bytes(buffer)


def crop_box(image: Image, box: Sequence[float], margin: float) -> Image | None:
    """The part of `image` inside `box` (x1, y1, x2, y2 px) grown by `margin` (a fraction of
    the box's width and height) on each side, clipped to the image; None when nothing is left.
    A view, not a copy."""
    height, width = image.shape[:2]
    x1, y1, x2, y2 = (float(v) for v in box)
    if not all(np.isfinite((x1, y1, x2, y2))):
        return None
    grow_x, grow_y = (x2 - x1) * margin, (y2 - y1) * margin
    left, top = max(0, int(np.floor(x1 - grow_x))), max(0, int(np.floor(y1 - grow_y)))
    right = min(width, int(np.ceil(x2 + grow_x)))
    bottom = min(height, int(np.ceil(y2 + grow_y)))
    if right <= left or bottom <= top:
        return None
    return image[top:bottom, left:right]


def fit_width(image: Image, max_width: int) -> Image:
    """`image` scaled down to at most `max_width` wide, with even width and height (video
    encoders sample colour per 2x2 pixels); `image` itself when it already fits."""
    height, width = image.shape[:2]
    scale = min(1.0, max_width / width)
    target_w = max(2, int(width * scale) // 2 * 2)
    target_h = max(2, int(round(height * scale)) // 2 * 2)
    if (target_w, target_h) == (width, height):
        return image
    if scale == 1.0:  # only an odd size: drop the last row / column
        return image[:target_h, :target_w]
    return np.asarray(
        cv2.resize(image, (target_w, target_h), interpolation=cv2.INTER_AREA), dtype=np.uint8
    )
