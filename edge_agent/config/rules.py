"""`rules:` of a camera — what turns tracks into alert events; one model per `kind`."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Final, Literal, get_args

from pydantic import Field

from configkit.base import StrictModel
from edge_agent.config.agent import NAME_PATTERN


class RuleBase(StrictModel):
    """Fields every rule has: name, which objects it looks at, and how often it may fire."""

    name: str = Field(
        pattern=NAME_PATTERN, description="Rule name, unique on its camera; part of the event id."
    )
    classes: list[str] = Field(
        default_factory=list,
        description=(
            "Class names the rule applies to (from `detector.class_names`, else the model's own "
            "names); empty: all."
        ),
    )
    min_confidence: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Ignore tracks whose confidence is lower."
    )
    cooldown_s: float = Field(
        default=5.0,
        ge=0.0,
        le=86_400.0,
        description="Least time between two events of the rule (per object; per zone: occupancy).",
    )


class CrossingRuleBase(RuleBase):
    """Fields of the rules that fire on one crossing (zone enter / exit, line cross)."""

    confirm_within_s: float = Field(
        default=1.0,
        ge=0.0,
        le=60.0,
        description=(
            "A crossing made while the track's best confidence is still under "
            "`min_confidence` fires, stamped at the crossing, if the track reaches it within "
            "this many seconds and is still where the crossing took it; 0: only on the "
            "crossing frame. A box slower than its camera sees fewer frames of each object, "
            "so its best score rises later (bench/results/slow_box_alerts.md)."
        ),
    )


class ZoneEnterRule(CrossingRuleBase):
    """An object enters a zone."""

    kind: Literal["zone_enter"] = "zone_enter"
    zone: str = Field(description="Name of a zone on this camera.")


class ZoneExitRule(CrossingRuleBase):
    """An object leaves a zone."""

    kind: Literal["zone_exit"] = "zone_exit"
    zone: str = Field(description="Name of a zone on this camera.")


class ZoneOccupancyRule(RuleBase):
    """The number of matching objects in a zone reaches a threshold (event lasts while it holds)."""

    kind: Literal["zone_occupancy"] = "zone_occupancy"
    zone: str = Field(description="Name of a zone on this camera.")
    min_objects: int = Field(
        ge=1, le=10_000, description="Fire when at least this many matching objects are inside."
    )


class LineCrossRule(CrossingRuleBase):
    """An object crosses a line."""

    kind: Literal["line_cross"] = "line_cross"
    line: str = Field(description="Name of a line on this camera.")
    direction: Literal["in", "out", "both"] = Field(
        default="both", description="Which crossings count, relative to the line's `in_side`."
    )


class LoiterRule(RuleBase):
    """An object stays in a zone longer than a dwell time."""

    kind: Literal["loiter"] = "loiter"
    zone: str = Field(description="Name of a zone on this camera.")
    dwell_s: float = Field(gt=0.0, le=86_400.0, description="Time inside the zone before firing.")


class CountLineRule(RuleBase):
    """Count the objects crossing a line, per direction, over fixed intervals of frame time.

    Crossings are those of `line_cross` (both directions), filtered by `classes` and
    `min_confidence`; `cooldown_s` holds back counting the same object again. Each interval
    `[k * interval_s, (k + 1) * interval_s)` in which a frame was seen sends one `update` event
    with its totals, on the first frame after it (or when the stream ends).
    """

    kind: Literal["count_line"] = "count_line"
    line: str = Field(description="Name of a line on this camera.")
    interval_s: float = Field(
        default=60.0,
        gt=0.0,
        le=86_400.0,
        description="Length of a counting interval (frame time); one event per interval.",
    )


RuleConfig = Annotated[
    ZoneEnterRule | ZoneExitRule | ZoneOccupancyRule | LineCrossRule | LoiterRule | CountLineRule,
    Field(discriminator="kind"),
]
"""Any rule, told apart by its `kind`."""

RULE_PLACES: Final[Mapping[str, Literal["zone", "line"]]] = MappingProxyType(
    {
        model.model_fields["kind"].default: "line" if "line" in model.model_fields else "zone"
        for model in get_args(get_args(RuleConfig)[0])
    }
)
"""The field (`zone` or `line`) naming the place each rule `kind` watches."""
