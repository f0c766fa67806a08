"""`WebhookSink`: each event's `edge-alert/v1` payload POSTed as JSON to an HTTP(S) endpoint.

An `AlertSink` (see `sinks`). `deliver` runs in the frame loop, so it only filters, encodes and
queues; a worker thread sends one event per request, oldest first, and the next only once the
previous one is settled, so the receiver sees them in order.

Each request is a POST of the payload as compact UTF-8 JSON (the same bytes as the MQTT message)
with `Content-Type: application/json`, `User-Agent: edge-agent/<version>`, the configured headers
and, with `signing_secret`, `X-Edge-Signature: sha256=<hex>`: the HMAC-SHA256 of the exact body
bytes. Receivers compute it over the raw body before parsing and compare in constant time.

Answers:

* 2xx: delivered.
* 408, 429, 5xx, and no answer at all (refused, reset, timed out, TLS failure): tried again after
  `min_backoff_s`, doubling up to `max_backoff_s`, or after the answer's `Retry-After` (seconds;
  capped at `max_backoff_s`), up to `max_attempts` tries in all; then given up as failed.
* any other 4xx, and 3xx (redirects are not followed: a POST redirected would lose its body, or
  carry its `Authorization` to another host): failed at once, logged, not retried.

Delivery is best effort and at least once within the tries: a request that timed out after the
receiver got it is sent again, so receivers dedupe on `event_id` + `phase` (+ `timestamp` for
`update`). The queue lives in memory: events still queued when the agent stops, or dropped as
the oldest of a full queue, are counted in `stats().dropped` and not sent. The durable path is
MQTT with its outbox.

Proxies: as with curl, a proxy is used only where the environment names one: `https_proxy` for an
`https://` URL, `http_proxy` for `http://` (lower case first, then upper case), unless `no_proxy`
lists the host (`*`, names with their subdomains, `host:port`, IP addresses and CIDR ranges).
Otherwise the sink connects directly: an agent on a LAN should not route events to a local
receiver through a proxy it was never told about.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import importlib.metadata
import ipaddress
import json
import logging
import math
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Final, Literal
from urllib.parse import urlsplit

from configkit.secrets import SecretError, SecretRef
from edge_agent.alerts.sinks import EventContext
from edge_agent.config.webhook import HEADER_VALUE_PATTERN, SIGNATURE_HEADER, WebhookConfig

__all__ = [
    "WebhookSink",
    "WebhookStats",
    "backoff_s",
    "bypasses_proxy",
    "classify_status",
    "parse_retry_after",
    "proxy_for",
    "signature",
]

logger = logging.getLogger(__name__)

Verdict = Literal["delivered", "retry", "failed"]
"""What one HTTP answer means for its event."""

_RETRYABLE_STATUSES: Final = frozenset({408, 429})
_ERROR_BODY_CHARS: Final = 200  # of an error answer's body, in the log line
_MAX_READ_BYTES: Final = 64 * 1024  # of an answer's body: enough to log, never a memory sink
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_HOST_PORT: Final = re.compile(r"^(?P<host>[^:]+|\[[^]]+\]):(?P<port>\d+)$")


@dataclass(frozen=True, slots=True)
class WebhookStats:
    """Counts since the sink was made: events `sent` (2xx), `failed` (given up or refused),
    `dropped` (oldest of a full queue, or unsent at close), `retried` (tries after the first),
    and `queued` now."""

    sent: int = 0
    failed: int = 0
    dropped: int = 0
    retried: int = 0
    queued: int = 0


@dataclass(frozen=True, slots=True)
class _Answer:
    verdict: Verdict
    detail: str  # for the log: status and reason, never a header value
    retry_after_s: float | None = None


def classify_status(status: int) -> Verdict:
    """What an HTTP status means: 2xx delivered; 408, 429 and 5xx retry; anything else failed."""
    if 200 <= status < 300:
        return "delivered"
    if status in _RETRYABLE_STATUSES or 500 <= status < 600:
        return "retry"
    return "failed"


def backoff_s(retry: int, min_s: float, max_s: float) -> float:
    """Wait before retry number `retry` (1 for the second try): `min_s` doubled each time,
    at most `max_s`."""
    if retry < 1:
        raise ValueError(f"retry must be at least 1, got {retry}")
    return min(max_s, min_s * 2.0 ** min(retry - 1, 64))


def parse_retry_after(value: str | None) -> float | None:
    """Seconds of a `Retry-After` header; None when absent or not a number of seconds (an HTTP
    date is not honoured: the back-off applies)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if not math.isfinite(seconds) or seconds < 0.0:
        return None
    return seconds


