"""The model store: a directory tree that any static HTTP(S) server serves as it is.

Layout (paths are URL-relative, so nginx, an S3 bucket's website or Caddy can serve the root):

* `blobs/sha256/<hex>`: the artifact, immutable, content-addressed;
* `models/<name>/<version>.json`: a signed manifest (`SignedManifest`);
* `models/<name>/index.json`: `{"name": ..., "versions": [...]}`, newest last.

Everything is written atomically (a temporary file in the same directory, then `os.replace`), so
a server never serves half a file and a publish cut short leaves the store as it was.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fleet.envelope import parse_envelope, seal_envelope
from fleet.manifest import (
    MAX_ARTIFACT_BYTES,
    RUNTIME_OF_SUFFIX,
    ManifestError,
    ModelManifest,
    Runtime,
    utc_now_iso,
)
from fleet.names import check_name, check_sha256
from fleet.signing import Signature, Signer, Verifier

__all__ = [
    "DirectoryStore",
    "ModelFacts",
    "SignedManifest",
    "StoreError",
    "blob_path",
    "index_path",
    "manifest_path",
    "read_model_facts",
    "sha256_of_file",
]

logger = logging.getLogger(__name__)

_CHUNK = 1024 * 1024
_LOCK_NAME: Final = ".publish.lock"


class StoreError(Exception):
    """A publish the store refuses (a version taken by another artifact) or cannot do."""


def blob_path(sha256: str) -> str:
    """URL-relative path of an artifact."""
    return f"blobs/sha256/{check_sha256(sha256)}"


def manifest_path(name: str, version: str) -> str:
    """URL-relative path of a signed manifest."""
    return f"models/{check_name(name, 'model name')}/{check_name(version, 'model version')}.json"


def index_path(name: str) -> str:
    """URL-relative path of a model's version index."""
    return f"models/{check_name(name, 'model name')}/index.json"


def sha256_of_file(path: str | Path) -> tuple[str, int]:
    """The sha256 (hex) and size of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


@dataclass(frozen=True)
class SignedManifest:
    """A manifest with its signatures, as stored at `models/<name>/<version>.json`."""

    manifest: ModelManifest
    signatures: tuple[Signature, ...]

    @classmethod
    def sign(cls, manifest: ModelManifest, signer: Signer) -> SignedManifest:
        """`manifest` signed by `signer`."""
        return cls(manifest, (signer.sign(manifest.canonical_bytes()),))

    @classmethod
    def parse(cls, data: bytes) -> SignedManifest:
        """Parse a stored document; `ManifestError` on anything malformed (size-capped)."""
        manifest, signatures = parse_envelope(
            data, "manifest", ModelManifest.from_json_value, "signed manifest"
        )
        return cls(manifest, tuple(signatures))

    def to_bytes(self) -> bytes:
        """The document as stored (canonical JSON)."""
        return seal_envelope(
            "manifest", self.manifest.model_dump(mode="json"), list(self.signatures)
        )

    def verified(self, verifier: Verifier) -> ModelManifest:
        """The manifest, once a trusted key's signature checks out (else `SignatureError`)."""
        verifier.verify(self.manifest.canonical_bytes(), self.signatures)
        return self.manifest


@dataclass(frozen=True)
class ModelFacts:
    """What a model file says about itself: the runtime it runs on, its classes, its input."""

    runtime: Runtime
    classes: tuple[str, ...]
    input: tuple[int, int] | None  # None where the model's input size is dynamic


def runtime_of(path: Path) -> Runtime:
    """The runtime of an artifact by its suffix (`ManifestError` for an unknown one)."""
    runtime = RUNTIME_OF_SUFFIX.get(path.suffix)
    if runtime is None:
        raise ManifestError(
            f"{path.name}: unknown model format {path.suffix!r}; expected one of "
            f"{sorted(RUNTIME_OF_SUFFIX)}"
        )
    return runtime


