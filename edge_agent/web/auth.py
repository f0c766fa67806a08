"""Who may see the status page: HTTP basic auth or a bearer token, compared in constant time."""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from edge_agent.config.web import WebAuthConfig, WebBasicAuth

__all__ = ["REALM", "Authenticator"]

REALM = "edge-agent"


@dataclass(frozen=True, slots=True)
class Authenticator:
    """Checks an `Authorization` header against the configured credentials (none: all pass).

    `scheme` is `basic` or `bearer`; `expected` the exact header value that passes, e.g.
    `Basic dXNlcjpwYXNz`, so a check is one constant-time comparison.
    """

    scheme: str | None = None
    expected: bytes = field(default=b"", repr=False)  # never in logs

    @classmethod
    def from_config(
        cls,
        auth: WebAuthConfig | None,
        environ: Mapping[str, str] | None = None,
        credentials_dir: str | Path | None = None,
    ) -> Authenticator:
        """Resolve the configured secret now; raises `SecretError` when it is unavailable."""
        if auth is None:
            return cls()
        if isinstance(auth, WebBasicAuth):
            password = auth.password.resolve(environ, credentials_dir)
            pair = f"{auth.username}:{password}".encode()
            return cls("basic", b"Basic " + base64.b64encode(pair))
        token = auth.token.resolve(environ, credentials_dir)
        return cls("bearer", b"Bearer " + token.encode("utf-8"))

    @property
    def required(self) -> bool:
        """Whether requests need credentials at all."""
        return self.scheme is not None

    def allows(self, header: str | None) -> bool:
        """Whether the `Authorization` header value `header` passes."""
        if self.scheme is None:
            return True
        if header is None:
            return False
        scheme, _, credentials = header.strip().partition(" ")
        if self.scheme == "basic" and scheme.lower() == "basic":
            try:  # re-encode, so padding or case variants of the same pair compare equal
                pair = base64.b64decode(credentials.strip(), validate=True)
            except (binascii.Error, ValueError):
                return False
            return hmac.compare_digest(b"Basic " + base64.b64encode(pair), self.expected)
        if self.scheme == "bearer" and scheme.lower() == "bearer":
            return hmac.compare_digest(
                b"Bearer " + credentials.strip().encode("utf-8", "replace"), self.expected
            )
        return False

    def challenge(self) -> str:
        """The `WWW-Authenticate` value of a 401."""
        if self.scheme == "basic":
            return f'Basic realm="{REALM}", charset="UTF-8"'
        return f'Bearer realm="{REALM}"'
