"""Zones (polygons) and lines (segments) drawn on a camera's image."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from configkit.base import StrictModel
from edge_agent.config.agent import NAME_PATTERN

Point = tuple[float, float]
Units = Literal["pixel", "normalized"]


def _check_units(points: list[Point] | tuple[Point, ...], units: Units) -> None:
    for x, y in points:
        if units == "normalized" and not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
            raise ValueError(f"normalized point ({x}, {y}) is outside [0, 1]")
        if units == "pixel" and (x < 0.0 or y < 0.0):
            raise ValueError(f"pixel point ({x}, {y}) is negative")


def _orientation(a: Point, b: Point, c: Point) -> float:
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])


def _on_segment(a: Point, b: Point, p: Point) -> bool:
    return min(a[0], b[0]) <= p[0] <= max(a[0], b[0]) and min(a[1], b[1]) <= p[1] <= max(a[1], b[1])


def _segments_touch(p1: Point, p2: Point, q1: Point, q2: Point) -> bool:
    """Whether closed segments p1-p2 and q1-q2 share a point (crossing or touching)."""
    d1, d2 = _orientation(q1, q2, p1), _orientation(q1, q2, p2)
    d3, d4 = _orientation(p1, p2, q1), _orientation(p1, p2, q2)
    if ((d1 > 0) != (d2 > 0)) and d1 != 0 and d2 != 0 and ((d3 > 0) != (d4 > 0)) and d3 and d4:
        return True
    return any(
        d == 0 and _on_segment(a, b, p)
        for d, a, b, p in ((d1, q1, q2, p1), (d2, q1, q2, p2), (d3, p1, p2, q1), (d4, p1, p2, q2))
    )


def first_self_intersection(points: list[Point] | tuple[Point, ...]) -> tuple[int, int] | None:
    """Indices `(i, j)` of the first two non-adjacent edges of a closed polygon that meet."""
    n = len(points)
    edges = [(points[i], points[(i + 1) % n]) for i in range(n)]
    for i in range(n):
        for j in range(i + 2, n):
            if i == 0 and j == n - 1:
                continue  # adjacent through the closing edge
            if _segments_touch(*edges[i], *edges[j]):
                return i, j
    return None


def _edge_text(points: list[Point] | tuple[Point, ...], i: int) -> str:
    (x0, y0), (x1, y1) = points[i], points[(i + 1) % len(points)]
    return f"[{x0:g}, {y0:g}] -> [{x1:g}, {y1:g}]"


class ZoneConfig(StrictModel):
    """A named polygon; an object is inside when its bottom-centre point is."""

    name: str = Field(pattern=NAME_PATTERN, description="Zone name, unique on its camera.")
    units: Units = Field(
        default="normalized",
        description="`normalized`: 0..1 of the image width/height; `pixel`: source pixels.",
    )
    points: list[Point] = Field(
        min_length=3, max_length=256, description="Polygon vertices `[x, y]` in order."
    )

    @model_validator(mode="after")
    def _check_polygon(self) -> Self:
        _check_units(self.points, self.units)
        crossing = first_self_intersection(self.points)
        if crossing is not None:
            i, j = crossing
            first, second = _edge_text(self.points, i), _edge_text(self.points, j)
            raise ValueError(
                f"zone {self.name!r} is self-intersecting: edge {i + 1} ({first}) crosses "
                f"edge {j + 1} ({second}); list the points in order around the polygon"
            )
        # Shoelace area: a zero-area polygon (collinear points) can never contain anything.
        area2 = sum(
            x0 * y1 - x1 * y0
            for (x0, y0), (x1, y1) in zip(
                self.points, self.points[1:] + self.points[:1], strict=True
            )
        )
        if area2 == 0.0:
            raise ValueError(f"zone {self.name!r} has zero area (points are collinear)")
        return self


class LineConfig(StrictModel):
    """A named counting line: a segment from its first point to its second."""

    name: str = Field(pattern=NAME_PATTERN, description="Line name, unique on its camera.")
    units: Units = Field(
        default="normalized",
        description="`normalized`: 0..1 of the image width/height; `pixel`: source pixels.",
    )
    points: tuple[Point, Point] = Field(description="The two end points `[[x1, y1], [x2, y2]]`.")
    in_side: Literal["left", "right"] = Field(
        default="left",
        description=(
            "Side that counts as inside, as seen in the image looking from the first point to the "
            "second; crossing toward it is direction `in`, away from it `out`."
        ),
    )

    @model_validator(mode="after")
    def _check_segment(self) -> Self:
        _check_units(self.points, self.units)
        if self.points[0] == self.points[1]:
            raise ValueError(f"line {self.name!r} has the same start and end point")
        return self
