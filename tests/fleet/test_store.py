"""Publishing into a directory store, and parsing what it holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.manifest import ManifestError, ModelManifest, ModelRef
from fleet.signing import SignatureError, Signer, Verifier, generate_key
from fleet.store import (
    DirectoryStore,
    SignedManifest,
    StoreError,
    blob_path,
    manifest_path,
    sha256_of_file,
)

from .conftest import Published, write_artifact

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_publish_lays_out_the_store(published: Published) -> None:
    root = published.store.root
    manifest = published.signed.manifest
    sha256, size = sha256_of_file(published.artifact)
    assert manifest.sha256 == sha256 and manifest.bytes == size
    assert (root / blob_path(sha256)).read_bytes() == published.artifact.read_bytes()
    stored = (root / manifest_path("edge-det", "1.0.0")).read_bytes()
    assert SignedManifest.parse(stored) == published.signed
    assert json.loads((root / "models/edge-det/index.json").read_text()) == {
        "name": "edge-det",
        "versions": ["1.0.0"],
    }
    assert manifest.filename == "edge-det-1.0.0.onnx"
    assert manifest.admitted == {"map50": 0.71}
    assert str(manifest.ref) == f"edge-det:1.0.0@{sha256[:12]}"
    assert published.signed.verified(Verifier([published.public_b64])) == manifest


def test_the_same_publish_again_is_a_no_op(published: Published) -> None:
    again = published.store.publish(
        published.artifact,
        "edge-det",
        "1.0.0",
        published.signer,
        runtime="onnx",
        classes=["person", "car"],
        input_size=(320, 320),
    )
    assert again == published.signed


def test_a_taken_version_with_another_artifact_is_refused(
    published: Published, tmp_path: Path
) -> None:
    other = write_artifact(tmp_path / "other.onnx", 1000, seed=7)
    with pytest.raises(StoreError, match="already published with sha256"):
        published.store.publish(
            other,
            "edge-det",
            "1.0.0",
            published.signer,
            runtime="onnx",
            classes=[],
            input_size=(320, 320),
        )


def test_versions_are_listed_newest_last(published: Published, tmp_path: Path) -> None:
    other = write_artifact(tmp_path / "other.onnx", 1000, seed=7)
    signed = published.store.publish(
        other,
        "edge-det",
        "1.1.0",
        published.signer,
        runtime="onnx",
        classes=["person", "car"],
        input_size=(320, 320),
        derived_from=published.signed.manifest.sha256,
    )
    assert published.store.versions("edge-det") == ["1.0.0", "1.1.0"]
    assert published.store.names() == ["edge-det"]
    assert signed.manifest.derived_from == published.signed.manifest.sha256


def test_publish_reads_runtime_classes_and_input_from_the_model(
    tmp_path: Path, key: tuple[Path, str]
) -> None:
    store = DirectoryStore(tmp_path / "store")
    signer = Signer.from_file(key[0])
    tflite = store.publish(MODELS / "edge/edge-yolov5n-320-int8.tflite", "e", "1", signer)
    assert tflite.manifest.runtime == "litert"
    assert tflite.manifest.input == (320, 320)
    onnx = MODELS / "edge/edge-yolov5n-320.onnx"
    with pytest.raises(StoreError, match="dynamic input size"):
        store.publish(onnx, "o", "1", signer)
    signed = store.publish(onnx, "o", "1", signer, input_size=(320, 320))
    assert signed.manifest.classes == ["person", "car", "truck", "forklift"]


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [("a/b", "1", "model name"), ("a", "../x", "model version"), ("", "1", "model name")],
)
def test_bad_names_are_refused(published: Published, name: str, version: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        published.store.publish(published.artifact, name, version, published.signer)


def test_a_missing_or_unknown_model_file_is_refused(published: Published, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="model file not found"):
        published.store.publish(tmp_path / "nope.onnx", "x", "1", published.signer)
    odd = write_artifact(tmp_path / "model.bin", 10)
    with pytest.raises(ManifestError, match="unknown model format"):
        published.store.publish(odd, "x", "1", published.signer)


def test_a_manifest_signed_by_a_stranger_is_refused(published: Published, tmp_path: Path) -> None:
    generate_key(tmp_path / "stranger.pem")
    forged = SignedManifest.sign(
        published.signed.manifest, Signer.from_file(tmp_path / "stranger.pem")
    )
    with pytest.raises(SignatureError, match="no signature by a trusted key"):
        forged.verified(Verifier([published.public_b64]))


def test_an_altered_manifest_is_refused(published: Published) -> None:
    document = json.loads(published.signed.to_bytes())
    document["manifest"]["sha256"] = "0" * 64
    altered = SignedManifest.parse(json.dumps(document).encode())
    with pytest.raises(SignatureError, match="bad signature by trusted key"):
        altered.verified(Verifier([published.public_b64]))


def _document(published: Published, **changes: object) -> bytes:
    document = json.loads(published.signed.to_bytes())
    document["manifest"].update(changes)
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: b"", "is empty"),
        (lambda p: b"\xff\xfe", "not JSON"),
        (lambda p: b"[1, 2]", "must be"),
        (lambda p: b'{"manifest": {}}', "must be"),
        (lambda p: b" " * 300_000, "the limit is"),
        (lambda p: _document(p, sha256="xyz"), "sha256"),
        (lambda p: _document(p, bytes=-1), "bytes"),
        (lambda p: _document(p, filename="model.exe"), "suffix must be one of"),
        (lambda p: _document(p, input=[320]), "input"),
        (lambda p: _document(p, input=[0, 320]), "input"),
        (lambda p: _document(p, runtime="tensorrt"), "runtime"),
        (lambda p: _document(p, admitted={"map": "high"}), "admitted"),
        (lambda p: _document(p, created_at="yesterday"), "not an ISO 8601 time"),
        (lambda p: _document(p, extra=1), "extra"),
        (lambda p: _document(p, name="../etc"), "name"),
    ],
)
def test_malformed_documents_get_a_clear_error(
    published: Published, mutate: object, message: str
) -> None:
    assert callable(mutate)
    with pytest.raises(ManifestError, match=message):
        SignedManifest.parse(mutate(published))


def test_malformed_signature_entries(published: Published) -> None:
    document = json.loads(published.signed.to_bytes())
    document["signatures"] = [{"key_id": "x"}]
    with pytest.raises(ManifestError, match=r"signatures\[0\] must be"):
        SignedManifest.parse(json.dumps(document).encode())


def test_model_ref_checks_its_fields() -> None:
    assert str(ModelRef("m", "2", "ab" * 32)) == "m:2@abababababab"
    with pytest.raises(ValueError, match="sha256"):
        ModelRef("m", "2", "AB" * 32)
    with pytest.raises(ValueError, match="model name"):
        ModelRef("m#", "2", "ab" * 32)


def test_canonical_bytes_do_not_depend_on_formatting(published: Published) -> None:
    manifest = published.signed.manifest
    pretty = json.dumps(manifest.model_dump(mode="json"), indent=4)
    again = ModelManifest.from_json_value(json.loads(pretty))
    assert again.canonical_bytes() == manifest.canonical_bytes()
    assert b" " not in manifest.canonical_bytes().replace(b"edge-det", b"")
