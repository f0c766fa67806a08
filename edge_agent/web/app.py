"""`StatusApp`: the status page's routes as an ASGI application, each request checked from its
head before any of its body is read.

The HTTP parsing, framing and connection timeouts are the server's (hypercorn and h11, see
`server.py`); what this module decides, in this order, from the request head alone:

1. at most `max_concurrent_requests` at once (503), a head within `max_request_head_bytes`
   (431), one `Host`, `Authorization`, `Origin`, `Content-Type` and `Content-Length` each and not
   both `Content-Length` and `Transfer-Encoding` (400);
2. `/healthz` (GET or HEAD) answers `ok` to anyone; then a `Host` the page answers to (400, see
   `WebConfig.allowed_hosts`: a page on loopback without auth is not reachable by DNS rebinding);
3. only GET, HEAD and POST (405, with `Allow`); no body on GET or HEAD (400); a declared body over
   `max_request_body_bytes` (413);
4. credentials (401);
5. the route: an unknown path is 404, a known one with another method 405.

`POST /api/reload`, the one route that changes anything, also needs the same origin: an `Origin`
header, when sent, must name this host (browsers send it on every POST, `no-cors` fetches and
form posts included), and `Sec-Fetch-Site`, when sent, must be `same-origin` or `none`; a body,
if any, must be `application/json` (which a cross-origin page cannot send without a CORS
preflight, and none is ever allowed) holding one JSON object. Its body is read only then, up to
the limit, within `client_timeout_s`.

Every answer that leaves part of a request body unread says `Connection: close`, and the server
closes the connection: an unread body is never parsed as a next request. Work that blocks (the
report, JPEG encoding, file reads, the reload) runs in a small thread pool, so one slow request
never holds the event loop; every write waits at most `client_timeout_s` for a client that does
not read.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

from edge_agent.config.web import WebConfig, is_loopback_host
from edge_agent.web.auth import Authenticator
from edge_agent.web.live import LiveView
from edge_agent.web.page import CONTENT_SECURITY_POLICY, render_page
from edge_agent.web.report import safe_relative_path

__all__ = ["MEDIA_TYPES", "Message", "Receive", "Scope", "Send", "StatusApp", "media_type"]

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
T = TypeVar("T")

MEDIA_TYPES = {
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".png": "image/png",
    ".webp": "image/webp",
    ".mp4": "video/mp4",
    ".webm": "video/webm",
    ".mkv": "video/x-matroska",
    ".json": "application/json",
}
_CAMERA_PREFIX, _FRAME_SUFFIX = "/api/cameras/", "/frame.jpg"
_MEDIA_PREFIX = "/media/"
_RELOAD = "/api/reload"
_READ_ROUTES = ("/", "/api/status")
_READ_METHODS, _ALLOWED_METHODS = ("GET", "HEAD"), ("GET", "HEAD", "POST")
_SINGLE_HEADERS = frozenset(
    {"host", "authorization", "origin", "content-type", "content-length", "transfer-encoding"}
)
_MEDIA_CHUNK_BYTES = 65_536
_MEDIA_MAX_AGE_S = 3_600  # media files never change once written (the store writes atomically)
# a malformed, oversized or too slow request: nothing after it on the connection is trusted
_CLOSING_STATUSES = frozenset({400, 408, 413, 431})
_SAME_SITE_FETCHES = frozenset({"same-origin", "none"})
_BASE_HEADERS = (
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    # no other site may embed the frames or media (<img> from a page elsewhere)
    ("cross-origin-resource-policy", "same-origin"),
)


def media_type(path: Path) -> str:
    """The Content-Type of a media file, by its suffix (`application/octet-stream` if unknown)."""
    return MEDIA_TYPES.get(path.suffix.lower(), "application/octet-stream")


class StatusBackend(Protocol):
    """What the routes read (`StatusServer`)."""

    @property
    def view(self) -> LiveView:
        """Live frames and recent events."""
        ...

    @property
    def auth(self) -> Authenticator:
        """Who may see the page."""
        ...

    def report(self) -> dict[str, object]:
        """The `/api/status` document now."""
        ...

    def resolve_media(self, relative: str) -> Path | None:
        """The file of a plain relative media path, or None (no resolver, or no such media)."""
        ...

    def reload_config(self) -> Mapping[str, object] | None:
        """Apply the config file again and say what came of it; None when reloading is off."""
        ...

    @property
    def reloads(self) -> bool:
        """Whether `POST /api/reload` is served."""
        ...


class _Refusal(Exception):
    """An answer decided before the route ran (status, text, extra headers)."""

    def __init__(self, status: int, text: str, headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(text)
        self.status = status
        self.text = text
        self.headers = tuple(headers)


class _ClientGone(Exception):
    """The client disconnected, or left our writes unread past the timeout."""


class _Request:
    """One request's head: method, raw path, and its headers (lower-case names, one each)."""

    def __init__(self, scope: Scope) -> None:
        self.method = str(scope.get("method", "GET")).upper()
        raw = scope.get("raw_path") or str(scope.get("path", "/")).encode("utf-8")
        self.path = bytes(raw).decode("latin-1")
        self.headers: dict[str, str] = {}
        duplicated: list[str] = []
        # h11 bounds a head that arrives in pieces; one that arrives whole is counted here
        self.head_bytes = len(self.method) + len(raw) + 12
        for name_bytes, value_bytes in scope.get("headers", ()):
            name = bytes(name_bytes).decode("latin-1").lower()
            value = bytes(value_bytes).decode("latin-1")
            self.head_bytes += len(name) + len(value) + 4
            if name in self.headers and name in _SINGLE_HEADERS:
                duplicated.append(name)
            self.headers[name] = value
        self.duplicated = duplicated
        length = self.headers.get("content-length", "")
        # the server has already refused a malformed length (400); h2 may send none at all
        self.declared_length = int(length) if length.isdigit() else None
        self.has_body = bool(self.declared_length) or "transfer-encoding" in self.headers
        self.body_read = False

    @property
    def unread_body(self) -> bool:
        """Whether a body may still be on the wire (then the connection must close)."""
        return self.has_body and not self.body_read


