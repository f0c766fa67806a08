"""Letterbox geometry and the round trip of boxes between source and model input."""

from __future__ import annotations

import numpy as np
import pytest

from detection import DetectionError, letterbox, letterbox_batch
from detection.letterbox import PAD_VALUE, fitted_shape, letterbox_geometry, scale_up_flags


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


# scale_up=False: a smaller image stays at native scale (scale 1, centred); larger ones shrink.
NO_SCALE_UP_CASES = [
    # src (h, w), dst (h, w), scale, (pad_x, pad_y)
    ((64, 64), (640, 640), 1.0, (288, 288)),
    ((120, 200), (640, 640), 1.0, (220, 260)),
    ((63, 101), (640, 640), 1.0, (269, 288)),  # odd padding: one px more right / bottom
    ((320, 320), (640, 640), 1.0, (160, 160)),
    ((640, 640), (640, 640), 1.0, (0, 0)),
    ((50, 200), (64, 128), 0.64, (0, 16)),  # wider than the input: shrinks to fit
    ((720, 1280), (640, 640), 0.5, (0, 140)),  # larger than the input: still shrinks
    ((1000, 300), (640, 640), 0.64, (224, 0)),
]


@pytest.mark.parametrize(("src_hw", "dst_hw", "scale", "pad_xy"), NO_SCALE_UP_CASES)
def test_no_scale_up_keeps_small_images_at_native_scale(
    src_hw: tuple[int, int],
    dst_hw: tuple[int, int],
    scale: float,
    pad_xy: tuple[int, int],
) -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (*src_hw, 3), dtype=np.uint8)

    out, info = letterbox(image, dst_hw, scale_up=False)

    assert out.shape == (*dst_hw, 3)
    assert info.scale == pytest.approx(scale)
    assert (info.pad_x, info.pad_y) == pad_xy
    assert info.source_shape == src_hw
    assert letterbox_geometry(src_hw, dst_hw, scale_up=False)[2] == info
    if scale == 1.0:
        x, y = pad_xy
        h, w = src_hw
        np.testing.assert_array_equal(out[y : y + h, x : x + w], image)  # pixels untouched
        padding = np.ones(dst_hw, dtype=bool)
        padding[y : y + h, x : x + w] = False
        assert (out[padding] == PAD_VALUE).all()
        # whole-pixel boxes map back exactly, not merely approximately
        boxes = np.array([[0, 0, w, h], [w // 4, h // 3, w // 2, h - 1]], dtype=np.float32)
        np.testing.assert_array_equal(info.to_source(info.to_input(boxes)), boxes)
        np.testing.assert_array_equal(info.to_input(boxes)[0], [x, y, x + w, y + h])
    else:
        src = np.array([[10, 20, 40, 45]], dtype=np.float32)
        np.testing.assert_allclose(info.to_source(info.to_input(src)), src, atol=1e-3)


@pytest.mark.parametrize(("src_hw", "dst_hw", "_scale", "_pad_xy"), NO_SCALE_UP_CASES)
def test_no_scale_up_matches_the_default_for_images_that_shrink(
    src_hw: tuple[int, int], dst_hw: tuple[int, int], _scale: float, _pad_xy: tuple[int, int]
) -> None:
    image = np.full((*src_hw, 3), 77, dtype=np.uint8)
    default_out, default_info = letterbox(image, dst_hw)
    out, info = letterbox(image, dst_hw, scale_up=False)
    if default_info.scale <= 1:
        assert info == default_info
        np.testing.assert_array_equal(out, default_out)
    else:
        assert info.scale == 1.0 < default_info.scale


def test_batch_takes_one_scale_up_flag_per_image() -> None:
    small = np.full((16, 8, 3), 255, dtype=np.uint8)
    batch, infos = letterbox_batch([small, small, small], (32, 32), scale_up=[True, False, True])
    assert [i.scale for i in infos] == [2.0, 1.0, 2.0]
    assert [(i.pad_x, i.pad_y) for i in infos] == [(8, 0), (12, 8), (8, 0)]
    # the native-scale image covers only its own 16x8 pixels of the canvas
    assert (batch[1][:, 8:24, 12:20] == 1.0).all()
    assert np.isclose(batch[1][:, 7, :], PAD_VALUE / 255).all()
    assert np.isclose(batch[1][:, :, 11], PAD_VALUE / 255).all()
    np.testing.assert_array_equal(batch[0], batch[2])
    _, all_native = letterbox_batch([small, small], (32, 32), scale_up=False)
    assert [i.scale for i in all_native] == [1.0, 1.0]


def test_scale_up_flags_must_match_the_images() -> None:
    assert scale_up_flags(False, 3) == [False, False, False]
    assert scale_up_flags((True, False), 2) == [True, False]
    with pytest.raises(DetectionError, match="2 flags for 3 images"):
        letterbox_batch([np.zeros((4, 4, 3), np.uint8)] * 3, (32, 32), scale_up=[True, False])


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


@pytest.mark.parametrize(
    ("src_hw", "max_hw", "scale_up", "expected"),
    [
        ((360, 640), (320, 320), True, (192, 320)),  # 16:9: 180 rows of image, padded to 192
        ((1080, 1920), (320, 416), True, (256, 416)),
        ((480, 640), (384, 512), True, (384, 512)),  # 4:3 fills a 4:3 input: nothing to cut
        ((1080, 810), (320, 320), True, (320, 256)),  # portrait (bus.jpg)
        ((100, 150), (320, 320), False, (128, 160)),  # a crop at native scale
        ((100, 150), (320, 320), True, (224, 320)),
        ((320, 320), (320, 320), True, (320, 320)),
    ],
)
def test_fitted_shape_cuts_only_the_padding_beyond_the_stride(
    src_hw: tuple[int, int], max_hw: tuple[int, int], scale_up: bool, expected: tuple[int, int]
) -> None:
    fitted = fitted_shape(src_hw, max_hw, scale_up=scale_up)
    assert fitted == expected
    # the same scale as in the full input: boxes come out the same, only padding is gone
    _, _, full = letterbox_geometry(src_hw, max_hw, scale_up=scale_up)
    _, _, fit = letterbox_geometry(src_hw, fitted, scale_up=scale_up)
    assert fit.scale == pytest.approx(full.scale)
