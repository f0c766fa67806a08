"""Procedural class sprites (side views) with an alpha mask, drawn with OpenCV primitives.

Each class has a distinct silhouette: `person` (upright, narrow, head, torso, swinging legs),
`car` (low and wide, windows, two wheels), `truck` (tall cab and a long box trailer, several
wheels) and `forklift` (compact body, mast and forks). A sprite faces right; callers flip it.
Shapes are drawn at a supersampled size and reduced with area averaging, so small far objects
keep anti-aliased edges. Alpha below `ALPHA_CUTOFF` is zeroed and the sprite cropped to what is
left: the tight bounds of the array are exactly the pixels that get drawn.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

logger = logging.getLogger(__name__)

CLASS_NAMES: tuple[str, ...] = ("person", "car", "truck", "forklift")
PERSON, CAR, TRUCK, FORKLIFT = range(4)

# Alpha under this is dropped, so every drawn pixel lies inside the ground-truth box.
ALPHA_CUTOFF = 0.1
# A pixel at least this opaque belongs to the object when counting visibility and occlusion.
ALPHA_SOLID = 0.5
SUPERSAMPLE_SMALL = 4  # for sprites under SUPERSAMPLE_LIMIT_PX tall
SUPERSAMPLE_LARGE = 2
SUPERSAMPLE_LIMIT_PX = 48
MIN_SPRITE_SIDE_PX = 2

FloatImage = npt.NDArray[np.float32]
ByteImage = npt.NDArray[np.uint8]
BGR = tuple[int, int, int]


@dataclass(frozen=True)
class SpriteStyle:
    """Per-instance look: size in metres and colours (BGR)."""

    class_id: int
    height_m: float
    length_m: float
    primary: BGR
    secondary: BGR
    tertiary: BGR


@dataclass(frozen=True, eq=False)
class Sprite:
    """A rendered object: premultiplied colour, alpha, solid mask and the foot point inside it.

    `premul` is colour x alpha (float32, `(h, w, 3)`), `one_minus_alpha` is `(h, w, 1)`, `drawn`
    marks the pixels it changes (alpha > 0), `solid` those with alpha >= `ALPHA_SOLID` and
    `solid_count` counts them. `anchor_xy` is the bottom-centre of the tight bounds (where the
    object stands), in sprite pixels.
    """

    premul: FloatImage
    one_minus_alpha: FloatImage
    drawn: npt.NDArray[np.bool_]
    solid: npt.NDArray[np.bool_]
    solid_count: int
    anchor_xy: tuple[float, float]

    @property
    def height(self) -> int:
        """Rows of the sprite."""
        return int(self.premul.shape[0])

    @property
    def width(self) -> int:
        """Columns of the sprite."""
        return int(self.premul.shape[1])


_SIZES_M: dict[int, tuple[tuple[float, float], tuple[float, float]]] = {
    # class: ((min height, max height), (min length, max length)) in metres
    PERSON: ((1.55, 1.95), (0.45, 0.6)),
    CAR: ((1.35, 1.65), (3.9, 4.9)),
    TRUCK: ((3.3, 4.0), (7.0, 9.0)),
    FORKLIFT: ((2.0, 2.4), (2.3, 2.8)),
}
_CAR_COLOURS: tuple[BGR, ...] = (
    (40, 40, 200), (200, 80, 30), (220, 220, 220), (30, 30, 30), (60, 140, 60),
    (150, 150, 150), (20, 60, 120), (180, 40, 140),
)  # fmt: skip
_FORKLIFT_COLOURS: tuple[BGR, ...] = ((0, 200, 250), (0, 140, 255), (30, 30, 200), (40, 160, 40))
_SKIN: tuple[BGR, ...] = ((140, 170, 220), (100, 130, 180), (60, 80, 120), (170, 200, 235))


def _colour(rng: np.random.Generator, palette: tuple[BGR, ...], jitter: int = 25) -> BGR:
    base = palette[int(rng.integers(len(palette)))]
    shift = rng.integers(-jitter, jitter + 1, size=3)
    b, g, r = (int(np.clip(c + s, 0, 255)) for c, s in zip(base, shift, strict=True))
    return (b, g, r)


def _random_bgr(rng: np.random.Generator) -> BGR:
    b, g, r = (int(c) for c in rng.integers(20, 236, size=3))
    return (b, g, r)


def random_style(class_id: int, rng: np.random.Generator) -> SpriteStyle:
    """A random look for one instance of `class_id` (sizes within the class's usual range)."""
    if class_id not in _SIZES_M:
        raise ValueError(f"class_id must be in 0..{len(CLASS_NAMES) - 1}, got {class_id}")
    (h_lo, h_hi), (l_lo, l_hi) = _SIZES_M[class_id]
    height_m = float(rng.uniform(h_lo, h_hi))
    length_m = float(rng.uniform(l_lo, l_hi))
    if class_id == PERSON:
        return SpriteStyle(
            class_id, height_m, length_m, _random_bgr(rng), _random_bgr(rng), _colour(rng, _SKIN)
        )
    if class_id == CAR:
        return SpriteStyle(
            class_id, height_m, length_m, _colour(rng, _CAR_COLOURS), (90, 70, 60), (30, 30, 30)
        )
    if class_id == TRUCK:
        return SpriteStyle(
            class_id, height_m, length_m, _colour(rng, _CAR_COLOURS), _random_bgr(rng), (25, 25, 25)
        )
    return SpriteStyle(
        class_id, height_m, length_m, _colour(rng, _FORKLIFT_COLOURS), (50, 50, 50), (20, 20, 20)
    )


def aspect_ratio(style: SpriteStyle) -> float:
    """Width / height of the drawing canvas of `style` (people get room to swing their legs)."""
    if style.class_id == PERSON:
        return 0.42
    return style.length_m / style.height_m


def _pt(canvas_w: int, canvas_h: int, x: float, y: float) -> tuple[int, int]:
    return (round(x * (canvas_w - 1)), round(y * (canvas_h - 1)))


def _scaler(mask: ByteImage) -> Callable[[float, float], tuple[int, int]]:
    """Maps canvas fractions `(x, y)` to pixel points on `mask`'s canvas."""
    h, w = mask.shape

    def point(x: float, y: float) -> tuple[int, int]:
        return _pt(w, h, x, y)

    return point


def _draw_person(colour: ByteImage, mask: ByteImage, style: SpriteStyle, phase: float) -> None:
    h, w = mask.shape
    swing = math.sin(phase) * 0.45  # radians: legs and arms swing in opposite directions
    thick_leg = max(1, round(w * 0.24))
    thick_arm = max(1, round(w * 0.13))
    hip = (0.5 * w, 0.53 * h)
    shoulder = (0.5 * w, 0.22 * h)
    leg_len, arm_len = 0.46 * h, 0.32 * h
    layers: list[tuple[BGR, int]] = [(style.secondary, thick_leg), (style.primary, thick_arm)]
    for sign in (1.0, -1.0):
        for origin, length, (paint, thick), angle in (
            (hip, leg_len, layers[0], sign * swing),
            (shoulder, arm_len, layers[1], -sign * swing * 0.8),
        ):
            end = (origin[0] + length * math.sin(angle), origin[1] + length * math.cos(angle))
            p0 = (round(origin[0]), round(origin[1]))
            p1 = (round(end[0]), min(h - 1 - thick // 2, round(end[1])))
            for img, c in ((colour, paint), (mask, (255, 255, 255))):
                cv2.line(img, p0, p1, c, thick, cv2.LINE_AA)
    torso = np.array(
        [_pt(w, h, 0.24, 0.19), _pt(w, h, 0.76, 0.19), _pt(w, h, 0.7, 0.56), _pt(w, h, 0.3, 0.56)],
        dtype=np.int32,
    )
    head_c, head_r = _pt(w, h, 0.5, 0.095), max(1, round(0.085 * h))
    for img, shirt, skin in (
        (colour, style.primary, style.tertiary),
        (mask, (255,) * 3, (255,) * 3),
    ):
        cv2.fillConvexPoly(img, torso, shirt, cv2.LINE_AA)
        cv2.circle(img, head_c, head_r, skin, -1, cv2.LINE_AA)


def _wheel(colour: ByteImage, mask: ByteImage, centre: tuple[int, int], radius: int) -> None:
    cv2.circle(colour, centre, radius, (20, 20, 20), -1, cv2.LINE_AA)
    cv2.circle(colour, centre, max(1, radius // 2), (150, 150, 150), -1, cv2.LINE_AA)
    cv2.circle(mask, centre, radius, (255, 255, 255), -1, cv2.LINE_AA)


def _poly(colour: ByteImage, mask: ByteImage, pts: list[tuple[int, int]], paint: BGR) -> None:
    array = np.array(pts, dtype=np.int32)
    cv2.fillPoly(colour, [array], paint, cv2.LINE_AA)
    cv2.fillPoly(mask, [array], (255, 255, 255), cv2.LINE_AA)


def _draw_car(colour: ByteImage, mask: ByteImage, style: SpriteStyle) -> None:
    h = mask.shape[0]
    p = _scaler(mask)
    _poly(colour, mask, [p(0.0, 0.5), p(1.0, 0.55), p(1.0, 0.85), p(0.0, 0.85)], style.primary)
    _poly(colour, mask, [p(0.2, 0.5), p(0.32, 0.06), p(0.7, 0.06), p(0.85, 0.52)], style.primary)
    cv2.fillPoly(colour, [np.array([p(0.26, 0.48), p(0.35, 0.14), p(0.5, 0.14), p(0.5, 0.48)])],
                 (200, 170, 140), cv2.LINE_AA)  # fmt: skip
    cv2.fillPoly(colour, [np.array([p(0.54, 0.48), p(0.54, 0.14), p(0.68, 0.14), p(0.79, 0.48)])],
                 (200, 170, 140), cv2.LINE_AA)  # fmt: skip
    cv2.rectangle(colour, p(0.94, 0.58), p(1.0, 0.66), (180, 240, 255), -1)
    radius = max(1, round(0.17 * h))
    for x in (0.2, 0.8):
        _wheel(colour, mask, p(x, 1.0 - 0.17), radius)


def _draw_truck(colour: ByteImage, mask: ByteImage, style: SpriteStyle) -> None:
    h = mask.shape[0]
    p = _scaler(mask)
    _poly(colour, mask, [p(0.0, 0.0), p(0.74, 0.0), p(0.74, 0.82), p(0.0, 0.82)], style.secondary)
    cv2.rectangle(colour, p(0.01, 0.03), p(0.73, 0.79), style.primary, max(1, round(0.02 * h)))
    _poly(colour, mask, [p(0.76, 0.2), p(0.93, 0.2), p(1.0, 0.45), p(1.0, 0.86), p(0.76, 0.86)],
          style.primary)  # fmt: skip
    cv2.fillPoly(colour, [np.array([p(0.84, 0.25), p(0.92, 0.25), p(0.97, 0.45), p(0.84, 0.45)])],
                 (200, 170, 140), cv2.LINE_AA)  # fmt: skip
    radius = max(1, round(0.1 * h))
    for x in (0.08, 0.18, 0.58, 0.68, 0.9):
        _wheel(colour, mask, p(x, 1.0 - 0.1), radius)


def _draw_forklift(colour: ByteImage, mask: ByteImage, style: SpriteStyle) -> None:
    h = mask.shape[0]
    p = _scaler(mask)
    _poly(colour, mask, [p(0.0, 0.45), p(0.62, 0.45), p(0.7, 0.85), p(0.0, 0.85)], style.primary)
    _poly(colour, mask, [p(0.0, 0.4), p(0.14, 0.4), p(0.14, 0.85), p(0.0, 0.85)], style.secondary)
    for x in (0.16, 0.58):  # overhead guard posts
        _poly(colour, mask, [p(x, 0.08), p(x + 0.03, 0.08), p(x + 0.03, 0.46), p(x, 0.46)],
              style.secondary)  # fmt: skip
    _poly(colour, mask, [p(0.14, 0.06), p(0.64, 0.06), p(0.64, 0.1), p(0.14, 0.1)], style.secondary)
    _poly(colour, mask, [p(0.76, 0.0), p(0.84, 0.0), p(0.84, 0.97), p(0.76, 0.97)], (60, 60, 60))
    _poly(colour, mask, [p(0.84, 0.9), p(1.0, 0.9), p(1.0, 0.97), p(0.84, 0.97)], (90, 90, 90))
    _wheel(colour, mask, p(0.18, 0.86), max(1, round(0.14 * h)))
    _wheel(colour, mask, p(0.6, 0.88), max(1, round(0.12 * h)))


def _supersample(height_px: int) -> int:
    return SUPERSAMPLE_SMALL if height_px < SUPERSAMPLE_LIMIT_PX else SUPERSAMPLE_LARGE


def _line_kernel(length_px: int, angle_rad: float) -> FloatImage:
    size = length_px | 1
    kernel = np.zeros((size, size), np.float32)
    c = size // 2
    dx, dy = math.cos(angle_rad) * c, math.sin(angle_rad) * c
    cv2.line(kernel, (round(c - dx), round(c - dy)), (round(c + dx), round(c + dy)), 1.0, 1)
    total = float(kernel.sum())
    return kernel / total if total > 0 else kernel


def render_sprite(
    style: SpriteStyle,
    height_px: int,
    *,
    phase: float = 0.0,
    flip: bool = False,
    blur_px: int = 0,
    blur_angle_rad: float = 0.0,
) -> Sprite:
    """Draw `style` `height_px` tall; `phase` is the walking phase (radians, people only).

    `blur_px` > 1 smears the sprite (colour and alpha) along `blur_angle_rad` like motion blur.
    """
    height_px = max(MIN_SPRITE_SIDE_PX, int(height_px))
    width_px = max(MIN_SPRITE_SIDE_PX, round(height_px * aspect_ratio(style)))
    ss = _supersample(height_px)
    canvas_h, canvas_w = height_px * ss, width_px * ss
    colour = np.zeros((canvas_h, canvas_w, 3), np.uint8)
    mask = np.zeros((canvas_h, canvas_w), np.uint8)
    if style.class_id == PERSON:
        _draw_person(colour, mask, style, phase)
    elif style.class_id == CAR:
        _draw_car(colour, mask, style)
    elif style.class_id == TRUCK:
        _draw_truck(colour, mask, style)
    else:
        _draw_forklift(colour, mask, style)
    alpha = cv2.resize(mask, (width_px, height_px), interpolation=cv2.INTER_AREA)
    alpha = alpha.astype(np.float32) * np.float32(1.0 / 255.0)
    rgb = cv2.resize(colour, (width_px, height_px), interpolation=cv2.INTER_AREA)
    # Colour was drawn on black, so area averaging already gives colour x coverage.
    premul = rgb.astype(np.float32)
    if flip:
        alpha, premul = alpha[:, ::-1], premul[:, ::-1]
    if blur_px > 1:
        pad = blur_px // 2 + 1
        border = (pad, pad, pad, pad, cv2.BORDER_CONSTANT)
        alpha = np.asarray(cv2.copyMakeBorder(np.ascontiguousarray(alpha), *border), np.float32)
        premul = np.asarray(cv2.copyMakeBorder(np.ascontiguousarray(premul), *border), np.float32)
        kernel = _line_kernel(blur_px, blur_angle_rad)
        alpha = np.asarray(cv2.filter2D(alpha, -1, kernel), np.float32)
        premul = np.asarray(cv2.filter2D(premul, -1, kernel), np.float32)
    return _finish(np.asarray(premul, np.float32), np.asarray(alpha, np.float32))


def _finish(premul: FloatImage, alpha: FloatImage) -> Sprite:
    keep = alpha >= ALPHA_CUTOFF
    rows, cols = np.flatnonzero(keep.any(axis=1)), np.flatnonzero(keep.any(axis=0))
    if rows.size == 0:  # nothing left (degenerate size): one solid pixel keeps callers simple
        keep = np.ones((1, 1), bool)
        alpha = np.ones((1, 1), np.float32)
        premul = np.full((1, 1, 3), 128.0, np.float32)
        rows = cols = np.zeros(1, np.int64)
    r0, r1, c0, c1 = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
    alpha = np.where(keep, alpha, np.float32(0.0))[r0:r1, c0:c1]
    premul = np.where(keep[..., None], premul, np.float32(0.0))[r0:r1, c0:c1]
    solid = alpha >= ALPHA_SOLID
    if not solid.any():  # very thin sprites: the most opaque pixels count as the object
        solid = alpha >= alpha.max()
    h, w = alpha.shape
    return Sprite(
        premul=np.ascontiguousarray(premul, np.float32),
        one_minus_alpha=np.ascontiguousarray((1.0 - alpha)[..., None], np.float32),
        drawn=np.ascontiguousarray(alpha > 0),
        solid=np.ascontiguousarray(solid),
        solid_count=int(np.count_nonzero(solid)),
        anchor_xy=(w / 2.0, float(h)),
    )


class SpriteBank:
    """Sprites of one object instance, rendered once per size bucket, pose, side and blur.

    Heights snap to a geometric ladder (`height_bucket_ratio` apart) and the walking phase to
    `phase_steps` poses, so a track that walks, turns and changes depth reuses a few dozen
    renders instead of drawing every frame.
    """

    def __init__(
        self, style: SpriteStyle, *, height_bucket_ratio: float = 1.05, phase_steps: int = 8
    ) -> None:
        if height_bucket_ratio <= 1.0:
            raise ValueError(f"height_bucket_ratio must be > 1, got {height_bucket_ratio}")
        if phase_steps < 1:
            raise ValueError(f"phase_steps must be >= 1, got {phase_steps}")
        self.style = style
        self._log_ratio = math.log(height_bucket_ratio)
        self._phase_steps = phase_steps if style.class_id == PERSON else 1
        self._cache: dict[tuple[int, int, bool, int, int], Sprite] = {}

    def get(
        self, height_px: float, *, phase: float, flip: bool, blur_px: int, blur_angle_rad: float
    ) -> Sprite:
        """The sprite nearest to the requested size and pose (rendered on first use)."""
        bucket = round(math.log(max(height_px, MIN_SPRITE_SIDE_PX)) / self._log_ratio)
        step = round(phase / (2 * math.pi) * self._phase_steps) % self._phase_steps
        angle_step = round(blur_angle_rad / (math.pi / 12)) % 12 if blur_px > 1 else 0
        key = (bucket, step, flip, blur_px if blur_px > 1 else 0, angle_step)
        sprite = self._cache.get(key)
        if sprite is None:
            sprite = render_sprite(
                self.style,
                round(math.exp(bucket * self._log_ratio)),
                phase=2 * math.pi * step / self._phase_steps,
                flip=flip,
                blur_px=key[3],
                blur_angle_rad=angle_step * math.pi / 12,
            )
            self._cache[key] = sprite
        return sprite
