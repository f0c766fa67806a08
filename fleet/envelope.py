"""The signed envelope shared by manifests and rollouts: `{"<kind>": {...}, "signatures": [...]}`.

The envelope is parsed with the standard `json` module under a size cap; the document inside is
validated by its own pydantic model and signed over its canonical JSON, so the signature does
not depend on how the envelope happens to be formatted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Final, TypeVar

from fleet.manifest import ManifestError, canonical_json
from fleet.signing import Signature

__all__ = ["MAX_DOCUMENT_BYTES", "parse_envelope", "seal_envelope"]

MAX_DOCUMENT_BYTES: Final = 256 * 1024
"""A manifest or rollout is a few hundred bytes; anything past 256 KiB is refused unparsed."""

_MAX_SIGNATURES = 16

T = TypeVar("T")


def seal_envelope(kind: str, document: object, signatures: list[Signature]) -> bytes:
    """The envelope as canonical JSON bytes (what is written to the store or the broker)."""
    return canonical_json({kind: document, "signatures": [s.as_json() for s in signatures]})


def _signature(value: object, index: int) -> Signature:
    if (
        not isinstance(value, dict)
        or set(value) != {"key_id", "value"}
        or not all(isinstance(v, str) and 0 < len(v) <= 512 for v in value.values())
    ):
        raise ManifestError(
            f'signatures[{index}] must be {{"key_id": str, "value": str}}, got {value!r:.80}'
        )
    return Signature(value["key_id"], value["value"])


def parse_envelope(
    data: bytes, kind: str, validate: Callable[[object], T], what: str
) -> tuple[T, list[Signature]]:
    """The document and signatures of an envelope; `ManifestError` on anything malformed.

    `validate` turns the parsed JSON value of `kind` into the document (raising
    `ManifestError`); `what` names the document in messages.
    """
    if len(data) > MAX_DOCUMENT_BYTES:
        raise ManifestError(f"{what} is {len(data)} bytes; the limit is {MAX_DOCUMENT_BYTES}")
    if not data:
        raise ManifestError(f"{what} is empty")
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ManifestError(f"{what} is not JSON: {error}") from None
    if not isinstance(value, dict) or set(value) != {kind, "signatures"}:
        keys = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise ManifestError(f'{what} must be {{"{kind}": ..., "signatures": [...]}}, got {keys}')
    raw_signatures = value["signatures"]
    if not isinstance(raw_signatures, list) or len(raw_signatures) > _MAX_SIGNATURES:
        raise ManifestError(f"{what}: signatures must be a list of at most {_MAX_SIGNATURES}")
    signatures = [_signature(item, i) for i, item in enumerate(raw_signatures)]
    return validate(value[kind]), signatures
