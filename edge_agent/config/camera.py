"""`cameras:` — one entry per stream: source, capture behaviour, zones, lines and rules."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from configkit.base import StrictModel
from configkit.secrets import SecretRef
from configkit.yaml_loader import config_error_at
from edge_agent.config.agent import NAME_PATTERN
from edge_agent.config.geometry import LineConfig, ZoneConfig
from edge_agent.config.motion import MotionConfig
from edge_agent.config.rules import LineCrossRule, RuleConfig

_STREAM_SCHEMES = ("rtsp", "rtsps")


class CaptureConfig(StrictModel):
    """How frames are read: stall watchdog, reconnect back-off, transport, optional GStreamer."""

    stall_timeout_ms: int = Field(
        default=5_000,
        ge=100,
        le=600_000,
        description="Restart the stream after no frame this long.",
    )
    reconnect_min_backoff_ms: int = Field(
        default=500, ge=0, le=600_000, description="First wait before reconnecting."
    )
    reconnect_max_backoff_ms: int = Field(
        default=30_000,
        ge=0,
        le=3_600_000,
        description="Longest wait; the back-off doubles up to it.",
    )
    reconnect_jitter_fraction: float = Field(
        default=0.2, ge=0.0, le=1.0, description="Random spread of each wait, as a fraction of it."
    )
    rtsp_transport: Literal["tcp", "udp"] = Field(
        default="tcp", description="RTSP transport; TCP survives lossy links, UDP has less delay."
    )
    gstreamer_pipeline: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="GStreamer pipeline ending in `appsink` (hardware decode); none: FFmpeg.",
    )

    @model_validator(mode="after")
    def _check_backoff(self) -> Self:
        if self.reconnect_min_backoff_ms > self.reconnect_max_backoff_ms:
            raise config_error_at(
                ("reconnect_min_backoff_ms",),
                f"reconnect_min_backoff_ms ({self.reconnect_min_backoff_ms}) must not exceed "
                f"reconnect_max_backoff_ms ({self.reconnect_max_backoff_ms})",
            )
        return self


def first_duplicate(names: Iterable[str]) -> tuple[int, str] | None:
    """Index and value of the first name that repeats an earlier one, if any."""
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            return index, name
        seen.add(name)
    return None


class CameraConfig(StrictModel):
    """One camera: where its stream comes from and what to watch for in it."""

    name: str = Field(
        pattern=NAME_PATTERN, description="Camera name, unique on the agent; part of MQTT topics."
    )
    url: str = Field(
        min_length=1,
        max_length=2048,
        description="`rtsp://` or `rtsps://` URL (no password in it), or a video file path.",
    )
    username: str | None = Field(
        default=None, min_length=1, max_length=256, description="RTSP user name."
    )
    password: SecretRef | None = Field(
        default=None, description="Where the RTSP password comes from."
    )
    enabled: bool = Field(
        default=True, description="Disabled cameras are validated but not opened."
    )
    target_fps: float = Field(
        default=10.0, gt=0.0, le=120.0, description="Frames per second to analyse (others dropped)."
    )
    loop_file: bool = Field(
        default=True, description="Replay a video file source from the start when it ends."
    )
    capture: CaptureConfig = Field(default_factory=CaptureConfig, description="Capture behaviour.")
    motion: MotionConfig = Field(
        default_factory=MotionConfig, description="Skip detection on frames without motion."
    )
    zones: list[ZoneConfig] = Field(
        default_factory=list, max_length=256, description="Named polygons used by rules."
    )
    lines: list[LineConfig] = Field(
        default_factory=list, max_length=256, description="Named counting lines used by rules."
    )
    rules: list[RuleConfig] = Field(
        default_factory=list, max_length=1024, description="Rules that turn tracks into events."
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        if "://" not in url:
            return url  # a file path; existence is checked when the camera opens, not here
        parts = urlsplit(url)
        if parts.scheme not in _STREAM_SCHEMES:
            raise ValueError("URL scheme must be rtsp or rtsps (or give a file path)")
        if not parts.hostname:
            raise ValueError("stream URL has no host")
        if parts.password is not None:
            raise ValueError("put the password in `password` (a secret reference), not in the URL")
        return url

    @model_validator(mode="after")
    def _check_references(self) -> Self:
        for field, names in (
            ("zones", [zone.name for zone in self.zones]),
            ("lines", [line.name for line in self.lines]),
            ("rules", [rule.name for rule in self.rules]),
        ):
            duplicate = first_duplicate(names)
            if duplicate is not None:
                index, name = duplicate
                raise config_error_at(
                    (field, index, "name"), f"duplicate name {name!r} on camera {self.name!r}"
                )
        zones = {zone.name for zone in self.zones}
        lines = {line.name for line in self.lines}
        for index, rule in enumerate(self.rules):
            if isinstance(rule, LineCrossRule):
                field, ref, known, what = "line", rule.line, lines, "line"
            else:
                field, ref, known, what = "zone", rule.zone, zones, "zone"
            if ref not in known:
                defined = ", ".join(sorted(known)) or "none"
                raise config_error_at(
                    ("rules", index, field),
                    f"rule {rule.name!r} refers to {what} {ref!r}, which is not defined on "
                    f"camera {self.name!r} ({what}s defined: {defined})",
                )
        if self.password is not None and self.username is None:
            raise config_error_at(("password",), "a password needs a `username`")
        return self
