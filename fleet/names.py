"""Patterns for names that end up in store paths and MQTT topics."""

from __future__ import annotations

import re
from typing import Final

NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""Model names, versions, groups, agent ids: no `/`, `+`, `#`, spaces, and no leading dot."""

SHA256_PATTERN: Final = r"^[0-9a-f]{64}$"
"""A sha256 digest as 64 lower-case hex digits."""

_NAME = re.compile(NAME_PATTERN)
_SHA256 = re.compile(SHA256_PATTERN)


def check_name(value: str, what: str) -> str:
    """`value` when it is a valid name, else `ValueError` naming `what` and the rule."""
    if not _NAME.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} is not a valid name: 1-64 of A-Z a-z 0-9 _ . -, "
            "starting with a letter or digit"
        )
    return value


def check_sha256(value: str, what: str = "sha256") -> str:
    """`value` when it is 64 lower-case hex digits, else `ValueError`."""
    if not _SHA256.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not a sha256 digest (64 lower-case hex digits)")
    return value
