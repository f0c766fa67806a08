"""`fleet:` — the agent updates its own model from the fleet's signed store (off by default).

When on, the agent follows the retained rollout topics of its `groups` on its own MQTT broker
(`{mqtt.topic_prefix}/fleet/rollouts/{group}`), verifies each rollout's and each manifest's
Ed25519 signature against `trusted_keys` and the artifact's sha256 before anything loads,
downloads into `state_dir` within `disk_budget_mb` (resuming after a cut), swaps the model in
with the reload path, and rolls back by itself when the live `evidence` says the new model does
worse than the old one did (see `edge_agent.fleet`).
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path
from typing import Self
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from configkit.base import StrictModel
from configkit.yaml_loader import config_error_at
from edge_agent.config.agent import NAME_PATTERN

__all__ = ["EvidenceConfig", "FleetConfig"]

_STORE_SCHEMES = ("https", "http", "file")


class EvidenceConfig(StrictModel):
    """When a new model is kept or rolled back: its live window against the old model's."""

    window_s: float = Field(
        default=300.0,
        ge=1.0,
        le=86_400.0,
        description=(
            "Length of the live window judged after a swap, and of the baseline window of the "
            "old model before it."
        ),
    )
    min_frames: int = Field(
        default=200,
        ge=1,
        le=10_000_000,
        description="Frames analysed in each window before any verdict (all cameras together).",
    )
    max_detection_drop: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "Roll back when detections per frame fall by more than this share of the old model's."
        ),
    )
    min_baseline_detections: float = Field(
        default=0.2,
        ge=0.0,
        le=1_000.0,
        description=(
            "Detections per frame the old model must have had for the detection test to count "
            "(a quiet camera proves nothing)."
        ),
    )
    max_agreement_drop: float = Field(
        default=0.2,
        ge=0.0,
        le=1.0,
        description=(
            "Roll back when the cloud's agreement with the edge's sure tracks falls by more "
            "than this (absolute share)."
        ),
    )
    min_agreement_checks: int = Field(
        default=20,
        ge=1,
        le=1_000_000,
        description="Sure tracks the cloud must have checked in each window for that test.",
    )
    max_escalation_rise: float = Field(
        default=0.25,
        ge=0.0,
        le=1.0,
        description=(
            "Roll back when the share of frames escalated to the cloud rises by more than this "
            "(absolute share)."
        ),
    )
    max_fps_drop: float = Field(
        default=0.3,
        ge=0.0,
        le=1.0,
        description="Roll back when the analysed frame rate falls by more than this share.",
    )


class FleetConfig(StrictModel):
    """Model updates from the fleet's signed store over the rollout topics (off by default)."""

    enabled: bool = Field(default=False, description="Follow the fleet's rollouts of this box.")
    store_url: str | None = Field(
        default=None,
        max_length=2048,
        description="Base URL of the model store (https://, http:// or file://); needed when on.",
    )
    ca_path: Path | None = Field(
        default=None, description="PEM CA bundle to verify an https store; none: system roots."
    )
    trusted_keys: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Ed25519 public keys (base64 of 32 bytes) whose signatures are trusted.",
    )
    groups: list[str] = Field(
        default_factory=lambda: ["default"],
        min_length=1,
        max_length=16,
        description="Rollout groups this box follows; the first that assigns a model wins.",
    )
    state_dir: Path = Field(
        default=Path("/var/lib/edge-agent/fleet"),
        description="Folder of the downloaded models and `state.json` (survives a power cut).",
    )
    disk_budget_mb: float = Field(
        default=512.0,
        gt=0.0,
        le=1_048_576.0,
        description="Most MiB of downloaded models kept; older unused ones are evicted first.",
    )
    download_timeout_s: float = Field(
        default=60.0,
        gt=0.0,
        le=3_600.0,
        description="Longest wait for the store on one request (connect or read).",
    )
    retry_interval_s: float = Field(
        default=30.0,
        ge=0.1,
        le=86_400.0,
        description="Wait before trying a failed download or an unreachable store again.",
    )
    status_interval_s: float = Field(
        default=30.0,
        ge=0.5,
        le=3_600.0,
        description="Republish the retained fleet status this often (and on every change).",
    )
    max_boot_attempts: int = Field(
        default=2,
        ge=1,
        le=100,
        description=(
            "Boots that found a model still on trial (a power cut mid-swap) before it is "
            "rejected for good."
        ),
    )
    evidence: EvidenceConfig = Field(
        default_factory=EvidenceConfig,
        description="When a new model is rolled back on the live signals.",
    )

    @field_validator("store_url")
    @classmethod
    def _check_store_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in _STORE_SCHEMES:
            raise ValueError(
                f"the store URL must start with {', '.join(s + '://' for s in _STORE_SCHEMES)}; "
                f"got {url!r}"
            )
        if parts.scheme != "file" and not parts.hostname:
            raise ValueError(f"the store URL {url!r} names no host")
        return url

    @field_validator("trusted_keys")
    @classmethod
    def _check_keys(cls, keys: list[str]) -> list[str]:
        for index, key in enumerate(keys):
            try:
                raw = base64.b64decode(key, validate=True)
            except (binascii.Error, ValueError):
                raw = b""
            if len(raw) != 32:
                raise ValueError(
                    f"trusted key {index} is not an Ed25519 public key (base64 of 32 bytes, as "
                    "`fleet keygen` prints it)"
                )
        return keys

    @field_validator("groups")
    @classmethod
    def _check_groups(cls, groups: list[str]) -> list[str]:
        for group in groups:
            if not re.fullmatch(NAME_PATTERN, group):
                raise ValueError(
                    f"group {group!r} must be letters, digits, `_`, `.` or `-` (it goes into a "
                    "topic), at most 64 characters"
                )
        if len(set(groups)) != len(groups):
            raise ValueError("groups are listed twice")
        return groups

    @model_validator(mode="after")
    def _check_enabled(self) -> Self:
        if not self.enabled:
            return self
        if self.store_url is None:
            raise config_error_at(("store_url",), "fleet.enabled needs a `store_url`")
        if not self.trusted_keys:
            raise config_error_at(
                ("trusted_keys",), "fleet.enabled needs at least one trusted public key"
            )
        return self
