"""What a published model is: its identity (`ModelRef`) and its description (`ModelManifest`).

A manifest describes one immutable, content-addressed artifact (its sha256). What gets signed is
`ModelManifest.canonical_bytes()`: JSON with sorted keys, no spaces, UTF-8, so that any party
that parses the same manifest computes the same bytes.
"""

from __future__ import annotations

import builtins
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePath
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fleet.names import NAME_PATTERN, SHA256_PATTERN, check_name, check_sha256

__all__ = [
    "MAX_ARTIFACT_BYTES",
    "RUNTIME_DETECTOR_TYPE",
    "RUNTIME_OF_SUFFIX",
    "ManifestError",
    "ModelManifest",
    "ModelRef",
    "Runtime",
    "canonical_json",
    "utc_now_iso",
]

Runtime = Literal["onnx", "litert"]

RUNTIME_OF_SUFFIX: Final[dict[str, Runtime]] = {".onnx": "onnx", ".tflite": "litert"}
"""The runtime an artifact file runs on, by its suffix."""

RUNTIME_DETECTOR_TYPE: Final[dict[Runtime, str]] = {"onnx": "onnxruntime", "litert": "litert"}
"""The detector config's runtime `type` for a manifest's `runtime`."""

MAX_ARTIFACT_BYTES: Final = 4 * 1024**3
"""No model the fleet runs is near 4 GiB; a manifest claiming more is refused."""

_FILENAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


class ManifestError(ValueError):
    """A manifest or signed document that is malformed, too large or inconsistent."""


@dataclass(frozen=True)
class ModelRef:
    """Which model: name, version and the sha256 of its artifact (the identity that counts)."""

    name: str
    version: str
    sha256: str

    def __post_init__(self) -> None:
        check_name(self.name, "model name")
        check_name(self.version, "model version")
        check_sha256(self.sha256)

    def __str__(self) -> str:
        return f"{self.name}:{self.version}@{self.sha256[:12]}"

    def as_json(self) -> dict[str, str]:
        """`{"name", "version", "sha256"}`, as status documents and events carry it."""
        return {"name": self.name, "version": self.version, "sha256": self.sha256}


def utc_now_iso() -> str:
    """The current time as ISO 8601 UTC with a `Z`, to the second."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def canonical_json(value: object) -> bytes:
    """JSON with sorted keys, no spaces, UTF-8: the bytes that are signed."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


class ModelManifest(BaseModel):
    """One published model artifact and what the fleet needs to know before it loads it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    name: str = Field(pattern=NAME_PATTERN, description="Model name (a line of models).")
    version: str = Field(pattern=NAME_PATTERN, description="Version within the name.")
    sha256: str = Field(pattern=SHA256_PATTERN, description="sha256 of the artifact, hex.")
    bytes: int = Field(ge=1, le=MAX_ARTIFACT_BYTES, description="Size of the artifact in bytes.")
    filename: str = Field(
        pattern=_FILENAME_PATTERN,
        description="Artifact file name; its suffix gives the format (`.onnx`, `.tflite`).",
    )
    runtime: Runtime = Field(description="Runtime it runs on: `onnx` or `litert`.")
    classes: list[str] = Field(
        max_length=10_000, description="Class names by id (empty: the model names none)."
    )
    input: tuple[int, int] = Field(description="Input size the model takes, (height, width).")
    admitted: dict[str, float] = Field(
        default_factory=dict,
        max_length=256,
        description="Metrics of the check that admitted it (may be empty).",
    )
    derived_from: str | None = Field(
        default=None, pattern=SHA256_PATTERN, description="sha256 of the parent model, if any."
    )
    created_at: str = Field(
        min_length=1, max_length=64, description="When it was published, ISO 8601 UTC."
    )

    @field_validator("filename")
    @classmethod
    def _known_suffix(cls, value: str) -> str:
        if PurePath(value).suffix not in RUNTIME_OF_SUFFIX:
            raise ValueError(f"artifact suffix must be one of {sorted(RUNTIME_OF_SUFFIX)}")
        return value

    @field_validator("input")
    @classmethod
    def _positive_size(cls, value: tuple[int, int]) -> tuple[int, int]:
        if not all(1 <= side <= 16_384 for side in value):
            raise ValueError(f"input (height, width) must be 1..16384 each, got {value}")
        return value

    @field_validator("created_at")
    @classmethod
    def _iso_time(cls, value: str) -> str:
        try:
            datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"not an ISO 8601 time: {value!r}") from None
        return value

    @property
    def ref(self) -> ModelRef:
        """The model's identity."""
        return ModelRef(self.name, self.version, self.sha256)

    @property
    def suffix(self) -> str:
        """The artifact's file suffix (`.onnx`, `.tflite`)."""
        return PurePath(self.filename).suffix

    def canonical_bytes(self) -> builtins.bytes:
        """What is signed: the manifest as canonical JSON."""
        return canonical_json(self.model_dump(mode="json"))

    @classmethod
    def from_json_value(cls, value: object) -> ModelManifest:
        """Validate a parsed JSON value (`ManifestError` naming the fields at fault)."""
        try:
            return cls.model_validate_json(canonical_json(value))
        except (ValidationError, ValueError) as error:
            raise ManifestError(f"invalid model manifest: {_brief(error)}") from None


def _brief(error: Exception) -> str:
    if isinstance(error, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in item['loc']) or 'manifest'}: {item['msg']}"
            for item in error.errors()[:5]
        )
    return str(error)
