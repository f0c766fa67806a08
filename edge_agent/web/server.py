"""`StatusServer`: the status page over HTTP, served by hypercorn on an event loop in a thread of
its own inside the agent.

Routes (GET and HEAD; every one but `/healthz` behind the configured auth):

- `/`: the page (`page.render_page`); `/api/status`: its JSON (`report.status_report`);
- `/api/cameras/<name>/frame.jpg`: the camera's latest frame, annotated; 404 for a camera the
  agent does not have, 503 before its first frame;
- `/media/<relative path>`: an event's snapshot, crop or clip, found by the media resolver;
  404 for anything the resolver does not find and for any path that is not a plain relative one
  (`..`, absolute, backslashes: checked after URL-decoding, before the resolver sees it);
- `/healthz`: `ok`, never behind auth (for probes);
- `POST /api/reload` (when the agent gives a reload action): same origin only (`app.py`).

Why hypercorn (0.18, pure Python: h11 for HTTP/1.1, h2 for HTTP/2; runs wherever CPython does,
Jetson and Raspberry Pi included, and pulls no C extension and no torch): its parser is h11,
which refuses a negative, non-numeric or repeated-and-different `Content-Length`, any
`Transfer-Encoding` but `chunked`, and a head still incomplete past `max_request_head_bytes`
(the app counts a head that arrives whole), frames every body by its length or chunks (a body
is never read as the next request), and answers all of that 400 without calling the app;
and its connection loop has the deadlines a status page on a network needs: a request head
must arrive within `client_timeout_s` of connecting or of the previous answer (slowloris), each
read within `client_timeout_s`, a body is handed over in bounded chunks (at most 10 queued) and
a connection whose body the app left unread is closed. uvicorn (h11 or httptools) has no
deadline on a request head: a client sending one byte a second holds its connection for ever.
aiohttp (3.14) would do too (its keep-alive timer runs from the connect), but brings compiled
dependencies (its llhttp parser, multidict, yarl, propcache, frozenlist) for a page that uses
none of its client or routing, where hypercorn is pure Python. Cleartext HTTP/2 (prior
knowledge or `Upgrade: h2c`) is hypercorn's and cannot be turned off; its streams go through
the same app and checks (tested).

The app (`app.StatusApp`) decides everything else from the request head before any body is
read: limits, auth, methods, content types, same origin, host names.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

from edge_agent.config.web import WebConfig
from edge_agent.web.app import MEDIA_TYPES, StatusApp, media_type
from edge_agent.web.auth import Authenticator
from edge_agent.web.live import LiveView
from edge_agent.web.report import status_report

__all__ = [
    "MEDIA_TYPES",
    "MediaResolver",
    "ReloadAction",
    "StatusServer",
    "StatusSource",
    "media_type",
]

logger = logging.getLogger(__name__)

StatusSource = Callable[[], Mapping[str, Mapping[str, object]]]
"""Every camera's status document by name (`EdgeAgent.status_documents`)."""

MediaResolver = Callable[[str], Path | None]
"""The file of a media path relative to the media store, or None when there is none."""

ReloadAction = Callable[[], Mapping[str, object]]
"""Re-reads the agent's config file and applies it; what came of it, as JSON."""

_GRACEFUL_S = 1.0  # on close, requests in flight get this long; then their connections go
_START_TIMEOUT_S = 10.0
_JOIN_TIMEOUT_S = 5.0
_WORKER_THREADS = 4  # blocking work of requests (report, JPEG, file reads, reload)
_BACKLOG = 128


class _ServerLog(logging.Logger):
    """hypercorn's own log lines, under this module's logger: its start-up banner (`Running on
    ... (CTRL + C to quit)`) at DEBUG, since the agent logs its own line."""

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        """At DEBUG."""
        self.debug(msg, *args, **kwargs)


def _server_log() -> logging.Logger:
    log = _ServerLog(f"{__name__}.hypercorn")
    log.parent = logger  # not registered: nothing global is configured
    return log


def _bind(host: str, port: int, unacknowledged_s: float) -> socket.socket:
    """A listening TCP socket on `host:port`; raises `OSError` when it cannot be bound.

    Its connections (they inherit the option) fail once data they were sent has stayed
    unacknowledged for `unacknowledged_s`: a client that stops reading (zero window) would
    otherwise keep its connection and its unsent buffer for ever, since closing a transport
    waits for its buffer to drain.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux
            timeout_ms = max(1, round(unacknowledged_s * 1000))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, timeout_ms)
        sock.bind((host.strip("[]"), port))
        sock.listen(_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _quiet_disconnects(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A connection that failed under us (reset, or timed out by TCP_USER_TIMEOUT while its
    client did not read) is the client's doing, not an error of ours: hypercorn lets those
    through when it closes the connection, and asyncio would log them with a traceback. So is
    a connection cancelled at `close` after the grace period (Python 3.11's stream callback
    logs the cancellation as an error)."""
    exc = context.get("exception")
    if isinstance(exc, TimeoutError | ConnectionError | asyncio.CancelledError):
        logger.debug("status page: a connection ended: %r", exc)
        return
    loop.default_exception_handler(context)


