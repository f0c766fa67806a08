"""`DetectorConfig`: the runtime to load and how its raw output becomes detections."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, field_validator, model_validator

from configkit.base import StrictModel
from configkit.yaml_loader import config_errors
from detection.class_groups import COCO_GROUPS
from detection.runtimes.config import RuntimeConfig

_STRIDE = 32  # YOLO's largest feature stride: input sides must be multiples of it


class DetectorConfig(StrictModel):
    """A detector: model runtime, thresholds, NMS, class names and the classes kept.

    Class names and box units may come from the model file's metadata instead (see
    `detection.model_metadata`): `class_names` empty and `box_units: auto` take the model's.
    """

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
    class_groups: list[list[str]] = Field(
        default_factory=lambda: [list(group) for group in COCO_GROUPS],
        max_length=1_000,
        description=(
            "Classes the model confuses on one object (a van called car and truck): after "
            "per-class NMS a box overlapping a more confident box of another class of its group "
            "above `class_group_iou` is dropped, and the edge tracker lets a track continue "
            "across the classes of one group only (a person is never continued by the bicycle "
            "under them). Names the model lacks are ignored; []: no groups."
        ),
    )
    class_group_iou: float = Field(
        default=0.8,
        ge=0.0,
        le=1.0,
        description="IoU above which two boxes of one class group are one object (see "
        "`class_groups`).",
    )
    class_names: list[str] = Field(
        default_factory=list,
        max_length=10_000,
        description=(
            "Name of each class id; empty: the model's own (its `class_names` metadata), else "
            "ids are named by their number. Must name as many classes as the model has."
        ),
    )
    classes: list[str] = Field(
        default_factory=list,
        max_length=10_000,
        description=(
            "Class names to keep (the others are dropped before NMS); empty: all. Names from "
            "`class_names`, or from the model's metadata where that is empty."
        ),
    )
    input_size: tuple[int, int] | None = Field(
        default=None,
        description=(
            "Model input (height, width) in pixels, multiples of 32; required when the model's "
            "spatial size is dynamic, must match it when fixed."
        ),
    )
    letterbox: Literal["fit", "fixed"] = Field(
        default="fit",
        description=(
            "Dynamic-shape models (or `shape_models`) only. `fit`: each frame goes in at the "
            "smallest multiple of 32 within input_size that holds it at input_size's scale (a "
            "16:9 frame in 320x320 runs at 192x320: fewer pixels, same boxes), frames of one "
            "shape batched together. `fixed`: always input_size (uniform batches, e.g. for a "
            "GPU engine)."
        ),
    )
    shape_models: list[RuntimeConfig] = Field(
        default_factory=list,
        max_length=8,
        description=(
            "Fixed-shape exports of the same network at other input shapes (e.g. the 320x192 "
            "INT8 model for 16:9 cameras): with `letterbox: fit`, a frame whose fitted shape is "
            "one of theirs runs on that model, the others on `runtime`; frames of one shape "
            "batch together."
        ),
    )
    box_units: Literal["auto", "pixels", "normalized"] = Field(
        default="auto",
        description=(
            "Units of the model's box output; `auto`: the model's `box_units` metadata, else told "
            "apart from the values."
        ),
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

    @field_validator("class_groups")
    @classmethod
    def _check_class_groups(cls, value: list[list[str]]) -> list[list[str]]:
        seen: set[str] = set()
        for group in value:
            twice = seen.intersection(group)
            if twice:
                raise ValueError(f"class {sorted(twice)[0]!r} is in more than one class group")
            seen.update(group)
        return value

    @model_validator(mode="after")
    def _check_classes(self) -> Self:
        if not self.class_names:
            return self  # the model's own names: checked when it loads (and by validate-config)
        known = set(self.class_names)
        unknown = [(i, name) for i, name in enumerate(self.classes) if name not in known]
        if unknown:
            raise config_errors(
                "DetectorConfig",
                [
                    (("classes", i), unknown_class_message(name, self.class_names, "class_names"))
                    for i, name in unknown
                ],
            )
        return self

    def class_name(self, class_id: int) -> str:
        """The configured name of `class_id`, or its number where none is configured.

        A `Detector` knows the model's names too: prefer `Detector.class_name`.
        """
        if 0 <= class_id < len(self.class_names):
            return self.class_names[class_id]
        return str(class_id)


def unknown_class_message(name: str, known: list[str] | tuple[str, ...], source: str) -> str:
    """The error for a class name that `known` (the names from `source`) does not hold."""
    return f"unknown class {name!r}; the classes of {source} are: {', '.join(known)}"
