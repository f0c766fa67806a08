"""`cameras:` — one entry per stream: source, capture behaviour, zones, lines and rules."""

from __future__ import annotations

from typing import Any, Literal, Self, get_args
from urllib.parse import urlsplit

from pydantic import Field, ModelWrapValidatorHandler, field_validator, model_validator

from configkit.base import StrictModel
from configkit.secrets import SecretRef
from configkit.yaml_loader import LocatedMessage, config_error_at, field_of, validate_with_checks
from edge_agent.config.agent import NAME_PATTERN
from edge_agent.config.geometry import LineConfig, ZoneConfig
from edge_agent.config.motion import MotionConfig
from edge_agent.config.rules import RULE_PLACES, RuleConfig

_STREAM_SCHEMES = ("rtsp", "rtsps")
# the `kind` of every rule model in the `RuleConfig` union (Annotated[A | B | ..., Field])
_RULE_KINDS: frozenset[object] = frozenset(
    rule.model_fields["kind"].default for rule in get_args(get_args(RuleConfig)[0])
)


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
    file_replay: Literal["live", "every_frame"] = Field(
        default="live",
        description=(
            "Video files only. `live`: replay at the clip's frame rate and drop the frames "
            "analysis cannot keep up with, like a camera. `every_frame`: never drop; wait for "
            "analysis and stamp each frame on the clip's own clock, to analyse a recording whole."
        ),
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
    def _check_file_replay(self) -> Self:
        if self.file_replay == "every_frame" and (
            "://" in self.url or self.capture.gstreamer_pipeline is not None
        ):
            raise config_error_at(
                ("file_replay",),
                "file_replay every_frame applies to video files only; a live stream cannot wait",
            )
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _check_references(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        # run on the raw input too, so these are reported along with any field error
        return validate_with_checks(data, handler, cls.__name__, camera_reference_issues)


def _names(items: object) -> list[object]:
    return [field_of(item, "name") for item in items] if isinstance(items, list | tuple) else []


def camera_reference_issues(camera: object) -> list[LocatedMessage]:
    """Every duplicate zone / line / rule name, every rule naming an undefined zone or line, and
    a password without a user name, on one camera's raw config (values of the wrong type are
    skipped: field validation reports them)."""
    issues: list[LocatedMessage] = []
    camera_name = field_of(camera, "name")
    for field in ("zones", "lines", "rules"):
        seen: set[str] = set()
        for index, name in enumerate(_names(field_of(camera, field))):
            if not isinstance(name, str):
                continue
            if name in seen:
                issues.append(
                    ((field, index, "name"), f"duplicate name {name!r} on camera {camera_name!r}")
                )
            seen.add(name)
    defined = {
        what: {name for name in _names(field_of(camera, f"{what}s")) if isinstance(name, str)}
        for what in ("zone", "line")
    }
    rules = field_of(camera, "rules")
    for index, rule in enumerate(rules if isinstance(rules, list | tuple) else []):
        kind = field_of(rule, "kind")
        if kind not in _RULE_KINDS:
            continue  # an unknown kind is a field error
        what = RULE_PLACES[str(kind)]
        ref = field_of(rule, what)
        places = field_of(camera, f"{what}s")
        if not isinstance(ref, str) or not isinstance(places, list | tuple | None):
            continue
        if ref not in defined[what]:
            names = ", ".join(sorted(defined[what])) or "none"
            issues.append(
                (
                    ("rules", index, what),
                    f"rule {field_of(rule, 'name')!r} refers to {what} {ref!r}, which is not "
                    f"defined on camera {camera_name!r} ({what}s defined: {names})",
                )
            )
    if field_of(camera, "password") is not None and field_of(camera, "username") is None:
        issues.append((("password",), "a password needs a `username`"))
    return issues