def signature(body: bytes, key: bytes) -> str:
    """The `X-Edge-Signature` value of `body`: `sha256=` and the hex HMAC-SHA256 under `key`."""
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def proxy_for(url: str, environ: Mapping[str, str]) -> str | None:
    """The proxy that `environ` names for `url` (see the module docstring), or None: direct."""
    parts = urlsplit(url)
    proxy = _env(environ, f"{parts.scheme}_proxy")
    if proxy is None:
        return None
    host = parts.hostname or ""
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)
    if bypasses_proxy(host, port, _env(environ, "no_proxy") or ""):
        return None
    return proxy


def bypasses_proxy(host: str, port: int, no_proxy: str) -> bool:
    """Whether `no_proxy` (comma-separated: `*`, `example.com` or `.example.com` with its
    subdomains, `host:port`, IP addresses, CIDR ranges) says to reach `host:port` directly."""
    host = host.lower().strip("[]")
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if _ip_in(host, entry):
            return True
        match = _HOST_PORT.match(entry)
        if match is not None:
            if int(match["port"]) != port:
                continue
            entry = match["host"]
        name = entry.strip("[]").lstrip(".")
        if host == name or host.endswith("." + name) or _ip_in(host, name):
            return True
    return False


def _ip_in(host: str, entry: str) -> bool:
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name.lower())
    if value is None:
        value = environ.get(name.upper())
    return value or None


def _package_version() -> str:
    try:
        return importlib.metadata.version("edge-cloud-video-analytics")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


_VERSION: Final = _package_version()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Turns every 3xx into an `HTTPError` (see the module docstring)."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