class _Responder:
    """Sends one answer, each write bounded by the client timeout."""

    def __init__(self, send: Send, request: _Request, timeout_s: float) -> None:
        self._send = send
        self._request = request
        self._timeout_s = timeout_s
        self.started = False
        self.status = 0

    @property
    def head(self) -> bool:
        """Whether the request is HEAD (headers only)."""
        return self._request.method == "HEAD"

    async def write(self, message: Message) -> None:
        try:
            await asyncio.wait_for(self._send(message), self._timeout_s)
        except TimeoutError as exc:
            raise _ClientGone from exc
        except OSError as exc:
            raise _ClientGone from exc

    async def start(
        self,
        status: int,
        content_type: str,
        length: int,
        headers: Iterable[tuple[str, str]] = (),
        cache: str = "no-store",
    ) -> None:
        pairs = [
            ("content-type", content_type),
            ("content-length", str(length)),
            ("cache-control", cache),
            *_BASE_HEADERS,
            *headers,
        ]
        if self._request.unread_body or status in _CLOSING_STATUSES:
            pairs.append(("connection", "close"))
        encoded = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in pairs]
        self.started = True
        self.status = status
        await self.write({"type": "http.response.start", "status": status, "headers": encoded})

    async def body(self, data: bytes, more: bool = False) -> None:
        if self.head:
            data = b""
        await self.write({"type": "http.response.body", "body": data, "more_body": more})

    async def whole(
        self,
        status: int,
        data: bytes,
        content_type: str = "text/plain; charset=utf-8",
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        await self.start(status, content_type, len(data), headers)
        await self.body(data)


class StatusApp:
    """The ASGI application of the status page (module docstring); `backend` has the data."""

    def __init__(self, config: WebConfig, backend: StatusBackend, executor: Executor) -> None:
        self._config = config
        self._backend = backend
        self._executor = executor
        self._active = 0
        self._allowed_hosts = _allowed_hosts(config, backend.auth.required)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one connection-level ASGI call: lifespan, an HTTP request, or a refused
        WebSocket."""
        kind = scope.get("type")
        if kind == "lifespan":
            await _lifespan(receive, send)
        elif kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":  # no WebSocket route: the server answers 403
            await send({"type": "websocket.close", "code": 1008})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = _Request(scope)
        responder = _Responder(send, request, self._config.client_timeout_s)
        if self._active >= self._config.max_concurrent_requests:
            await self._answer(responder, _Refusal(503, "busy\n", [("retry-after", "1")]))
            return
        self._active += 1
        try:
            await self._handle(request, receive, responder)
        except _Refusal as refusal:
            await self._answer(responder, refusal)
        except _ClientGone:
            logger.debug("status page: %s %s: the client went away", request.method, request.path)
        except Exception:
            logger.exception("status page: %s %s failed", request.method, request.path)
            if not responder.started:
                await self._answer(responder, _Refusal(500, "internal error\n"))
        finally:
            self._active -= 1
            if logger.isEnabledFor(logging.DEBUG):
                client = scope.get("client") or ("?", 0)
                logger.debug(
                    "%s %s %s -> %s", client[0], request.method, request.path, responder.status
                )

    async def _answer(self, responder: _Responder, refusal: _Refusal) -> None:
        try:
            await responder.whole(refusal.status, refusal.text.encode(), headers=refusal.headers)
        except _ClientGone:
            pass

    async def _handle(self, request: _Request, receive: Receive, responder: _Responder) -> None:
        self._check_head(request)
        if request.path == "/healthz":  # for probes, by whatever name they use
            self._check_read(request)
            await responder.whole(200, b"ok\n")
            return
        rule = self._allowed_hosts
        if rule is not None and not rule.allows(_host_name(request.headers.get("host", ""))):
            raise _Refusal(400, "this host name is not served here\n")
        if request.method not in _ALLOWED_METHODS:
            raise _Refusal(405, "method not allowed\n", [("allow", ", ".join(_ALLOWED_METHODS))])
        if request.method in _READ_METHODS:
            self._check_read(request)
        limit = self._config.max_request_body_bytes
        if request.declared_length is not None and request.declared_length > limit:
            raise _Refusal(413, f"request body over {limit} bytes\n")
        if not self._backend.auth.allows(request.headers.get("authorization")):
            challenge = [("www-authenticate", self._backend.auth.challenge())]
            raise _Refusal(401, "authentication required\n", challenge)
        if request.method == "POST":
            await self._post(request, receive, responder)
        else:
            await self._get(request, responder)

    def _check_head(self, request: _Request) -> None:
        if request.head_bytes > self._config.max_request_head_bytes:
            raise _Refusal(431, "request head too large\n")
        if request.duplicated:
            raise _Refusal(400, f"repeated header: {', '.join(sorted(set(request.duplicated)))}\n")
        if request.declared_length is not None and "transfer-encoding" in request.headers:
            raise _Refusal(400, "both Content-Length and Transfer-Encoding\n")  # smuggling

    def _check_read(self, request: _Request) -> None:
        if request.method not in _READ_METHODS:
            raise _Refusal(405, "method not allowed\n", [("allow", "GET, HEAD")])
        if request.has_body:
            raise _Refusal(400, f"{request.method} takes no body\n")

    async def _get(self, request: _Request, responder: _Responder) -> None:
        path = request.path
        if path == "/":
            page = (await self._blocking(lambda: render_page(self._backend.report()))).encode()
            headers = [("content-security-policy", CONTENT_SECURITY_POLICY)]
            await responder.whole(200, page, "text/html; charset=utf-8", headers)
        elif path == "/api/status":
            # default=str: one odd value in a payload must not take the whole page down
            document = await self._blocking(self._backend.report)
            body = json.dumps(document, separators=(",", ":"), default=str).encode()
            await responder.whole(200, body, "application/json")
        elif path.startswith(_CAMERA_PREFIX) and path.endswith(_FRAME_SUFFIX):
            camera = unquote(path[len(_CAMERA_PREFIX) : -len(_FRAME_SUFFIX)])
            await self._frame(camera, responder)
        elif path.startswith(_MEDIA_PREFIX):
            await self._media(unquote(path[len(_MEDIA_PREFIX) :]), responder)
        elif path == _RELOAD and self._backend.reloads:
            raise _Refusal(405, "method not allowed\n", [("allow", "POST")])
        else:
            raise _Refusal(404, "not found\n")

    async def _frame(self, camera: str, responder: _Responder) -> None:
        view = self._backend.view
        if not camera or "/" in camera or not view.knows(camera):
            raise _Refusal(404, "no such camera\n")
        jpeg = await self._blocking(lambda: view.frame_jpeg(camera))
        if jpeg is None:
            raise _Refusal(503, "no frame yet\n", [("retry-after", "1")])
        headers = [
            ("x-frame-index", str(jpeg.info.index)),
            ("x-capture-time", f"{jpeg.info.capture_time_s:.3f}"),
        ]
        await responder.whole(200, jpeg.data, "image/jpeg", headers)

    async def _media(self, raw: str, responder: _Responder) -> None:
        relative = safe_relative_path(raw)
        resolve = self._backend.resolve_media
        opened = (
            None if relative is None else await self._blocking(lambda: _open(resolve(relative)))
        )
        if opened is None:
            raise _Refusal(404, "not found\n")
        stream, size, content_type = opened
        try:
            cache = f"private, max-age={_MEDIA_MAX_AGE_S}"
            await responder.start(200, content_type, size, cache=cache)
            if responder.head:
                await responder.body(b"")
                return
            sent = 0
            while sent < size:
                chunk = await self._blocking(lambda: stream.read(_MEDIA_CHUNK_BYTES))
                if not chunk:
                    break  # truncated under us: the client sees a short body and the close
                sent += len(chunk)
                await responder.body(chunk, more=sent < size)
            if sent < size:
                raise _ClientGone
        finally:
            stream.close()

    async def _post(self, request: _Request, receive: Receive, responder: _Responder) -> None:
        if request.path != _RELOAD or not self._backend.reloads:
            if request.path in _READ_ROUTES or request.path.startswith(
                (_CAMERA_PREFIX, _MEDIA_PREFIX)
            ):
                raise _Refusal(405, "method not allowed\n", [("allow", "GET, HEAD")])
            raise _Refusal(404, "not found\n")
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
            # a page of another site posting with the browser's stored credentials
            raise _Refusal(403, "cross-site request refused\n")
        if request.headers.get("sec-fetch-site", "same-origin") not in _SAME_SITE_FETCHES:
            raise _Refusal(403, "cross-site request refused\n")
        body = await self._read_body(request, receive)
        if body:
            content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if content_type != "application/json":
                raise _Refusal(415, "a body must be application/json\n")
            try:
                document = json.loads(body)
            except (UnicodeDecodeError, json.JSONDecodeError):
                document = None
            if not isinstance(document, dict):
                raise _Refusal(400, "the body must be one JSON object\n")
        outcome = await self._blocking(self._backend.reload_config)
        if outcome is None:
            raise _Refusal(404, "not found\n")
        answer = json.dumps(outcome, separators=(",", ":"), default=str).encode()
        await responder.whole(200 if outcome.get("ok") else 409, answer, "application/json")

    async def _read_body(self, request: _Request, receive: Receive) -> bytes:
        """The whole body, at most `max_request_body_bytes`, within `client_timeout_s`."""
        limit = self._config.max_request_body_bytes
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self._config.client_timeout_s):
                while True:
                    message = await receive()
                    if message.get("type") == "http.disconnect":
                        raise _ClientGone
                    chunk = bytes(message.get("body", b""))
                    size += len(chunk)
                    if size > limit:
                        raise _Refusal(413, f"request body over {limit} bytes\n")
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise _Refusal(408, "request body too slow\n") from None
        request.body_read = True
        return b"".join(chunks)

    async def _blocking(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)


def _open(file: Path | None) -> tuple[BinaryIO, int, str] | None:
    """The open media file, its size and type; None when there is no such file."""
    if file is None or not file.is_file():
        return None
    stream = file.open("rb")
    try:
        size = file.stat().st_size
    except OSError:
        stream.close()
        return None
    return stream, size, media_type(file)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message.get("type") == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message.get("type") == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _host_name(host: str) -> str:
    """The name part of a `Host` value, lower case: `[::1]:8480` -> `::1`, `a.lan:80` -> `a.lan`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


@dataclass(frozen=True, slots=True)
class _HostRule:
    """The host names a request's `Host` may name."""

    names: frozenset[str]
    loopback: bool  # also any loopback name (`localhost`, 127/8, ::1)

    def allows(self, host: str) -> bool:
        return host in self.names or (self.loopback and bool(host) and is_loopback_host(host))


def _allowed_hosts(config: WebConfig, authenticated: bool) -> _HostRule | None:
    """What `Host` may name under `config` (module docstring); None: anything."""
    on_loopback = is_loopback_host(config.host.strip("[]"))
    if config.allowed_hosts:
        return _HostRule(frozenset(_host_name(n) for n in config.allowed_hosts), on_loopback)
    if authenticated or not on_loopback:
        return None
    return _HostRule(frozenset(), loopback=True)
