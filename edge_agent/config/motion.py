"""`cameras[].motion:` — skip inference on frames where nothing moves (as Frigate does)."""

from __future__ import annotations

from pydantic import Field

from configkit.base import StrictModel


class MotionConfig(StrictModel):
    """Motion gating: detect only when enough of the (downscaled) image changed."""

    enabled: bool = Field(
        default=False, description="Skip detection on frames without motion (saves compute)."
    )
    downscale_width_px: int = Field(
        default=160, ge=16, le=1920, description="Width the frame is shrunk to before comparing."
    )
    pixel_delta: int = Field(
        default=20,
        ge=1,
        le=255,
        description="Grey-level change (0..255) that makes a pixel count as moving.",
    )
    min_changed_fraction: float = Field(
        default=0.002,
        gt=0.0,
        le=1.0,
        description="Share of pixels that must change for the frame to count as moving.",
    )
    background_alpha: float = Field(
        default=0.1,
        gt=0.0,
        le=1.0,
        description="Weight of the newest frame in the running background average.",
    )
    max_skip_s: float = Field(
        default=1.0,
        ge=0.0,
        le=60.0,
        description=(
            "Detect at least this often even without motion, so still objects stay tracked; "
            "keep it below the rules' track time-out (2 s)."
        ),
    )