class WebhookSink:
    """POSTs event payloads to one URL from a worker thread (see the module docstring)."""

    def __init__(
        self,
        config: WebhookConfig,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        """Set up (not start) a sink for `config`.

        Secret references (header values, the signing key) and the proxy variables are read
        from `environ` (default `os.environ`) now; a secret that cannot be resolved raises
        `SecretError`. `clock` times `close`; `sleep` waits between tries (default: a wait that
        `close` cuts short).
        """
        env: Mapping[str, str] = os.environ if environ is None else environ
        self.config = config
        self._headers = _static_headers(config, env)
        self._signing_key = (
            config.signing_secret.resolve(environ=env).encode()
            if config.signing_secret is not None
            else None
        )
        parts = urlsplit(config.url)
        proxy = proxy_for(config.url, env)
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({} if proxy is None else {parts.scheme: proxy}),
            _NoRedirects(),
        )
        self._where = f"{parts.scheme}://{parts.netloc}"  # path and query may hold a token
        self._clock = clock
        self._stop = threading.Event()
        self._sleep = sleep if sleep is not None else self._stop.wait
        self._lock = threading.Condition()
        self._queue: deque[bytes] = deque()
        self._busy = False  # the worker holds an event taken from the queue
        self._dropping = False  # dropped since the last event sent: warn once per episode
        self._counts = {"sent": 0, "failed": 0, "dropped": 0, "retried": 0}
        self._worker: threading.Thread | None = None
        self._closed = False

    def __repr__(self) -> str:
        """The sink and where it sends (scheme and host only)."""
        return f"WebhookSink({self._where})"

    def start(self) -> None:
        """Start the worker thread; events delivered before are sent then."""
        with self._lock:
            if self._closed:
                raise RuntimeError("WebhookSink is closed")
            if self._worker is not None:
                return
            self._worker = threading.Thread(target=self._run, name="alert-webhook", daemon=True)
            self._worker.start()

    def deliver(self, context: EventContext, payload: Mapping[str, object]) -> None:
        """`AlertSink`: queue `payload` unless the filters leave `context.event` out; never
        blocks. A full queue drops its oldest event."""
        event = context.event
        if not self.config.filters.accepts(event.rule, event.kind, event.phase):
            return
        body = json.dumps(dict(payload), separators=(",", ":")).encode()
        with self._lock:
            if self._closed:
                raise RuntimeError("WebhookSink is closed")
            if len(self._queue) >= self.config.max_queue:
                self._queue.popleft()
                self._counts["dropped"] += 1
                if not self._dropping:
                    self._dropping = True
                    logger.warning(
                        "webhook %s: queue full (%d events), dropping the oldest",
                        self._where,
                        self.config.max_queue,
                    )
            self._queue.append(body)
            self._lock.notify_all()

    def stats(self) -> WebhookStats:
        """The counts so far (see `WebhookStats`)."""
        with self._lock:
            return WebhookStats(**self._counts, queued=len(self._queue))

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued for up to `timeout_s`, then stop; returns within about
        `timeout_s` even if the server is gone. Events left are counted as dropped; a request
        still in flight then ends in the background (at most `timeout_s` of the config)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            deadline = self._clock() + timeout_s
            while self._worker is not None and (self._queue or self._busy):
                remaining = deadline - self._clock()
                if remaining <= 0.0:
                    break
                self._lock.wait(remaining)
            left = len(self._queue)
            if left:
                self._queue.clear()
                self._counts["dropped"] += left
                logger.warning("webhook %s: closing with %d event(s) unsent", self._where, left)
            self._stop.set()
            self._lock.notify_all()
        if self._worker is not None:
            self._worker.join(max(0.0, deadline - self._clock()))

    def __enter__(self) -> WebhookSink:
        """Start and return the sink."""
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close the sink."""
        self.close()

    # -- worker --------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._stop.is_set():
                    self._lock.wait()
                if self._stop.is_set():
                    return
                body = self._queue.popleft()
                self._busy = True
            try:
                outcome = self._send(body)
            except Exception:  # a bug must not end the worker: later events still go out
                logger.exception("webhook %s: sending an event failed", self._where)
                outcome = "failed"
            with self._lock:
                self._busy = False
                self._counts[outcome] += 1
                if outcome == "sent":
                    self._dropping = False
                self._lock.notify_all()

    def _send(self, body: bytes) -> Literal["sent", "failed", "dropped"]:
        """Try `body` up to `max_attempts` times; `dropped` when the sink closed meanwhile."""
        config = self.config
        answer = self._attempt(body)
        for retry in range(1, config.max_attempts):
            if answer.verdict != "retry":
                break
            delay = backoff_s(retry, config.min_backoff_s, config.max_backoff_s)
            if answer.retry_after_s is not None:
                delay = min(answer.retry_after_s, config.max_backoff_s)
            if self._stop.is_set():
                return "dropped"
            logger.info(
                "webhook %s: %s; try %d of %d in %.3g s",
                self._where,
                answer.detail,
                retry + 1,
                config.max_attempts,
                delay,
            )
            self._sleep(delay)
            if self._stop.is_set():
                return "dropped"
            with self._lock:
                self._counts["retried"] += 1
            answer = self._attempt(body)
        if answer.verdict == "delivered":
            return "sent"
        if answer.verdict == "retry":
            logger.warning(
                "webhook %s: event given up after %d tries: %s",
                self._where,
                config.max_attempts,
                answer.detail,
            )
        else:
            logger.warning("webhook %s: event refused, not retried: %s", self._where, answer.detail)
        return "failed"

    def _attempt(self, body: bytes) -> _Answer:
        headers = dict(self._headers)
        if self._signing_key is not None:
            headers[SIGNATURE_HEADER] = signature(body, self._signing_key)
        request = urllib.request.Request(  # noqa: S310 (the config allows http and https only)
            self.config.url, data=body, headers=headers, method="POST"
        )
        try:
            with self._opener.open(request, timeout=self.config.timeout_s) as response:
                response.read(_MAX_READ_BYTES)
                return _Answer("delivered", f"HTTP {response.status}")
        except urllib.error.HTTPError as error:
            with error:
                excerpt = _excerpt(error.read(_MAX_READ_BYTES))
            detail = f"HTTP {error.code} {error.reason}" + (f": {excerpt}" if excerpt else "")
            retry_after = parse_retry_after(error.headers.get("Retry-After"))
            return _Answer(classify_status(error.code), detail, retry_after)
        except urllib.error.URLError as error:
            return _Answer("retry", f"no answer: {error.reason}")
        except (http.client.HTTPException, OSError) as error:
            return _Answer("retry", f"no answer: {type(error).__name__}: {error}")


def _static_headers(config: WebhookConfig, environ: Mapping[str, str]) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "User-Agent": f"edge-agent/{_VERSION}"}
    for name, value in config.headers.items():
        if isinstance(value, SecretRef):
            resolved = value.resolve(environ=environ)
            if re.fullmatch(HEADER_VALUE_PATTERN, resolved) is None:
                raise SecretError(
                    f"{value.describe()} (header {name}) holds a line break or a character "
                    "that is not printable ASCII"
                )
            value = resolved
        headers[name] = value
    return headers


def _excerpt(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    text = " ".join(text.split())  # one log line
    return text if len(text) <= _ERROR_BODY_CHARS else text[:_ERROR_BODY_CHARS] + "..."
