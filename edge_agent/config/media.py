"""`media:` — event snapshots, crops and clips written on the box, and how long they are kept.

Off by default. When on, every `start` of an event that has a frame gets an annotated snapshot
and a clean crop of the event's box; with `clips` on, also a short video from a little before to
a little after the event. Files live under `directory` as `<camera>/<YYYY-MM-DD>/<event id>...`
(the event's UTC date) and are deleted after `retention_days`, or sooner, oldest first, when
they take more than `max_disk_mb`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from configkit.base import StrictModel

__all__ = ["ClipCodec", "ClipConfig", "MediaConfig"]

ClipCodec = Literal["mp4v", "vp8", "mjpeg"]
"""`mp4v`: MPEG-4 Part 2 in `.mp4`; `vp8`: VP8 in `.webm`; `mjpeg`: the ring's JPEGs as they are
in `.avi` (see `ClipConfig.codec`)."""


class ClipConfig(StrictModel):
    """Event clips: frames kept (already JPEG-encoded) for `pre_s` before an event, then
    collected for `post_s` after it, written as one video."""

    enabled: bool = Field(default=False, description="Write a clip around each event start.")
    pre_s: float = Field(
        default=3.0, ge=0.0, le=60.0, description="Seconds of video before the event."
    )
    post_s: float = Field(
        default=5.0, ge=0.0, le=120.0, description="Seconds of video after the event."
    )
    fps: float = Field(
        default=5.0,
        gt=0.0,
        le=30.0,
        description="Frames per second kept for clips (each costs a JPEG encode off the loop).",
    )
    max_width: int = Field(
        default=960, ge=160, le=7680, description="Clip frames wider than this are scaled down."
    )
    codec: ClipCodec = Field(
        default="mp4v",
        description=(
            "`mp4v` (`.mp4`, MPEG-4 Part 2): cheap, plays in Safari, QuickTime, Windows and VLC "
            "but not in Chrome or Firefox; `vp8` (`.webm`): plays in every browser at many times "
            "the CPU; `mjpeg` (`.avi`): almost no CPU but more disk. The OpenCV wheel has no "
            "H.264 encoder."
        ),
    )
    stall_timeout_s: float = Field(
        default=10.0,
        gt=0.0,
        le=600.0,
        description=(
            "A clip is written with the frames it has once its camera sent none for this long "
            "(a camera gone, a stalled stream)."
        ),
    )


class MediaConfig(StrictModel):
    """Snapshots, crops and clips of events, written off the frame loop, with retention."""

    enabled: bool = Field(default=False, description="Record media for events.")
    directory: Path = Field(
        default=Path("/var/lib/edge-agent/media"),
        description="Folder that holds the media (created when missing).",
    )
    snapshot: bool = Field(
        default=True, description="Write the event's frame, annotated, as a JPEG."
    )
    crop: bool = Field(
        default=True, description="Write a clean JPEG crop of the event's box (no drawing)."
    )
    crop_margin: float = Field(
        default=0.25,
        ge=0.0,
        le=4.0,
        description="Margin added on each side of the box, as a fraction of its width / height.",
    )
    jpeg_quality: int = Field(
        default=85, ge=10, le=100, description="JPEG quality of snapshots, crops and clip frames."
    )
    base_url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^(https?://[^\s/?#]+(/[^\s?#]*)?|/[^\s?#]*)$",
        description=(
            "URL the folder is served at, e.g. `http://box:8480/media`; a file's URL is this + "
            "`/` + its path under `directory`. None: references carry no URL."
        ),
    )
    clips: ClipConfig = Field(default_factory=ClipConfig, description="Event clips.")
    retention_days: float = Field(
        default=7.0, gt=0.0, le=3_650.0, description="Files older than this are deleted."
    )
    max_disk_mb: float = Field(
        default=2_048.0,
        gt=0.0,
        le=16_777_216.0,
        description="Beyond this many MiB, the oldest files are deleted.",
    )
    sweep_interval_s: float = Field(
        default=60.0, ge=1.0, le=86_400.0, description="How often retention is enforced."
    )
    queue_limit: int = Field(
        default=64,
        ge=1,
        le=10_000,
        description=(
            "Jobs (snapshots, clip frames, clips) waiting for the writer; beyond it new jobs are "
            "dropped and counted, so the frame loop never waits."
        ),
    )
    worker_niceness: int = Field(
        default=10,
        ge=0,
        le=19,
        description=(
            "Nice value of the media threads (Linux), so encoding yields the CPU to the frame "
            "loop when both want it."
        ),
    )
