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