def read_model_facts(path: Path) -> ModelFacts:
    """Open the model with its detection runtime and read its class names and input size.

    Raises `ManifestError` when the model cannot be opened (with the runtime's reason).
    """
    from detection.errors import DetectionError
    from detection.model_metadata import metadata_class_names
    from detection.runtimes.base import create_runtime, runtime_metadata
    from detection.runtimes.config import LiteRTConfig, OnnxRuntimeConfig

    runtime = runtime_of(path)
    config = (
        OnnxRuntimeConfig(model_path=path, intra_op_threads=1)
        if runtime == "onnx"
        else LiteRTConfig(model_path=path, num_threads=1)
    )
    try:
        loaded = create_runtime(config)
    except DetectionError as error:
        raise ManifestError(f"cannot open {path.name} to read its metadata: {error}") from None
    try:
        spec = loaded.input_spec
        classes = metadata_class_names(runtime_metadata(loaded)) or ()
    except DetectionError as error:
        raise ManifestError(f"{path.name}: {error}") from None
    finally:
        loaded.close()
    size = None if spec.height is None or spec.width is None else (spec.height, spec.width)
    return ModelFacts(runtime, tuple(classes), size)


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(tmp, 0o644)  # served as is by a web server running as another user
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _atomic_copy(source: Path, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            shutil.copyfileobj(src, out, _CHUNK)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class DirectoryStore:
    """A store on a local (or mounted) directory: publish into it, read from it."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One publisher at a time (index.json is read-modify-write)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / _LOCK_NAME, "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def read_manifest(self, name: str, version: str) -> SignedManifest | None:
        """The stored signed manifest of `name:version`, None when there is none."""
        path = self.root / manifest_path(name, version)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return SignedManifest.parse(data)

    def versions(self, name: str) -> list[str]:
        """The published versions of `name`, oldest first (empty when none)."""
        try:
            value = json.loads((self.root / index_path(name)).read_bytes())
        except FileNotFoundError:
            return []
        except ValueError as error:
            raise StoreError(f"{index_path(name)} is not JSON: {error}") from None
        versions = value.get("versions") if isinstance(value, dict) else None
        if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
            raise StoreError(f"{index_path(name)} has no list of versions")
        return list(versions)

    def names(self) -> list[str]:
        """The model names in the store."""
        models = self.root / "models"
        if not models.is_dir():
            return []
        return sorted(p.name for p in models.iterdir() if (p / "index.json").is_file())

    def publish(
        self,
        model_path: str | Path,
        name: str,
        version: str,
        signer: Signer,
        *,
        admitted: Mapping[str, float] | None = None,
        derived_from: str | None = None,
        runtime: Runtime | None = None,
        classes: Sequence[str] | None = None,
        input_size: tuple[int, int] | None = None,
    ) -> SignedManifest:
        """Publish a model file as `name:version`, signed by `signer`.

        `runtime`, `classes` and `input_size` are read from the model itself where not given
        (`read_model_facts`). Publishing `name:version` again with the same artifact is a no-op
        that returns the stored manifest; with another artifact it is refused (`StoreError`):
        a version, once out, means one artifact forever.
        """
        path = Path(model_path)
        check_name(name, "model name")
        check_name(version, "model version")
        if not path.is_file():
            raise StoreError(f"model file not found: {path}")
        sha256, size = sha256_of_file(path)
        if size > MAX_ARTIFACT_BYTES:
            raise StoreError(f"{path.name} is {size} bytes; the limit is {MAX_ARTIFACT_BYTES}")
        with self._locked():
            existing = self.read_manifest(name, version)
            if existing is not None:
                if existing.manifest.sha256 == sha256:
                    logger.info("%s is already published", existing.manifest.ref)
                    return existing
                raise StoreError(
                    f"{name}:{version} is already published with sha256 "
                    f"{existing.manifest.sha256[:12]}; this file is {sha256[:12]}: "
                    "publish it under a new version"
                )
            facts = None
            if classes is None or input_size is None:  # else the file is not opened
                facts = read_model_facts(path)
            size_hw = input_size or (facts.input if facts else None)
            if size_hw is None:
                raise StoreError(
                    f"{path.name} has a dynamic input size: give the size it runs at "
                    "(input_size / --input HxW)"
                )
            try:
                manifest = ModelManifest(
                    name=name,
                    version=version,
                    sha256=sha256,
                    bytes=size,
                    filename=f"{name}-{version}{path.suffix}",
                    runtime=runtime or runtime_of(path),
                    classes=list(
                        classes if classes is not None else facts.classes if facts else []
                    ),
                    input=size_hw,
                    admitted=dict(admitted or {}),
                    derived_from=derived_from,
                    created_at=utc_now_iso(),
                )
            except ValueError as error:
                raise StoreError(f"cannot publish {name}:{version}: {error}") from None
            signed = SignedManifest.sign(manifest, signer)
            blob = self.root / blob_path(sha256)
            if not blob.is_file():
                _atomic_copy(path, blob)
            _atomic_write(self.root / manifest_path(name, version), signed.to_bytes())
            versions = [v for v in self.versions(name) if v != version] + [version]
            index = {"name": name, "versions": versions}
            _atomic_write(self.root / index_path(name), json.dumps(index, indent=1).encode())
        logger.info("published %s (%d bytes) to %s", manifest.ref, size, self.root)
        return signed
