"""`web:` — the agent's local status page: live annotated frames, camera states, recent events.

Off by default, and bound to loopback when on. A host other than loopback needs `auth` (HTTP basic
auth for browsers, or a bearer token for scripts and reverse proxies), because the page shows
what the cameras see: exposing it unauthenticated takes an explicit
`allow_unauthenticated_remote: true`. The server speaks plain HTTP; put a TLS-terminating
reverse proxy in front of it to reach it across an untrusted network (basic auth sends the
password in clear otherwise).

The limits below bound what one client can make the agent hold: a request head and body of a
known size, read within `client_timeout_s`, at most `max_concurrent_requests` at once.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from configkit.base import StrictModel
from configkit.secrets import SecretRef
from configkit.yaml_loader import config_error_at

__all__ = ["WebAuthConfig", "WebBasicAuth", "WebConfig", "WebTokenAuth", "is_loopback_host"]


class WebBasicAuth(StrictModel):
    """HTTP basic auth: the browser asks for a user name and password."""

    type: Literal["basic"] = Field(description="HTTP basic auth.")
    username: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^[^:\x00-\x1f]+$",
        description="User name (no `:` or control characters).",
    )
    password: SecretRef = Field(description="Where the password comes from.")


class WebTokenAuth(StrictModel):
    """A bearer token in `Authorization: Bearer <token>` (scripts, a reverse proxy that adds
    it); a browser cannot open the page by itself with it."""

    type: Literal["bearer"] = Field(description="Bearer token.")
    token: SecretRef = Field(description="Where the token comes from.")


WebAuthConfig = Annotated[WebBasicAuth | WebTokenAuth, Field(discriminator="type")]
"""`basic` or `bearer`, chosen by `type`."""


HostName = Annotated[
    str,
    Field(min_length=1, max_length=255, pattern=r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.:_-]+)$"),
]
"""A DNS name or an IP address (IPv6 with or without brackets), without a port."""


def is_loopback_host(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine (`localhost`, 127/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


class WebConfig(StrictModel):
    """The status page's HTTP server (hypercorn in a thread of its own, `web.server`)."""

    enabled: bool = Field(default=False, description="Serve the status page.")
    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        max_length=255,
        description="Address to bind; loopback by default. Another address needs `auth`.",
    )
    port: int = Field(
        default=8480, ge=0, le=65535, description="TCP port to bind; 0 picks a free port (tests)."
    )
    auth: WebAuthConfig | None = Field(
        default=None,
        description="Basic auth or a bearer token on every route but `/healthz`; none: open.",
    )
    allow_unauthenticated_remote: bool = Field(
        default=False,
        description="Allow a non-loopback `host` without `auth` (the page shows the cameras).",
    )
    recent_events: int = Field(
        default=50, ge=1, le=1_000, description="Events the page lists, newest first."
    )
    jpeg_quality: int = Field(
        default=80, ge=10, le=100, description="JPEG quality of the live frames."
    )
    frame_max_width_px: int = Field(
        default=1280,
        ge=160,
        le=7_680,
        description="Live frames wider than this are scaled down (after drawing), for bandwidth.",
    )
    client_timeout_s: float = Field(
        default=10.0,
        gt=0.0,
        le=300.0,
        description=(
            "Time a client has to send a request's head (from connecting, or from its previous "
            "answer on a kept-alive connection) and, separately, its body, and the longest it "
            "may leave the server's writes unread; then it is disconnected."
        ),
    )
    max_request_head_bytes: int = Field(
        default=16_384,
        ge=1_024,
        le=1_048_576,
        description="Largest request line plus headers; a longer head is answered 431 or 400.",
    )
    max_request_body_bytes: int = Field(
        default=1_024,
        ge=0,
        le=1_048_576,
        description=(
            "Largest request body (only `POST /api/reload` takes one, an optional JSON "
            "object); a larger declared length is refused 413 before any of it is read."
        ),
    )
    max_concurrent_requests: int = Field(
        default=32,
        ge=1,
        le=1_024,
        description="Requests handled at once; more are answered 503 at once.",
    )
    allowed_hosts: list[HostName] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Host names (no port) requests may name in `Host`. Empty: any, except that an "
            "unauthenticated page on loopback only answers loopback names (`localhost`, "
            "127.0.0.1, ::1), so a web page cannot reach it by DNS rebinding."
        ),
    )

    @model_validator(mode="after")
    def _check_exposure(self) -> Self:
        if (
            self.auth is None
            and not self.allow_unauthenticated_remote
            and not is_loopback_host(self.host)
        ):
            raise config_error_at(
                ("host",),
                f"the status page on {self.host!r} would show the cameras to the network: set "
                "`auth`, bind a loopback address, or set `allow_unauthenticated_remote: true`",
            )
        return self
