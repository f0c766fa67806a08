"""`tracker:` — DeepSORT per camera: track life cycle, matching gates, appearance embedder."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, model_validator

from configkit.base import StrictModel
from configkit.yaml_loader import config_error_at


class TrackerConfig(StrictModel):
    """DeepSORT settings, shared by the trackers of all cameras."""

    max_age_frames: int = Field(
        default=30, ge=1, le=10_000, description="Delete a track unmatched for this many frames."
    )
    n_init: int = Field(
        default=3, ge=1, le=100, description="Matches in a row before a track is confirmed."
    )
    max_iou_distance: float = Field(
        default=0.7, ge=0.0, le=1.0, description="Largest 1 - IoU accepted in the IoU match."
    )
    skip_iou_buffer: float = Field(
        default=0.3,
        ge=0.0,
        le=2.0,
        description=(
            "Buffered IoU (C-BIoU) for a box slower than its camera: when analysed frames are "
            "n camera frames apart, the IoU match grows track and detection boxes by this "
            "fraction of their size times (n - 1) on each side, so an object that moved past "
            "its own width still matches its track. 0: plain IoU; nothing changes at the "
            "camera's full rate (bench/results/slow_box_alerts.md)."
        ),
    )
    skip_iou_buffer_max: float = Field(
        default=3.0,
        ge=0.0,
        le=10.0,
        description="Largest growth `skip_iou_buffer` gives a box, as a fraction of its size.",
    )
    skip_backdate_origin: bool = Field(
        default=True,
        description=(
            "A track first seen n camera frames after the analysed frame before it is judged by "
            "the rules from where it was n - 1 frames earlier along its velocity (known once it "
            "is confirmed): a box slower than its camera first catches an object that walked "
            "into a zone or over a line in between past it. Nothing moves at the camera's full "
            "rate (bench/results/slow_box_alerts.md)."
        ),
    )
    max_cosine_distance: float = Field(
        default=0.2, ge=0.0, le=2.0, description="Largest appearance distance accepted."
    )
    gallery_size: int = Field(
        default=100, ge=1, le=10_000, description="Appearance features kept per track."
    )
    embedder: Literal["mobilenetv2", "histogram", "none"] = Field(
        default="histogram",
        description="Appearance features: MobileNetV2, colour histograms, or none (IoU only).",
    )
    embedder_model_path: Path | None = Field(
        default=None,
        description="Model file of the `mobilenetv2` embedder: `.onnx` (ONNX Runtime) or "
        "`.tflite` (LiteRT), e.g. models/embedder/mobilenetv2-224.onnx.",
    )
    embed_policy: Literal["all", "ambiguous"] = Field(
        default="all",
        description=(
            "Which boxes the embedder sees: `all`, or only those whose match depends on "
            "appearance (`ambiguous`: a box alone with its track, overlapping it, with no other "
            "track near, is matched without a feature). Worth it with `mobilenetv2`; with "
            "`histogram` it saves little and costs identity switches."
        ),
    )
    embed_refresh_frames: int = Field(
        default=10,
        ge=1,
        le=10_000,
        description=(
            "With `embed_policy: ambiguous`, a track matched without a feature still gets a "
            "new one after this many frames, so its gallery stays current for re-identification "
            "after an occlusion."
        ),
    )
    embed_isolation_margin: float = Field(
        default=0.5,
        ge=0.0,
        le=10.0,
        description=(
            "With `embed_policy: ambiguous`, a box is still embedded when another box lies "
            "within this fraction of its width / height of it (objects about to meet)."
        ),
    )
    low_score_threshold: float | None = Field(
        default=None,
        ge=0.0,
        lt=1.0,
        description=(
            "Second pass (ByteTrack): detections scoring at least this but below "
            "`detector.confidence_threshold` are matched to tracks left unmatched; they never "
            "start a track. Null turns the second pass off."
        ),
    )

    class_gate: bool = Field(
        default=True,
        description=(
            "A detection continues only a track of its own class or of its class group "
            "(`detector.class_groups`: a van's track survives car/truck flicker, a person's is "
            "never continued by the bicycle under them). false: any detection may continue any "
            "track (swaps cyclists' person and bicycle tracks; bench/results/real_hybrid.md)."
        ),
    )
    new_track_min_score: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description=(
            "A detection left unmatched starts a new track only when it scores at least this "
            "(ByteTrack puts it 0.1 above its matching threshold); null: "
            "`detector.confidence_threshold`, also the floor. Raising it drops false tracks on "
            "generated scenes and loses true ones on real footage."
        ),
    )

    recover_iou: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description=(
            "Observation-centric recovery (OC-SORT): a track no detection matched by its "
            "predicted box may take one overlapping the box it was last measured at by at least "
            "this IoU, before a new track is started there (a person who stopped or turned is "
            "predicted on past their box). 0 (the default) turns it off; 0.3 is measured in "
            "bench/results/real_hybrid.md (the `recovery` rows)."
        ),
    )

    @model_validator(mode="after")
    def _check_embedder(self) -> Self:
        if self.embedder == "mobilenetv2" and self.embedder_model_path is None:
            raise config_error_at(
                ("embedder",), "the mobilenetv2 embedder needs `embedder_model_path`"
            )
        return self
