"""Hand what the toolchain admits to the fleet's model store (`--publish STORE --key KEY`).

`detection` sits below `fleet` (the fleet imports model metadata from here, never the other way
round), so the toolchain publishes through the `fleet publish` command, the same one an operator
runs, in a child process: the store, the signature and the manifest stay the fleet's business,
and the toolchain only says what was admitted and why (the metrics of the check that admitted
it, under `admitted` in the signed manifest).
"""

from __future__ import annotations

import hashlib
import math
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from detection.errors import ExportError

__all__ = [
    "PublishTarget",
    "admitted_from_accuracy",
    "admitted_from_distill",
    "publish_model",
    "sha256_of",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
PUBLISH_TIMEOUT_S = 600.0  # hashing and copying a model of a few hundred MB, at worst


@dataclass(frozen=True)
class PublishTarget:
    """Where and as what to publish: store directory, signing key, name and version."""

    store: Path
    key: Path
    name: str | None = None  # None: the artefact's file stem
    version: str | None = None  # None: the UTC time, e.g. 20261205T041500Z

    def check(self) -> None:
        """Fail fast (before a long export) on what can be checked now."""
        if not self.key.is_file():
            raise ExportError(f"signing key not found: {self.key}")
        for what, value in (("--publish-name", self.name), ("--publish-version", self.version)):
            if value is not None and not _NAME.fullmatch(value):
                raise ExportError(f"{what} {value!r}: use 1-64 of A-Z a-z 0-9 _ . -")

    def resolved(self, model: Path) -> tuple[str, str]:
        """(name, version) for `model`."""
        name = self.name or re.sub(r"[^A-Za-z0-9_.-]", "-", model.stem).lstrip(".-_")[:64]
        version = self.version or datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        return name or "model", version


def sha256_of(path: Path) -> str:
    """The sha256 (hex) of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def _finite(values: Mapping[str, Any]) -> dict[str, float]:
    return {
        key: float(value)
        for key, value in values.items()
        if isinstance(value, int | float) and math.isfinite(value)
    }


def admitted_from_accuracy(report: Mapping[str, Any]) -> dict[str, float]:
    """The export's accuracy check (`<artefact>.accuracy.json`) as `admitted` metrics."""
    export = report.get("export", {}).get("overall", {})
    delta = report.get("delta", {})
    return _finite(
        {
            "map50": export.get("map50"),
            "map50_95": export.get("map50_95"),
            "map50_change_vs_source": delta.get("map50"),
            "map50_95_change_vs_source": delta.get("map50_95"),
        }
    )


def admitted_from_distill(report: Mapping[str, Any]) -> dict[str, float]:
    """A distillation report (`DistillReport.to_dict()`) as `admitted` metrics."""
    before, after = report.get("before", {}), report.get("after", {})

    def change(key: str) -> float | None:
        a, b = after.get(key), before.get(key)
        return None if a is None or b is None else float(a) - float(b)

    return _finite(
        {
            "camera_map50": after.get("camera_map50"),
            "camera_map50_95": after.get("camera_map50_95"),
            "general_map50": after.get("general_map50"),
            "general_map50_95": after.get("general_map50_95"),
            "camera_map50_gain": change("camera_map50"),
            "general_map50_change": change("general_map50"),
            "held_out_images": report.get("held_out_images"),
        }
    )


def publish_model(
    model: Path,
    target: PublishTarget,
    admitted: Mapping[str, float],
    *,
    derived_from: str | None = None,
    input_size: tuple[int, int] | None = None,
) -> str:
    """Run `fleet publish` for `model`; its output (the published ref and digest).

    Raises `ExportError` with the fleet's one-line reason when it refuses.
    """
    name, version = target.resolved(model)
    argv = [
        sys.executable, "-m", "fleet.cli", "publish",
        "--store", str(target.store), "--key", str(target.key),
        "--name", name, "--version", version,
    ]  # fmt: skip
    for key, value in sorted(admitted.items()):
        argv += ["--admitted", f"{key}={value!r}"]
    if derived_from is not None:
        argv += ["--derived-from", derived_from]
    if input_size is not None:
        argv += ["--input", f"{input_size[0]}x{input_size[1]}"]
    argv.append(str(model))
    try:
        done = subprocess.run(  # noqa: S603 - our own command, an argument list
            argv, capture_output=True, text=True, timeout=PUBLISH_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ExportError(f"publishing {model.name} failed: {error}") from None
    if done.returncode != 0:
        reason = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise ExportError(f"publishing {model.name} refused: {reason}")
    return done.stdout.strip()
