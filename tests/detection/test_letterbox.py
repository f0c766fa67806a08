"""Letterbox geometry and the round trip of boxes between source and model input."""

from __future__ import annotations

import numpy as np
import pytest

from detection import DetectionError, letterbox, letterbox_batch
from detection.letterbox import PAD_VALUE


@pytest.mark.parametrize(
    ("src_hw", "dst_hw", "scale", "pad_xy"),
    [
        ((720, 1280), (640, 640), 0.5, (0, 140)),
        ((1280, 720), (640, 640), 0.5, (140, 0)),
        ((100, 100), (640, 640), 6.4, (0, 0)),
        ((272, 640), (320, 320), 0.5, (0, 92)),
        ((480, 640), (384, 640), 0.8, (64, 0)),
    ],
)
def test_scale_and_padding(
    src_hw: tuple[int, int],
    dst_hw: tuple[int, int],
    scale: float,
    pad_xy: tuple[int, int],
) -> None:
    image = np.full((*src_hw, 3), 200, dtype=np.uint8)
    out, info = letterbox(image, dst_hw)
    assert out.shape == (*dst_hw, 3)
    assert info.scale == pytest.approx(scale)
    assert (info.pad_x, info.pad_y) == pytest.approx(pad_xy)
    if pad_xy[1]:
        assert (out[0] == PAD_VALUE).all() and (out[-1] == PAD_VALUE).all()
        assert (out[dst_hw[0] // 2] == 200).all()


def test_boxes_round_trip_and_clip_to_source() -> None:
    image = np.zeros((720, 1280, 3), dtype=np.uint8)
    _, info = letterbox(image, (640, 640))
    src = np.array([[100, 50, 300, 400], [0, 0, 1280, 720]], dtype=np.float32)
    np.testing.assert_allclose(info.to_source(info.to_input(src)), src, atol=1e-3)
    # a box reaching into the padding is clipped to the frame
    clipped = info.to_source(np.array([[-10, 0, 700, 700]], dtype=np.float32))
    assert clipped.tolist() == [[0, 0, 1280, 720]]


def test_image_content_lands_where_the_mapping_says() -> None:
    image = np.zeros((200, 400, 3), dtype=np.uint8)
    image[50:100, 100:200] = 255  # a white block
    out, info = letterbox(image, (320, 320))
    x1, y1, x2, y2 = info.to_input(np.array([[100, 50, 200, 100]], np.float32))[0]
    inside = out[int(y1) + 2 : int(y2) - 2, int(x1) + 2 : int(x2) - 2]
    assert inside.min() == 255


def test_batch_is_rgb_chw_in_unit_range() -> None:
    bgr = np.zeros((10, 20, 3), dtype=np.uint8)
    bgr[..., 0] = 255  # blue channel in BGR
    batch, infos = letterbox_batch([bgr, bgr], (32, 32))
    assert batch.shape == (2, 3, 32, 32) and batch.dtype == np.float32
    assert batch[0, 2, 16, 16] == 1.0 and batch[0, 0, 16, 16] == 0.0  # blue is channel 2 in RGB
    assert len(infos) == 2


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (np.zeros((10, 10, 3), dtype=np.float32), "must be uint8"),
        (np.zeros((10, 10), dtype=np.uint8), r"shape \(H, W, 3\)"),
        (np.zeros((10, 10, 4), dtype=np.uint8), r"shape \(H, W, 3\)"),
        (np.zeros((0, 10, 3), dtype=np.uint8), "must not be empty"),
    ],
)
def test_bad_images_are_rejected(image: np.ndarray, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(DetectionError, match=message):
        letterbox(image, (32, 32))


def test_empty_batch_is_rejected() -> None:
    with pytest.raises(DetectionError, match="at least one image"):
        letterbox_batch([], (32, 32))