def hypercorn_config(config: WebConfig, fd: int) -> HypercornConfig:
    """hypercorn's settings for `config`, serving the listening socket `fd`."""
    settings = HypercornConfig()
    settings.bind = [f"fd://{fd}"]
    settings.backlog = _BACKLOG
    settings.keep_alive_timeout = config.client_timeout_s
    settings.read_timeout = math.ceil(config.client_timeout_s)
    settings.graceful_timeout = _GRACEFUL_S
    settings.h11_max_incomplete_size = config.max_request_head_bytes
    settings.h2_max_header_list_size = config.max_request_head_bytes
    settings.h2_max_concurrent_streams = config.max_concurrent_requests
    settings.include_server_header = False
    settings.accesslog = None
    settings.errorlog = _server_log()
    return settings


class StatusServer:
    """The agent's status page (module docstring); `start()` binds and serves, `close()` stops.

    `status` gives every camera's status document (called per request, from a worker thread);
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
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown: asyncio.Event | None = None
        self._ready = threading.Event()

    # ---- what the routes read (`app.StatusBackend`) ----

    def report(self) -> dict[str, object]:
        """The `/api/status` document now."""
        return status_report(
            self.view, self._status(), self._clock(), local_media=self.media_resolver is not None
        )

    def resolve_media(self, relative: str) -> Path | None:
        """The file of a plain relative media path, or None."""
        return None if self.media_resolver is None else self.media_resolver(relative)

    @property
    def reloads(self) -> bool:
        """Whether `POST /api/reload` is served."""
        return self.reload is not None

    def reload_config(self) -> Mapping[str, object] | None:
        """Run the reload action (None when there is none)."""
        return None if self.reload is None else self.reload()

    # ---- life cycle ----

    def start(self) -> None:
        """Bind `config.host:config.port` and serve from a thread of its own; raises `OSError`
        when the address cannot be bound (before anything runs)."""
        if self._thread is not None:
            raise RuntimeError("the status server is already started")
        sock = _bind(self.config.host, self.config.port, self.config.client_timeout_s)
        self._port = int(sock.getsockname()[1])
        settings = hypercorn_config(self.config, sock.detach())  # hypercorn owns the fd now
        self._executor = ThreadPoolExecutor(_WORKER_THREADS, thread_name_prefix="status-page")
        app = StatusApp(self.config, self, self._executor)
        self._ready.clear()
        self._thread = threading.Thread(
            target=self._serve, args=(app, settings), name="status-page", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT_S):
            logger.warning("status page: the server thread is slow to start")
        logger.info("status page on %s", self.url)

    def _serve(self, app: StatusApp, settings: HypercornConfig) -> None:
        try:
            asyncio.run(self._main(app, settings))
        except Exception:
            logger.exception("status page: the HTTP server stopped on an error")
        finally:
            self._ready.set()

    async def _main(self, app: StatusApp, settings: HypercornConfig) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(_quiet_disconnects)
        self._shutdown = asyncio.Event()
        self._ready.set()
        await serve(cast(Any, app), settings, shutdown_trigger=self._shutdown.wait, mode="asgi")

    @property
    def port(self) -> int:
        """The bound port (the real one when the config says 0); only once started."""
        if self._port is None:
            raise RuntimeError("the status server is not started")
        return self._port

    @property
    def url(self) -> str:
        """`http://host:port/` of the page."""
        host = self.config.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/"

    def close(self) -> None:
        """Stop serving and release the port: requests in flight get about a second, then
        their connections close. Returns within a few seconds whatever the clients do."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._ready.wait(_START_TIMEOUT_S)
        loop, shutdown = self._loop, self._shutdown
        if loop is not None and shutdown is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(shutdown.set)
            except RuntimeError:  # the loop ended on its own meanwhile
                pass
        thread.join(_JOIN_TIMEOUT_S)
        if thread.is_alive():
            logger.warning("status page: the server thread did not stop in %s s", _JOIN_TIMEOUT_S)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        self._port = None
        self._loop = self._shutdown = None

    def __enter__(self) -> StatusServer:
        """Start; `with StatusServer(...) as server:` closes it on leaving."""
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close."""
        self.close()
