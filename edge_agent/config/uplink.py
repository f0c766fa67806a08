"""The `escalation.uplink` section: how escalated whole frames are encoded for the cloud."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from configkit.base import StrictModel
from configkit.yaml_loader import config_error_at

UplinkCodec = Literal["h264", "hevc", "jpeg"]


class UplinkConfig(StrictModel):
    """Escalated whole frames as an inter-coded video stream per camera, JPEG as the fallback.

    Only the escalated frames are encoded, in the order they are sent, so each is coded
    against the previous one: a fixed camera's background costs next to nothing after the first
    keyframe. Crops (region mode) stay JPEG. A cloud replica that does not announce the codec
    gets JPEG, and so does a frame whose encoding fails.
    """

    codec: UplinkCodec = Field(
        default="h264",
        description=(
            "`h264` (libx264) or `hevc` (libx265) for escalated whole frames; `jpeg` sends "
            "independent JPEGs (escalation.jpeg_quality) as before this setting existed."
        ),
    )
    crf: int = Field(
        default=20,
        ge=0,
        le=51,
        description=(
            "Constant rate factor of the encoder: lower is better quality and more bytes (+6 is "
            "about half the bytes). The quality the encoder returns to whenever the byte budget "
            "allows; 20 is the quality of the benches' camera streams."
        ),
    )
    max_crf: int = Field(
        default=36,
        ge=0,
        le=51,
        description=(
            "The encoder's quality follows the byte budget (per_camera_bytes_per_s): while the "
            "budget runs short it raises the CRF step by step up to this, before any frame is "
            "refused for bytes."
        ),
    )
    preset: Literal["ultrafast", "superfast", "veryfast", "faster", "fast", "medium"] = Field(
        default="veryfast",
        description="Encoder speed preset: faster presets cost the edge less CPU, more bytes.",
    )
    keyframe_interval_s: float = Field(
        default=60.0,
        ge=1.0,
        le=3_600.0,
        description=(
            "A keyframe at least this often per camera, so that a decoder recovers even from "
            "an error nobody noticed; keyframes are also sent on a new stream and whenever the "
            "cloud asks for one."
        ),
    )
    max_width: int = Field(
        default=0,
        ge=0,
        le=8_192,
        description=(
            "Scale escalated frames down to at most this width before encoding (height in "
            "proportion, even sizes); 0 keeps the camera's size. Detections still come back in "
            "the camera's pixels."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.max_crf < self.crf:
            raise config_error_at(
                ("max_crf",), f"max_crf ({self.max_crf}) is below crf ({self.crf})"
            )
        return self
