"""Ed25519 keys, signatures and the check of signatures against a list of trusted keys.

Uses pyca `cryptography` (OpenSSL's Ed25519): a well-kept library, already a dependency of the
TLS tooling, with constant-time verification; no signature code of our own. Public keys travel
as base64 of their 32 raw bytes (one short line for a config file); private keys are PEM
(PKCS#8) files with mode 0600, or the same PEM from the project's secrets mechanism (an
environment variable or a systemd credential), never from the repository.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from configkit.secrets import SecretRef

__all__ = [
    "KeyLoadError",
    "Signature",
    "SignatureError",
    "Signer",
    "Verifier",
    "generate_key",
    "key_id",
    "parse_public_key",
    "public_key_of",
]

_MAX_KEY_FILE_BYTES = 16 * 1024


class SignatureError(Exception):
    """No signature by a trusted key, or a bad signature: the document must not be used."""


class KeyLoadError(ValueError):
    """A key that cannot be read: wrong format, unreadable file, missing secret."""


@dataclass(frozen=True)
class Signature:
    """One signature: the id of the key that made it and the signature bytes in base64."""

    key_id: str
    value_b64: str

    def as_json(self) -> dict[str, str]:
        """The envelope's form: `{"key_id": ..., "value": ...}`."""
        return {"key_id": self.key_id, "value": self.value_b64}


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _public_b64(key: Ed25519PublicKey) -> str:
    return base64.b64encode(_raw_public(key)).decode("ascii")


def key_id(public_b64: str) -> str:
    """The key's id: the first 16 hex digits of the sha256 of its 32 raw bytes."""
    return hashlib.sha256(_raw_public(parse_public_key(public_b64))).hexdigest()[:16]


def parse_public_key(public_b64: str) -> Ed25519PublicKey:
    """An Ed25519 public key from base64 of its 32 raw bytes (`KeyLoadError` when it is not one)."""
    try:
        raw = base64.b64decode(public_b64.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise KeyLoadError(f"public key {public_b64[:20]!r}... is not base64") from None
    if len(raw) != 32:
        raise KeyLoadError(
            f"public key {public_b64[:20]!r} is {len(raw)} bytes; an Ed25519 key is 32 bytes"
        )
    return Ed25519PublicKey.from_public_bytes(raw)


def generate_key(path: str | Path) -> str:
    """Write a new Ed25519 private key to `path` (PEM, mode 0600); return its public key (base64).

    Refuses to overwrite an existing file (a lost signing key cannot be recovered).
    """
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeyLoadError(f"{path} exists; not overwriting a key") from None
    except OSError as error:
        raise KeyLoadError(f"cannot create {path}: {error.strerror}") from None
    with os.fdopen(fd, "wb") as file:
        file.write(pem)
    return _public_b64(key.public_key())


def _private_from_pem(pem: bytes, source: str) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as error:
        raise KeyLoadError(f"{source} is not an unencrypted PEM private key ({error})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyLoadError(f"{source} is a {type(key).__name__}, not an Ed25519 key")
    return key


def _read_key_file(path: str | Path) -> bytes:
    try:
        with open(path, "rb") as file:
            data = file.read(_MAX_KEY_FILE_BYTES + 1)
    except OSError as error:
        raise KeyLoadError(f"cannot read key {path}: {error.strerror}") from None
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise KeyLoadError(f"key file {path} is larger than {_MAX_KEY_FILE_BYTES} bytes")
    return data


def public_key_of(private_path: str | Path) -> str:
    """The public key (base64) of the private key file at `private_path`."""
    key = _private_from_pem(_read_key_file(private_path), str(private_path))
    return _public_b64(key.public_key())


class Signer:
    """Signs documents with one Ed25519 private key."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.public_b64 = _public_b64(key.public_key())
        self.key_id = key_id(self.public_b64)

    @classmethod
    def from_file(cls, path: str | Path) -> Signer:
        """The key in a PEM file (as `generate_key` writes it)."""
        return cls(_private_from_pem(_read_key_file(path), str(path)))

    @classmethod
    def from_secret(cls, ref: SecretRef) -> Signer:
        """The PEM key held by a secret (environment variable or systemd credential)."""
        from configkit.secrets import SecretError

        try:
            pem = ref.resolve()
        except SecretError as error:
            raise KeyLoadError(f"signing key: {error}") from None
        return cls(_private_from_pem(pem.encode("utf-8"), ref.describe()))

    def sign(self, data: bytes) -> Signature:
        """A signature of `data` by this key."""
        value = base64.b64encode(self._key.sign(data)).decode("ascii")
        return Signature(self.key_id, value)


class Verifier:
    """Checks that a document carries a good signature by one of the trusted public keys."""

    def __init__(self, trusted: Sequence[str]) -> None:
        if not trusted:
            raise KeyLoadError("no trusted public keys: nothing could be verified")
        self._keys: dict[str, Ed25519PublicKey] = {}
        for public_b64 in trusted:
            self._keys[key_id(public_b64)] = parse_public_key(public_b64)

    @property
    def key_ids(self) -> list[str]:
        """Ids of the trusted keys."""
        return sorted(self._keys)

    def verify(self, data: bytes, signatures: Sequence[Signature]) -> str:
        """The id of the trusted key whose signature of `data` checks out.

        Raises `SignatureError` saying what failed: no signature at all, none by a trusted key
        (naming the key ids it carries), or a bad signature by a trusted key.
        """
        if not signatures:
            raise SignatureError("unsigned: the document carries no signature")
        bad: list[str] = []
        for signature in signatures:
            key = self._keys.get(signature.key_id)
            if key is None:
                continue
            try:
                raw = base64.b64decode(signature.value_b64, validate=True)
                key.verify(raw, data)
            except (InvalidSignature, binascii.Error, ValueError):
                bad.append(signature.key_id)
                continue
            return signature.key_id
        if bad:
            raise SignatureError(
                f"bad signature by trusted key {', '.join(bad)}: the document was altered "
                "or signed over other content"
            )
        carried = ", ".join(sorted({s.key_id for s in signatures}))
        raise SignatureError(
            f"no signature by a trusted key: signed by {carried}; trusted: "
            f"{', '.join(self.key_ids)}"
        )
