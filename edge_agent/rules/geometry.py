"""Pure, vectorised plane geometry for rules, in image coordinates (x right, y down).

Conventions match the scene generator's `testbed.scenes.events`: point-in-polygon is the
even-odd rule (a point exactly on an edge may fall either way); the side of a point relative to a
directed line `a -> b` is the cross product `(b - a) x (p - a)`, which is negative on the left as
seen looking from `a` to `b` in an image (y down) and positive on the right.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

PointArray = npt.NDArray[np.float64]
"""Points as an `(n, 2)` float64 array of `(x, y)`."""
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
Point = tuple[float, float]


def as_points(points: npt.ArrayLike) -> PointArray:
    """`points` as an `(n, 2)` float64 array (a single point becomes one row)."""
    array = np.asarray(points, dtype=np.float64)
    if array.ndim == 1:
        array = array.reshape(1, -1)
    if array.ndim != 2 or array.shape[1] != 2:
        raise ValueError(f"points must have shape (n, 2), got {array.shape}")
    return array


def bottom_centres(xyxy: npt.ArrayLike) -> PointArray:
    """Anchor point of each `(x1, y1, x2, y2)` box: the middle of its bottom edge."""
    boxes = np.asarray(xyxy, dtype=np.float64).reshape(-1, 4)
    return np.column_stack(((boxes[:, 0] + boxes[:, 2]) / 2.0, boxes[:, 3]))


def points_in_polygon(points: npt.ArrayLike, polygon: Sequence[Point] | PointArray) -> BoolArray:
    """Whether each point lies inside `polygon` (even-odd rule), shape `(n,)`."""
    p = as_points(points)
    poly = as_points(polygon)
    if poly.shape[0] < 3:
        raise ValueError(f"a polygon needs at least 3 points, got {poly.shape[0]}")
    x, y = p[:, 0:1], p[:, 1:2]  # (n, 1)
    x0, y0 = poly[:, 0][None, :], poly[:, 1][None, :]  # (1, m)
    x1, y1 = np.roll(x0, -1, axis=1), np.roll(y0, -1, axis=1)
    straddles = (y0 > y) != (y1 > y)
    dy = np.where(y1 == y0, 1.0, y1 - y0)  # horizontal edges never straddle; avoid 0-division
    x_at_y = x0 + (y - y0) * (x1 - x0) / dy
    hits = straddles & (x < x_at_y)
    inside: BoolArray = (np.count_nonzero(hits, axis=1) % 2) == 1
    return inside


def side_of_line(points: npt.ArrayLike, a: Point, b: Point) -> FloatArray:
    """Cross product `(b - a) x (p - a)` per point: < 0 left, > 0 right, 0 on the line."""
    p = as_points(points)
    side: FloatArray = (b[0] - a[0]) * (p[:, 1] - a[1]) - (b[1] - a[1]) * (p[:, 0] - a[0])
    return side


def segments_intersect(starts: npt.ArrayLike, ends: npt.ArrayLike, a: Point, b: Point) -> BoolArray:
    """Whether each segment `starts[i] -> ends[i]` meets segment `a -> b` (touching counts)."""
    p, q = as_points(starts), as_points(ends)
    if p.shape != q.shape:
        raise ValueError(f"starts and ends differ in shape: {p.shape} vs {q.shape}")
    d1, d2 = side_of_line(p, a, b), side_of_line(q, a, b)
    # Side of a and of b relative to each path p -> q.
    d3 = (q[:, 0] - p[:, 0]) * (a[1] - p[:, 1]) - (q[:, 1] - p[:, 1]) * (a[0] - p[:, 0])
    d4 = (q[:, 0] - p[:, 0]) * (b[1] - p[:, 1]) - (q[:, 1] - p[:, 1]) * (b[0] - p[:, 0])
    meets: BoolArray = (d1 * d2 <= 0) & (d3 * d4 <= 0)
    return meets


def crossing_direction(
    before: Point, after: Point, a: Point, b: Point, in_side: Literal["left", "right"]
) -> Literal["in", "out"] | None:
    """`"in"`/`"out"` when the path `before -> after` crosses segment `a -> b`, else `None`.

    A crossing needs both points strictly on opposite sides of the line and the path to meet the
    segment (not just the infinite line). `in_side` (`"left"`/`"right"`) is the inside.
    """
    sides = side_of_line([before, after], a, b)
    s0, s1 = float(sides[0]), float(sides[1])
    if s0 == 0.0 or s1 == 0.0 or (s0 > 0.0) == (s1 > 0.0):
        return None
    if not bool(segments_intersect([before], [after], a, b)[0]):
        return None
    now_left = s1 < 0.0
    return "in" if now_left == (in_side == "left") else "out"


def pixel_points(
    points: Sequence[Sequence[float]], units: str, frame_size: tuple[int, int]
) -> list[Point]:
    """`points` in pixels of a `frame_size` (width, height) frame; `units` is `pixel` or
    `normalized` (0..1 of the width and height). Rules and drawings place zones alike."""
    if units == "pixel":
        return [(float(x), float(y)) for x, y in points]
    width, height = frame_size
    return [(float(x) * width, float(y) * height) for x, y in points]
