"""`labels:` — escalated frames kept with the cloud's answers, as training data for this camera.

Off by default: the store keeps camera images on the box, so turn it on only where the site's
privacy rules allow it, and only for the cameras listed. When on, every escalated frame the cloud
answers is written under `directory` as `<camera>/<YYYY-MM-DD>/<frame id>-<n>.jpg` (exactly the
JPEG sent: the whole frame, or each region crop) with a `.json` beside it: the cloud's boxes in
that image's pixels, the edge's and the cloud's model names and versions, the camera, the capture
time. Files are deleted after `retention_days`, or sooner, oldest first, beyond `max_disk_mb`.
`vision-toolchain` reads the folder to fine-tune the edge model on its own camera (distillation).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from configkit.base import StrictModel

__all__ = ["LabelStoreConfig"]


class LabelStoreConfig(StrictModel):
    """Escalated frames and the cloud's answers, kept per camera for training (off)."""

    enabled: bool = Field(
        default=False, description="Keep escalated frames and the cloud's answers on this box."
    )
    directory: Path = Field(
        default=Path("/var/lib/edge-agent/labels"),
        description="Folder that holds them (created when missing, readable by the agent only).",
    )
    cameras: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Cameras whose frames may be kept; empty: every camera.",
    )
    min_score: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Cloud boxes below this score are not written (training picks its own cut).",
    )
    retention_days: float = Field(
        default=14.0, gt=0.0, le=3_650.0, description="Files older than this are deleted."
    )
    max_disk_mb: float = Field(
        default=1_024.0,
        gt=0.0,
        le=16_777_216.0,
        description="Beyond this many MiB, the oldest files are deleted.",
    )
    max_pending: int = Field(
        default=64,
        ge=1,
        le=4096,
        description=(
            "Escalated frames waiting for their answer or for the disk; beyond it the newest "
            "are not kept (counted), never blocking the frame loop."
        ),
    )
