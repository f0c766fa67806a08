"""`webhook:` — every event's `edge-alert/v1` payload POSTed as JSON to one HTTP(S) endpoint.

Optional, in memory and best effort: the MQTT outbox is the durable path. Events wait in a bounded
queue (the oldest dropped when it is full) and are sent one per request, in order, retried with
exponential back-off on 5xx, 408, 429 and network errors. Header values and the signing key may
be secret references (`Authorization: {env: WEBHOOK_TOKEN}`, where the variable holds the whole
value, e.g. `Bearer abc123`). With `signing_secret`, each request carries
`X-Edge-Signature: sha256=<hex HMAC-SHA256 of the body>`.
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal, Self
from urllib.parse import urlsplit

from pydantic import AfterValidator, Discriminator, Field, Tag, field_validator, model_validator

from configkit.base import StrictModel
from configkit.secrets import SecretRef
from configkit.yaml_loader import config_error_at
from edge_agent.config.agent import NAME_PATTERN
from edge_agent.config.rules import RULE_PLACES

__all__ = [
    "HEADER_VALUE_PATTERN",
    "HeaderValue",
    "RESERVED_HEADERS",
    "SIGNATURE_HEADER",
    "WebhookConfig",
    "WebhookFilters",
]

SIGNATURE_HEADER: Final = "X-Edge-Signature"
"""Header with `sha256=<hex>`: the HMAC-SHA256 of the request body under `signing_secret`."""

RESERVED_HEADERS: Final = frozenset(
    {"content-type", "content-length", "host", "transfer-encoding", "connection"}
    | {SIGNATURE_HEADER.lower()}
)
"""Headers the sink sets itself (lower case); `headers` may not set them."""

WebhookPhase = Literal["start", "update", "end", "retract"]
"""The `phase` values of `edge-alert/v1` (see `edge_agent.alerts.payload`)."""

_HEADER_NAME = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$"  # an RFC 9110 token
HEADER_VALUE_PATTERN: Final = r"^[\t\x20-\x7e]*$"
"""Printable ASCII and tabs: no line break, which would inject headers, and nothing that HTTP/1.1
would need to encode."""


def _check_header_text(value: str) -> str:
    if re.fullmatch(HEADER_VALUE_PATTERN, value) is None:
        raise ValueError("a header value holds printable ASCII and tabs only (no line breaks)")
    return value


def _header_value_kind(value: object) -> str:
    return "secret" if isinstance(value, dict | SecretRef) else "text"


HeaderValue = Annotated[
    Annotated[str, Field(max_length=8192), AfterValidator(_check_header_text), Tag("text")]
    | Annotated[SecretRef, Tag("secret")],
    Discriminator(_header_value_kind),
]
"""A header value: the text itself, or a secret reference (a mapping) that holds it."""


class WebhookFilters(StrictModel):
    """Which events are sent: an event must match every list that is not empty (empty: all)."""

    rules: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(
        default_factory=list, max_length=256, description="Rule names to send; empty: all rules."
    )
    kinds: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Rule kinds to send (`zone_enter`, `loiter`, ...); empty: all kinds.",
    )
    phases: list[WebhookPhase] = Field(
        default_factory=list,
        max_length=4,
        description="Phases to send (`start`, `update`, `end`, `retract`); empty: all phases.",
    )

    @field_validator("kinds")
    @classmethod
    def _check_kinds(cls, kinds: list[str]) -> list[str]:
        unknown = [kind for kind in kinds if kind not in RULE_PLACES]
        if unknown:
            known = ", ".join(sorted(RULE_PLACES))
            raise ValueError(f"unknown rule kind(s) {', '.join(unknown)}; known: {known}")
        return kinds

    def accepts(self, rule: str, kind: str, phase: str) -> bool:
        """Whether an event of `rule` (of `kind`) in `phase` is to be sent."""
        return (
            (not self.rules or rule in self.rules)
            and (not self.kinds or kind in self.kinds)
            and (not self.phases or phase in self.phases)
        )


class WebhookConfig(StrictModel):
    """An HTTP(S) endpoint that receives each event's JSON payload in a POST, one per request."""

    url: str = Field(
        pattern=r"^https?://\S+$",
        max_length=2048,
        description=(
            "Endpoint the events are POSTed to (`http://` or `https://`; HTTPS is verified "
            "against the system's CA roots). Only its scheme and host appear in logs. Redirects "
            "are not followed. A proxy is used only where the environment names one "
            "(`https_proxy` / `http_proxy`, minus `no_proxy`), as with curl."
        ),
    )
    headers: dict[Annotated[str, Field(pattern=_HEADER_NAME)], HeaderValue] = Field(
        default_factory=dict,
        max_length=64,
        description=(
            "Extra request headers; a value may be a secret reference (`{env: VAR}` or "
            "`{credential: NAME}`) holding the whole value, e.g. `Bearer abc123`. Content-Type, "
            "Content-Length, Host, Transfer-Encoding, Connection and X-Edge-Signature are set "
            "by the agent."
        ),
    )
    filters: WebhookFilters = Field(
        default_factory=WebhookFilters, description="Which events to send (default: all)."
    )
    timeout_s: float = Field(
        default=5.0,
        gt=0.0,
        le=120.0,
        description="Socket timeout of a request (connect, and each read of the answer).",
    )
    max_queue: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="Events waiting to be sent, at most; beyond it the oldest is dropped.",
    )
    max_attempts: int = Field(
        default=5,
        ge=1,
        le=100,
        description="Tries per event, the first included, before it is given up as failed.",
    )
    min_backoff_s: float = Field(
        default=1.0,
        ge=0.001,
        le=3_600.0,
        description="Wait before the first retry; doubled before each further one.",
    )
    max_backoff_s: float = Field(
        default=30.0,
        ge=0.001,
        le=3_600.0,
        description="Longest wait between tries; also caps a server's `Retry-After`.",
    )
    signing_secret: SecretRef | None = Field(
        default=None,
        description=(
            "Key of an HMAC-SHA256 of each body, sent as `X-Edge-Signature: sha256=<hex>` "
            "so the receiver can check the sender; none: unsigned."
        ),
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if not parts.hostname:
            raise ValueError("the URL needs a host")
        if parts.username is not None or parts.password is not None:
            raise ValueError("no credentials in the URL: put them in `headers` (secret reference)")
        if parts.fragment:
            raise ValueError("a URL fragment (`#...`) is never sent: remove it")
        try:
            parts.port  # noqa: B018 (raises ValueError on a bad port)
        except ValueError as error:
            raise ValueError(f"bad port: {error}") from None
        return url

    @model_validator(mode="after")
    def _check_headers_and_backoff(self) -> Self:
        seen: set[str] = set()
        for name in self.headers:
            lower = name.lower()
            if lower in RESERVED_HEADERS:
                raise config_error_at(("headers", name), f"header {name} is set by the agent")
            if lower in seen:
                raise config_error_at(("headers", name), f"header {name} is given twice")
            seen.add(lower)
        if self.min_backoff_s > self.max_backoff_s:
            raise config_error_at(
                ("min_backoff_s",),
                f"min_backoff_s ({self.min_backoff_s}) must not exceed "
                f"max_backoff_s ({self.max_backoff_s})",
            )
        return self
