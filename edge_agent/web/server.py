"""`StatusServer`: the status page over HTTP (stdlib `ThreadingHTTPServer`, a daemon thread).

Routes (GET and HEAD; every one but `/healthz` behind the configured auth):

- `/`: the page (`page.render_page`); `/api/status`: its JSON (`report.status_report`);
- `/api/cameras/<name>/frame.jpg`: the camera's latest frame, annotated; 404 for a camera the
  agent does not have, 503 before its first frame;
- `/media/<relative path>`: an event's snapshot, crop or clip, found by the media resolver;
  404 for anything the resolver does not find and for any path that is not a plain relative one
  (`..`, absolute, backslashes: checked after URL-decoding, before the resolver sees it);
- `/healthz`: `ok`, never behind auth (for probes).

Each request runs in its own daemon thread, so a slow client delays nobody else; a client silent
for `client_timeout_s` is disconnected.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import threading
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from edge_agent.config.web import WebConfig
from edge_agent.web.auth import Authenticator
from edge_agent.web.live import LiveView
from edge_agent.web.page import CONTENT_SECURITY_POLICY, render_page
from edge_agent.web.report import safe_relative_path, status_report

__all__ = ["MediaResolver", "StatusServer", "StatusSource", "media_type"]

logger = logging.getLogger(__name__)

StatusSource = Callable[[], Mapping[str, Mapping[str, object]]]
"""Every camera's status document by name (`EdgeAgent.status_documents`)."""

MediaResolver = Callable[[str], Path | None]
"""The file of a media path relative to the media store, or None when there is none."""

_MEDIA_TYPES = {
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
_SHUTDOWN_POLL_S = 0.1  # how soon `close` is noticed; an idle wake-up costs next to nothing
_MAX_POST_BODY = 65_536
_MEDIA_MAX_AGE_S = 3_600  # media files never change once written (the store writes atomically)


def media_type(path: Path) -> str:
    """The Content-Type of a media file, by its suffix (`application/octet-stream` if unknown)."""
    return _MEDIA_TYPES.get(path.suffix.lower(), "application/octet-stream")


ReloadAction = Callable[[], Mapping[str, object]]
"""Re-reads the agent's config file and applies it; what came of it, as JSON."""


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], app: StatusServer) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.app = app
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the page polls every second
    server_version = "edge-agent-status"
    sys_version = ""
    server: _HttpServer

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.app.client_timeout_s)

    def log_message(self, format: str, *args: object) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._respond(head=False)

    def do_HEAD(self) -> None:
        self._respond(head=True)

    def do_POST(self) -> None:
        try:
            self._post(urlsplit(self.path).path)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception:
            logger.exception("status page: %s %s failed", self.command, self.path)
            self.close_connection = True
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n")

    def _post(self, path: str) -> None:
        """`POST /api/reload`: re-read the config file and apply its camera changes."""
        app = self.server.app
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(min(length, _MAX_POST_BODY))  # no body is needed; drain a small one
        if not app.auth.allows(self.headers.get("Authorization")):
            challenge = {"WWW-Authenticate": app.auth.challenge()}
            self._send(HTTPStatus.UNAUTHORIZED, b"authentication required\n", headers=challenge)
            return
        if path != "/api/reload" or app.reload is None:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n")
            return
        origin = self.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != self.headers.get("Host"):
            # a page of another site posting with the browser's stored credentials
            self._send(HTTPStatus.FORBIDDEN, b"cross-site request refused\n")
            return
        outcome = app.reload()
        status = HTTPStatus.OK if outcome.get("ok") else HTTPStatus.CONFLICT
        body = json.dumps(outcome, separators=(",", ":")).encode("utf-8")
        self._send(status, body, "application/json")

    def _respond(self, *, head: bool) -> None:
        try:
            self._route(urlsplit(self.path).path, head)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True  # the client went away; nothing to answer
        except Exception:
            logger.exception("status page: %s %s failed", self.command, self.path)
            self.close_connection = True
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n", head=head)

    def _route(self, path: str, head: bool) -> None:
        app = self.server.app
        if path == "/healthz":
            self._send(HTTPStatus.OK, b"ok\n", head=head)
            return
        if not app.auth.allows(self.headers.get("Authorization")):
            self._send(
                HTTPStatus.UNAUTHORIZED,
                b"authentication required\n",
                head=head,
                headers={"WWW-Authenticate": app.auth.challenge()},
            )
            return
        if path == "/":
            page = render_page(app.report()).encode("utf-8")
            headers = {"Content-Security-Policy": CONTENT_SECURITY_POLICY}
            self._send(HTTPStatus.OK, page, "text/html; charset=utf-8", head, headers)
        elif path == "/api/status":
            # default=str: one odd value in a payload must not take the whole page down
            report = json.dumps(app.report(), separators=(",", ":"), default=str)
            body = report.encode("utf-8")
            self._send(HTTPStatus.OK, body, "application/json", head)
        elif path.startswith(_CAMERA_PREFIX) and path.endswith(_FRAME_SUFFIX):
            self._frame(unquote(path[len(_CAMERA_PREFIX) : -len(_FRAME_SUFFIX)]), head)
        elif path.startswith(_MEDIA_PREFIX):
            self._media(unquote(path[len(_MEDIA_PREFIX) :]), head)
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", head=head)

    def _frame(self, camera: str, head: bool) -> None:
        view = self.server.app.view
        if not camera or "/" in camera or not view.knows(camera):
            self._send(HTTPStatus.NOT_FOUND, b"no such camera\n", head=head)
            return
        jpeg = view.frame_jpeg(camera)
        if jpeg is None:
            self._send(
                HTTPStatus.SERVICE_UNAVAILABLE,
                b"no frame yet\n",
                head=head,
                headers={"Retry-After": "1"},
            )
            return
        headers = {
            "X-Frame-Index": str(jpeg.info.index),
            "X-Capture-Time": f"{jpeg.info.capture_time_s:.3f}",
        }
        self._send(HTTPStatus.OK, jpeg.data, "image/jpeg", head, headers)

    def _media(self, raw: str, head: bool) -> None:
        resolver = self.server.app.media_resolver
        relative = safe_relative_path(raw)
        file = None if resolver is None or relative is None else resolver(relative)
        if file is None or not file.is_file():
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", head=head)
            return
        with file.open("rb") as stream:
            size = file.stat().st_size
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", media_type(file))
            self.send_header("Content-Length", str(size))
            self.send_header("Cache-Control", f"private, max-age={_MEDIA_MAX_AGE_S}")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            if not head:
                shutil.copyfileobj(stream, self.wfile)

    def _send(
        self,
        status: HTTPStatus,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        head: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)


