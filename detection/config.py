"""`DetectorConfig`: the runtime to load and how its raw output becomes detections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from configkit.base import StrictModel
from detection.runtimes.config import RuntimeConfig

_STRIDE = 32  # YOLO's largest feature stride: input sides must be multiples of it


class DetectorConfig(StrictModel):
    """A detector: model runtime, thresholds, NMS and class names."""

    runtime: RuntimeConfig = Field(description="Model backend and its file (`type` selects it).")
    confidence_threshold: float = Field(
        default=0.25, ge=0.0, le=1.0, description="Lowest class confidence kept (0..1)."
    )
    iou_threshold: float = Field(
        default=0.45, ge=0.0, le=1.0, description="NMS suppresses boxes overlapping above this IoU."
    )
    max_detections: int = Field(
        default=300, ge=1, le=10_000, description="Most detections kept per image after NMS."
    )
    max_nms_candidates: int = Field(
        default=30_000,
        ge=1,
        le=1_000_000,
        description="Most boxes (highest confidence first) that enter NMS per image.",
    )
    class_agnostic_nms: bool = Field(
        default=False, description="Suppress overlapping boxes across classes, not only within one."
    )
    class_names: list[str] = Field(
        default_factory=list,
        max_length=10_000,
        description="Name of each class id; empty: ids are named by their number.",
    )
    input_size: tuple[int, int] | None = Field(
        default=None,
        description=(
            "Model input (height, width) in pixels, multiples of 32; required when the model's "
            "spatial size is dynamic, must match it when fixed."
        ),
    )
    box_units: Literal["auto", "pixels", "normalized"] = Field(
        default="auto",
        description="Units of the model's box output; `auto` tells them apart from the values.",
    )

    @field_validator("input_size")
    @classmethod
    def _check_input_size(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is None:
            return None
        for side in value:
            if not _STRIDE <= side <= 4096 or side % _STRIDE:
                raise ValueError(
                    f"input_size sides must be multiples of {_STRIDE} in {_STRIDE}..4096, "
                    f"got {value}"
                )
        return value

    def class_name(self, class_id: int) -> str:
        """The configured name of `class_id`, or its number where none is configured."""
        if 0 <= class_id < len(self.class_names):
            return self.class_names[class_id]
        return str(class_id)
