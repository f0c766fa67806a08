"""Optical flow of box contents between two frames (`edge_agent.tracking.flow`)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edge_agent.tracking.flow import box_shifts, to_gray


def _textured(height: int = 240, width: int = 320, seed: int = 0) -> np.ndarray:
    """A smooth random texture (LK needs gradients, not single-pixel noise)."""
    noise = np.random.default_rng(seed).integers(0, 256, (height, width), dtype=np.uint8)
    return np.asarray(cv2.GaussianBlur(noise, (5, 5), 1.5), dtype=np.uint8)


def _shifted(image: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """`image` with its content moved by (dx, dy) (what moved out comes back on the other side)."""
    return np.roll(np.roll(image, dy, axis=0), dx, axis=1)


def test_a_box_moves_with_its_content() -> None:
    before = _textured()
    after = _shifted(before, 3, -2)
    (shift,) = box_shifts(before, after, [(100.0, 80.0, 160.0, 140.0)])
    assert shift is not None
    assert shift == pytest.approx((3.0, -2.0), abs=0.3)


def test_boxes_follow_their_own_content() -> None:
    before = _textured(seed=1)
    after = before.copy()
    after[40:120, 40:120] = _shifted(before, 4, 0)[40:120, 40:120]  # only the left patch moves
    moving, still = box_shifts(before, after, [(60.0, 60.0, 100.0, 100.0), (200, 100, 260, 160)])
    assert moving == pytest.approx((4.0, 0.0), abs=0.3)
    assert still == pytest.approx((0.0, 0.0), abs=0.3)


def test_a_small_box_is_followed_too() -> None:
    before = _textured(seed=2)
    after = _shifted(before, 2, 1)
    (shift,) = box_shifts(before, after, [(150.0, 100.0, 156.0, 114.0)])  # a 6x14 px person
    assert shift == pytest.approx((2.0, 1.0), abs=0.5)


def test_without_texture_inside_the_frame_or_a_finite_box_there_is_no_shift() -> None:
    flat = np.full((120, 160), 90, dtype=np.uint8)
    assert box_shifts(flat, flat, [(10.0, 10.0, 50.0, 50.0)]) == [None]
    textured = _textured(120, 160)
    assert box_shifts(textured, textured, [(200.0, 200.0, 260.0, 260.0)]) == [None]  # outside
    assert box_shifts(textured, textured, [(10.0, 10.0, float("nan"), 50.0)]) == [None]


def test_frames_of_different_sizes_or_no_boxes_give_nothing() -> None:
    a, b = _textured(120, 160), _textured(240, 320)
    assert box_shifts(a, b, [(10.0, 10.0, 50.0, 50.0)]) == [None]
    assert box_shifts(a, a, []) == []


def test_frames_become_one_grey_channel() -> None:
    colour = np.zeros((4, 6, 3), dtype=np.uint8)
    colour[..., 2] = 255  # red in BGR
    grey = to_gray(colour)
    assert grey.shape == (4, 6) and grey.dtype == np.uint8 and int(grey[0, 0]) == 76
    assert to_gray(grey) is grey