class StatusServer:
    """The agent's status page (module docstring); `start()` binds and serves, `close()` stops.

    `status` gives every camera's status document (called per request, from HTTP threads);
    `media_resolver` finds event media for `/media/` (None: that route is always 404). The
    configured auth secret is resolved here: raises `SecretError` when it is unavailable.
    """

    def __init__(
        self,
        config: WebConfig,
        view: LiveView,
        status: StatusSource,
        media_resolver: MediaResolver | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        reload: ReloadAction | None = None,
    ) -> None:
        """Prepare the server (nothing is bound until `start`); `clock` gives wall time.

        `reload`, if given, serves `POST /api/reload`: it re-reads the config and returns
        `{"ok": bool, "message": str, ...}` (200 when applied, 409 when refused).
        """
        self.config = config
        self.view = view
        self.media_resolver = media_resolver
        self.reload = reload
        self.auth = Authenticator.from_config(config.auth, environ)
        self.client_timeout_s = config.client_timeout_s
        self._status = status
        self._clock = clock
        self._server: _HttpServer | None = None
        self._thread: threading.Thread | None = None

    def report(self) -> dict[str, object]:
        """The `/api/status` document now."""
        return status_report(
            self.view, self._status(), self._clock(), local_media=self.media_resolver is not None
        )

    def start(self) -> None:
        """Bind `config.host:config.port` and serve in a daemon thread; raises `OSError` when
        the address cannot be bound."""
        if self._server is not None:
            raise RuntimeError("the status server is already started")
        server = _HttpServer((self.config.host, self.config.port), self)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": _SHUTDOWN_POLL_S},
            name="status-page",
        )
        self._thread.daemon = True
        self._thread.start()
        logger.info("status page on %s", self.url)

    @property
    def port(self) -> int:
        """The bound port (the real one when the config says 0); only once started."""
        if self._server is None:
            raise RuntimeError("the status server is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """`http://host:port/` of the page."""
        host = self.config.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/"

    def close(self) -> None:
        """Stop serving and release the port (requests in flight finish in their threads)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    def __enter__(self) -> StatusServer:
        """Start; `with StatusServer(...) as server:` closes it on leaving."""
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close."""
        self.close()
