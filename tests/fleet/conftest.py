"""Shared pieces of the fleet tests: keys, a store with a published artifact."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleet.signing import Signer, generate_key
from fleet.store import DirectoryStore, SignedManifest


@dataclass(frozen=True)
class Published:
    store: DirectoryStore
    signer: Signer
    public_b64: str
    artifact: Path
    signed: SignedManifest


@pytest.fixture
def key(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "keys" / "fleet.pem"
    path.parent.mkdir()
    return path, generate_key(path)


def write_artifact(path: Path, size: int, seed: int = 0) -> Path:
    """A file of `size` pseudo-random bytes (stands in for a model where none is loaded)."""
    path.write_bytes(random.Random(seed).randbytes(size))
    return path


@pytest.fixture
def published(tmp_path: Path, key: tuple[Path, str]) -> Published:
    key_path, public_b64 = key
    signer = Signer.from_file(key_path)
    artifact = write_artifact(tmp_path / "model.onnx", 300_000)
    store = DirectoryStore(tmp_path / "store")
    signed = store.publish(
        artifact,
        "edge-det",
        "1.0.0",
        signer,
        admitted={"map50": 0.71},
        runtime="onnx",
        classes=["person", "car"],
        input_size=(320, 320),
    )
    return Published(store, signer, public_b64, artifact, signed)
