"""Ed25519 keys and signatures: what verifies, and the message for each way it does not."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from configkit.secrets import SecretRef
from fleet.signing import (
    KeyLoadError,
    Signature,
    SignatureError,
    Signer,
    Verifier,
    generate_key,
    key_id,
    public_key_of,
)


def test_generated_key_is_private_and_its_public_key_matches(key: tuple[Path, str]) -> None:
    path, public_b64 = key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert public_key_of(path) == public_b64
    signer = Signer.from_file(path)
    assert signer.public_b64 == public_b64
    assert signer.key_id == key_id(public_b64)
    assert len(signer.key_id) == 16


def test_generate_refuses_to_overwrite(key: tuple[Path, str]) -> None:
    with pytest.raises(KeyLoadError, match="exists; not overwriting"):
        generate_key(key[0])


def test_a_signature_verifies_and_names_its_key(key: tuple[Path, str]) -> None:
    signer = Signer.from_file(key[0])
    signature = signer.sign(b"payload")
    assert Verifier([key[1]]).verify(b"payload", [signature]) == signer.key_id


def test_one_trusted_signature_among_others_is_enough(
    key: tuple[Path, str], tmp_path: Path
) -> None:
    generate_key(tmp_path / "other.pem")
    other = Signer.from_file(tmp_path / "other.pem")
    signatures = [other.sign(b"x"), Signer.from_file(key[0]).sign(b"x")]
    assert Verifier([key[1]]).verify(b"x", signatures) == key_id(key[1])


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("unsigned", "unsigned: the document carries no signature"),
        ("unknown key", "no signature by a trusted key: signed by"),
        ("altered", "bad signature by trusted key"),
        ("garbage", "bad signature by trusted key"),
    ],
)
def test_what_does_not_verify(
    key: tuple[Path, str], tmp_path: Path, case: str, message: str
) -> None:
    signer = Signer.from_file(key[0])
    stranger_pub = generate_key(tmp_path / "stranger.pem")
    stranger = Signer.from_file(tmp_path / "stranger.pem")
    signatures = {
        "unsigned": [],
        "unknown key": [stranger.sign(b"data")],
        "altered": [signer.sign(b"other data")],
        "garbage": [Signature(signer.key_id, "not base64!")],
    }[case]
    with pytest.raises(SignatureError, match=message):
        Verifier([key[1]]).verify(b"data", signatures)
    assert stranger_pub != key[1]


@pytest.mark.parametrize(
    ("trusted", "message"),
    [
        ([], "no trusted public keys"),
        (["not base64 at all"], "is not base64"),
        (["AAAA"], "an Ed25519 key is 32 bytes"),
    ],
)
def test_bad_trusted_keys_are_refused(trusted: list[str], message: str) -> None:
    with pytest.raises(KeyLoadError, match=message):
        Verifier(trusted)


def test_key_from_a_secret(key: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_SIGNING_KEY", key[0].read_text())
    assert Signer.from_secret(SecretRef(env="FLEET_SIGNING_KEY")).public_b64 == key[1]
    monkeypatch.delenv("FLEET_SIGNING_KEY")
    with pytest.raises(KeyLoadError, match="FLEET_SIGNING_KEY is not set"):
        Signer.from_secret(SecretRef(env="FLEET_SIGNING_KEY"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"hello", "not an unencrypted PEM private key"),
        (None, "cannot read key"),
    ],
)
def test_unreadable_private_keys(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "k.pem"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(KeyLoadError, match=message):
        Signer.from_file(path)
