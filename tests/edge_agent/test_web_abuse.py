"""The status page's HTTP surface probed as a stranger would: raw sockets, HTTP/2 frames and
headless Chromium against the real server in this process.

Each case checks the answer, that the reload action ran exactly as often as it should (never for
a smuggled or cross-site request), that the server still answers afterwards, and that nothing
was logged at ERROR or with a traceback. Memory: the process's resident set may grow by at most
`RSS_BOUND_BYTES` (16 MiB) while a case sends up to 64 MiB or holds 100 connections open.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import pydantic
import pytest

from edge_agent.config.web import WebConfig
from edge_agent.web import LiveView, StatusServer
from testbed.status_page_shot import chromium_dom, chromium_executable

RSS_BOUND_BYTES = 16 * 2**20
_PASSWORD = "s3cret:pass"  # noqa: S105 (a test secret)
_SECRETS = {"WEB_PASSWORD": _PASSWORD}
_BASIC = {"type": "basic", "username": "viewer", "password": {"env": "WEB_PASSWORD"}}
_CREDENTIALS = "Basic " + base64.b64encode(f"viewer:{_PASSWORD}".encode()).decode()
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@dataclass
class Page:
    """A status server with a counting reload action."""

    server: StatusServer
    reloads: list[float] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    @property
    def port(self) -> int:
        return self.server.port


@pytest.fixture(autouse=True)
def _no_tracebacks(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.DEBUG, logger="edge_agent.web")
    yield
    records = [*caplog.get_records("setup"), *caplog.get_records("call"), *caplog.records]
    bad = [r for r in records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [f"{r.name}: {r.getMessage()}" for r in bad]


@pytest.fixture
def serve() -> Iterator[Callable[..., Page]]:
    pages: list[Page] = []

    def start(blocking_reload: bool = False, **settings: Any) -> Page:
        config = WebConfig.model_validate({"port": 0, **settings})
        page: Page
        view = LiveView()

        def reload() -> dict[str, object]:
            page.reloads.append(time.monotonic())
            if blocking_reload:
                page.release.wait(30)
            return {"ok": True, "message": "reloaded: no change"}

        server = StatusServer(config, view, dict, environ=_SECRETS, reload=reload)
        page = Page(server)
        server.start()
        pages.append(page)
        return page

    yield start
    for page in pages:
        page.release.set()
        page.server.close()


def _exchange(port: int, data: bytes, *, read_s: float = 10.0) -> bytes:
    """Send `data`, then read until the server closes or `read_s` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_s) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass  # the server may close before all of it is sent
        return _read_all(sock, read_s)


def _read_all(sock: socket.socket, read_s: float) -> bytes:
    chunks: list[bytes] = []
    deadline = time.monotonic() + read_s
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65_536)
        except TimeoutError:
            break
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _statuses(answer: bytes) -> list[int]:
    return [int(code) for code in _STATUS_LINE.findall(answer)]


def _request(
    method: str,
    path: str,
    port: int,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    *,
    length: bool = True,
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    all_headers = dict(headers or {})
    framed = "Content-Length" in all_headers or "Transfer-Encoding" in all_headers
    if length and body and not framed:
        all_headers["Content-Length"] = str(len(body))
    lines += [f"{name}: {value}" for name, value in all_headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _healthy(page: Page) -> bool:
    request = _request("GET", "/healthz", page.port, {"Connection": "close"})
    return _statuses(_exchange(page.port, request)) == [200]


def _smuggled(port: int) -> bytes:
    """A complete reload request, to be hidden in a body."""
    return _request("POST", "/api/reload", port, {"Authorization": _CREDENTIALS})


# ---- Content-Length -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        ("-1", 400),
        ("abc", 400),
        ("1e3", 400),
        (" 12 x", 400),
        ("9" * 40, 400),
        (str(2**40), 413),
        ("10", 401),
    ],
)
def test_bad_or_huge_content_length_is_refused_before_the_body(
    serve: Callable[..., Page], length: str, expected: int
) -> None:
    page = serve(auth=_BASIC, host="127.0.0.1")
    request = _request("POST", "/api/reload", page.port, {"Content-Length": length})

    answer = _exchange(page.port, request + b"0123456789")

    assert _statuses(answer) == [expected], answer
    assert page.reloads == []
    assert _healthy(page)


def test_an_endless_body_without_credentials_does_not_grow_memory(
    serve: Callable[..., Page],
) -> None:
    """The probe that grew the old server by 198 MB: a negative and then a huge declared length,
    64 MiB pushed behind each without credentials."""
    page = serve(auth=_BASIC, host="127.0.0.1")
    before = _rss_bytes()
    block = b"x" * 1_048_576
    for length in ("-1", str(2**40)):
        with socket.create_connection(("127.0.0.1", page.port), timeout=10) as sock:
            sock.sendall(_request("POST", "/api/reload", page.port, {"Content-Length": length}))
            sent = 0
            try:
                while sent < 64 * len(block):
                    sock.sendall(block)
                    sent += len(block)
            except OSError:
                pass  # refused and closed: what should happen
            answer = _read_all(sock, 5.0)
        assert _statuses(answer)[:1] in ([400], [413], []), answer
        assert sent < 64 * len(block), "the server read 64 MiB it should have refused"

    assert _rss_bytes() - before < RSS_BOUND_BYTES
    assert page.reloads == []
    assert _healthy(page)


# ---- bodies, pipelining and smuggling -----------------------------------------------------------


def test_a_body_over_the_limit_is_refused_and_its_rest_never_runs(
    serve: Callable[..., Page],
) -> None:
    """The old server read 64 KiB of a larger body and parsed the rest as a new request."""
    page = serve()
    body = b"x" * 65_536 + _smuggled(page.port)  # where the old server stopped reading
    headers = {"Content-Type": "application/json"}

    answer = _exchange(page.port, _request("POST", "/api/reload", page.port, headers, body))

    assert _statuses(answer) == [413], answer
    assert b"connection: close" in answer.lower()
    assert page.reloads == []


def test_a_get_with_a_body_is_refused_and_its_body_never_runs(serve: Callable[..., Page]) -> None:
    page = serve()

    answer = _exchange(page.port, _request("GET", "/", page.port, body=_smuggled(page.port)))

    assert _statuses(answer) == [400], answer
    assert page.reloads == []


def test_pipelined_requests_each_run_once_in_order(serve: Callable[..., Page]) -> None:
    page = serve()
    reload = _request("POST", "/api/reload", page.port, {"Content-Length": "0"})
    status = _request("GET", "/api/status", page.port)
    health = _request("GET", "/healthz", page.port, {"Connection": "close"})

    answer = _exchange(page.port, reload + status + reload + health)

    assert _statuses(answer) == [200, 200, 200, 200], answer
    assert len(page.reloads) == 2


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Length": "5", "Transfer-Encoding": "chunked"},
        {"Transfer-Encoding": "chunked", "Content-Length": "5"},
        {"Transfer-Encoding": "gzip, chunked"},
        {"Transfer-Encoding": "identity"},
    ],
    ids=["cl-te", "te-cl", "te-list", "te-identity"],
)
def test_ambiguous_framing_is_refused(serve: Callable[..., Page], headers: dict[str, str]) -> None:
    page = serve()
    chunked_smuggle = b"0\r\n\r\n" + _smuggled(page.port)

    answer = _exchange(
        page.port, _request("POST", "/api/reload", page.port, headers, chunked_smuggle)
    )

    assert _statuses(answer)[:1] in ([400], [501]), answer
    assert page.reloads == []
    assert _healthy(page)


def test_duplicate_content_lengths_are_refused(serve: Callable[..., Page]) -> None:
    page = serve()
    raw = (
        f"POST /api/reload HTTP/1.1\r\nHost: 127.0.0.1:{page.port}\r\n"
        "Content-Length: 0\r\nContent-Length: 40\r\n\r\n"
    ).encode() + _smuggled(page.port)

    answer = _exchange(page.port, raw)

    assert _statuses(answer)[:1] == [400], answer
    assert page.reloads == []


def _chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


def test_a_chunked_body_counts_against_the_limit(serve: Callable[..., Page]) -> None:
    page = serve()
    headers = {"Transfer-Encoding": "chunked", "Content-Type": "application/json"}

    small = _exchange(
        page.port,
        _request(
            "POST",
            "/api/reload",
            page.port,
            {**headers, "Connection": "close"},
            _chunked(b"{", b"}"),
        ),
    )
    large = _exchange(
        page.port,
        _request(
            "POST",
            "/api/reload",
            page.port,
            headers,
            _chunked(*[b" " * 600] * 4, b"{}") + _smuggled(page.port),
        ),
    )

    assert _statuses(small) == [200], small
    assert _statuses(large) == [413], large
    assert len(page.reloads) == 1


# ---- methods and content types ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "expected", "allow"),
    [
        ("PUT", "/api/reload", 405, "GET, HEAD, POST"),
        ("DELETE", "/", 405, "GET, HEAD, POST"),
        ("OPTIONS", "/api/reload", 405, "GET, HEAD, POST"),
        ("TRACE", "/", 405, "GET, HEAD, POST"),
        ("POST", "/", 405, "GET, HEAD"),
        ("POST", "/api/status", 405, "GET, HEAD"),
        ("POST", "/healthz", 405, "GET, HEAD"),
        ("GET", "/api/reload", 405, "POST"),
        ("POST", "/nope", 404, None),
    ],
)
def test_methods_outside_a_route_are_refused(
    serve: Callable[..., Page], method: str, path: str, expected: int, allow: str | None
) -> None:
    page = serve()

    answer = _exchange(
        page.port, _request(method, path, page.port, {"Content-Length": "0", "Connection": "close"})
    )

    assert _statuses(answer) == [expected], answer
    if allow is not None:
        assert f"allow: {allow}".lower().encode() in answer.lower()
    assert page.reloads == []


@pytest.mark.parametrize(
    ("headers", "body", "expected", "runs"),
    [
        ({}, b"", 200, 1),
        ({"Content-Type": "application/json"}, b"{}", 200, 1),
        ({"Content-Type": "application/json; charset=utf-8"}, b'{"why": "test"}', 200, 1),
        ({"Content-Type": "text/plain"}, b"{}", 415, 0),
        ({"Content-Type": "application/x-www-form-urlencoded"}, b"a=b", 415, 0),
        ({}, b"{}", 415, 0),
        ({"Content-Type": "application/json"}, b"[1]", 400, 0),
        ({"Content-Type": "application/json"}, b"\xff{", 400, 0),
        ({"Origin": "http://evil.example"}, b"", 403, 0),
        ({"Origin": "null"}, b"", 403, 0),
        ({"Sec-Fetch-Site": "cross-site"}, b"", 403, 0),
        ({"Sec-Fetch-Site": "same-site"}, b"", 403, 0),
        ({"Sec-Fetch-Site": "same-origin"}, b"", 200, 1),
        ({"Origin": "SAME"}, b"", 200, 1),
    ],
)
def test_reload_checks_origin_and_content_type(
    serve: Callable[..., Page],
    headers: dict[str, str],
    body: bytes,
    expected: int,
    runs: int,
) -> None:
    page = serve()
    if headers.get("Origin") == "SAME":
        headers = {"Origin": f"http://127.0.0.1:{page.port}"}
    headers = {**headers, "Connection": "close", "Content-Length": str(len(body))}

    answer = _exchange(page.port, _request("POST", "/api/reload", page.port, headers, body))

    assert _statuses(answer) == [expected], answer
    assert len(page.reloads) == runs


# ---- host names (DNS rebinding) -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "host", "expected"),
    [
        ({}, "127.0.0.1:{port}", 200),
        ({}, "localhost:{port}", 200),
        ({}, "[::1]:{port}", 200),
        ({}, "evil.example:{port}", 400),
        ({}, "127.0.0.1.evil.example", 400),
        ({"auth": _BASIC}, "evil.example:{port}", 200),
        ({"allowed_hosts": ["edge-01.lan"]}, "edge-01.lan:{port}", 200),
        ({"allowed_hosts": ["edge-01.lan"]}, "localhost", 200),
        ({"allowed_hosts": ["edge-01.lan"], "auth": _BASIC}, "other.lan", 400),
    ],
)
def test_only_the_pages_own_host_names_are_answered(
    serve: Callable[..., Page], settings: dict[str, Any], host: str, expected: int
) -> None:
    page = serve(**settings)
    raw = (
        f"GET /api/status HTTP/1.1\r\nHost: {host.format(port=page.port)}\r\n"
        f"Authorization: {_CREDENTIALS}\r\nConnection: close\r\n\r\n"
    ).encode()

    assert _statuses(_exchange(page.port, raw)) == [expected]
    probe = raw.replace(b"/api/status", b"/healthz")
    assert _statuses(_exchange(page.port, probe)) == [200]  # probes, by any name


# ---- heads: size and speed ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        f"X-Big: {'a' * 70_000}\r\n",
        "".join(f"X-H{i}: {'b' * 100}\r\n" for i in range(400)),
        "GET" + " " * 20_000,
    ],
    ids=["one-long-header", "many-headers", "long-junk"],
)
def test_an_oversized_head_is_refused(serve: Callable[..., Page], extra: str) -> None:
    page = serve(max_request_head_bytes=16_384)
    raw = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{page.port}\r\n{extra}\r\n".encode()

    answer = _exchange(page.port, raw)

    assert _statuses(answer)[:1] in ([400], [431]), answer
    assert _healthy(page)


def test_slowloris_connections_are_dropped_and_others_are_served(
    serve: Callable[..., Page],
) -> None:
    """100 connections that never finish their head, and one that sends a byte every 0.3 s:
    each is cut off once its head is `client_timeout_s` late, and meanwhile others are served."""
    page = serve(client_timeout_s=1.0)
    before = _rss_bytes()
    idle = [socket.create_connection(("127.0.0.1", page.port), timeout=30) for _ in range(100)]
    trickle = socket.create_connection(("127.0.0.1", page.port), timeout=30)
    started = time.monotonic()
    try:
        for sock in idle:
            sock.sendall(b"GET / HTTP/1.1\r\n")
        assert _healthy(page)  # served while 101 connections hang
        grown = _rss_bytes() - before
        cut_after = _trickle(trickle, _request("GET", "/", page.port), started)
        assert cut_after is not None, "a head trickled for 18 s was never cut off"
        assert cut_after < 15.0
        for sock in idle:
            assert b"200" not in _read_all(sock, 15.0)  # closed (EOF), nothing served
    finally:
        for sock in [*idle, trickle]:
            sock.close()
    assert grown < RSS_BOUND_BYTES


def _trickle(sock: socket.socket, data: bytes, started: float) -> float | None:
    """Send `data` a byte every 0.3 s; seconds from `started` until the server closed, or None."""
    for byte in data[:60]:
        ready, _, _ = select.select([sock], [], [], 0)
        if ready:
            try:
                if not sock.recv(65_536):
                    return time.monotonic() - started
            except OSError:
                return time.monotonic() - started
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return time.monotonic() - started
        time.sleep(0.3)
    return None


def test_a_body_sent_too_slowly_is_cut_off(serve: Callable[..., Page]) -> None:
    page = serve(client_timeout_s=1.0)
    headers = {"Content-Type": "application/json", "Content-Length": "100"}
    with socket.create_connection(("127.0.0.1", page.port), timeout=30) as sock:
        sock.sendall(_request("POST", "/api/reload", page.port, headers))
        started = time.monotonic()
        answer = b""
        for _ in range(40):  # a byte every 0.3 s: 100 bytes would take 30 s
            try:
                sock.sendall(b" ")
            except OSError:
                break
            ready, _, _ = select.select([sock], [], [], 0.3)
            if ready:
                answer = _read_all(sock, 5.0)
                break
        elapsed = time.monotonic() - started

    assert _statuses(answer) in ([408], []), answer
    assert elapsed < 12.0
    assert page.reloads == []


# ---- load, slow readers, shutdown ---------------------------------------------------------------


def test_requests_beyond_the_limit_are_answered_503(serve: Callable[..., Page]) -> None:
    page = serve(blocking_reload=True, max_concurrent_requests=1)
    holder = socket.create_connection(("127.0.0.1", page.port), timeout=30)
    try:
        headers = {"Content-Length": "0", "Connection": "close"}
        holder.sendall(_request("POST", "/api/reload", page.port, headers))
        deadline = time.monotonic() + 20
        while not page.reloads and time.monotonic() < deadline:
            time.sleep(0.05)
        assert page.reloads, "the first request never reached the reload action"

        busy = _exchange(
            page.port, _request("GET", "/api/status", page.port, {"Connection": "close"})
        )

        assert _statuses(busy) == [503], busy
        assert b"retry-after: 1" in busy.lower()
        page.release.set()
        assert _statuses(_read_all(holder, 10.0))[:1] == [200]
    finally:
        holder.close()
    assert _healthy(page)


def test_a_client_that_never_reads_a_large_file_is_dropped(tmp_path: Path) -> None:
    (tmp_path / "cam").mkdir()
    clip = tmp_path / "cam" / "clip.mp4"
    clip.write_bytes(b"\0" * (32 * 2**20))
    config = WebConfig(port=0, client_timeout_s=1.0)
    server = StatusServer(config, LiveView(), dict, lambda relative: tmp_path / relative)
    server.start()
    before = _rss_bytes()
    try:
        readers = []
        for _ in range(5):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(_request("GET", "/media/cam/clip.mp4", server.port))
            readers.append(sock)
        # client_timeout_s 1 s on a write nobody reads, and TCP_USER_TIMEOUT (its zero-window
        # probes back off: give it a few seconds) then fails the connection under hypercorn
        time.sleep(6.0)
        grown = _rss_bytes() - before
        request = _request("GET", "/healthz", server.port, {"Connection": "close"})
        assert _statuses(_exchange(server.port, request)) == [200]
        started = time.monotonic()
        for sock in readers:
            received = _read_all(sock, 20.0)  # what the buffers held, then the reset
            assert len(received) < 32 * 2**20
            sock.close()
        assert time.monotonic() - started < 15.0, "the silent readers were not dropped"
    finally:
        server.close()
    assert grown < RSS_BOUND_BYTES


def test_close_returns_promptly_with_clients_hanging(serve: Callable[..., Page]) -> None:
    page = serve(blocking_reload=True)
    hanging = [socket.create_connection(("127.0.0.1", page.port), timeout=30) for _ in range(3)]
    hanging[0].sendall(b"GET / HTTP/1.1\r\n")  # head never finished
    hanging[1].sendall(_request("POST", "/api/reload", page.port, {"Content-Length": "0"}))
    hanging[2].sendall(_request("GET", "/", page.port))  # kept alive afterwards
    deadline = time.monotonic() + 20
    while not page.reloads and time.monotonic() < deadline:
        time.sleep(0.05)
    port = page.port
    try:
        started = time.monotonic()
        page.server.close()
        took = time.monotonic() - started
    finally:
        for sock in hanging:
            sock.close()

    assert took < 8.0
    with pytest.raises(OSError):  # the port is released
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


# ---- HTTP/2 and upgrades ------------------------------------------------------------------------


def _h2_exchange(
    sock: socket.socket,
    connection: h2.connection.H2Connection,
    headers: list[tuple[str, str]],
    body: bytes | None,
    stream_id: int | None = None,
) -> tuple[int, bytes]:
    """One HTTP/2 request on `connection` (already initiated on `sock`): status and body."""
    if stream_id is None:
        stream_id = connection.get_next_available_stream_id()
        connection.send_headers(stream_id, headers, end_stream=body is None)
        if body is not None:
            connection.send_data(stream_id, body, end_stream=True)
    sock.sendall(connection.data_to_send())
    status, data = 0, b""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        chunk = sock.recv(65_536)
        if not chunk:
            break
        for event in connection.receive_data(chunk):
            if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream_id:
                status = int(dict(event.headers)[b":status"])
            elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id:
                data += event.data
                connection.acknowledge_received_data(event.flow_controlled_length, stream_id)
            elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                if event.stream_id == stream_id:
                    return status, data
        sock.sendall(connection.data_to_send())
    return status, data


def _h2_headers(
    port: int, method: str, path: str, *extra: tuple[str, str]
) -> list[tuple[str, str]]:
    return [
        (":method", method),
        (":path", path),
        (":scheme", "http"),
        (":authority", f"127.0.0.1:{port}"),
        *extra,
    ]


def test_http2_streams_pass_the_same_checks(serve: Callable[..., Page]) -> None:
    """hypercorn speaks cleartext HTTP/2 (prior knowledge); every stream meets the app."""
    page = serve(auth=_BASIC)
    with socket.create_connection(("127.0.0.1", page.port), timeout=15) as sock:
        connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        connection.initiate_connection()
        auth = ("authorization", _CREDENTIALS)
        anonymous = _h2_exchange(sock, connection, _h2_headers(page.port, "GET", "/"), None)
        status = _h2_exchange(
            sock, connection, _h2_headers(page.port, "GET", "/api/status", auth), None
        )
        big = _h2_exchange(
            sock,
            connection,
            _h2_headers(
                page.port, "POST", "/api/reload", auth, ("content-type", "application/json")
            ),
            b" " * 5_000 + b"{}",
        )
        cross = _h2_exchange(
            sock,
            connection,
            _h2_headers(page.port, "POST", "/api/reload", auth, ("origin", "http://evil.example")),
            None,
        )
        ok = _h2_exchange(
            sock, connection, _h2_headers(page.port, "POST", "/api/reload", auth), None
        )

    assert anonymous[0] == 401
    assert status[0] == 200 and json.loads(status[1])["schema"] == "edge-status-page/v1"
    assert big[0] == 413
    assert cross[0] == 403
    assert ok[0] == 200
    assert len(page.reloads) == 1


def test_an_h2c_upgrade_meets_auth_too(serve: Callable[..., Page]) -> None:
    page = serve(auth=_BASIC)
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    settings = connection.initiate_upgrade_connection() or b""
    upgrade = (
        f"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1:{page.port}\r\n"
        "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        f"HTTP2-Settings: {settings.decode()}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", page.port), timeout=15) as sock:
        sock.sendall(upgrade)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(1)
            if not chunk:
                break
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head
        status, _ = _h2_exchange(sock, connection, [], None, stream_id=1)

    assert status == 401
    assert page.reloads == []


def test_a_websocket_upgrade_is_refused(serve: Callable[..., Page]) -> None:
    page = serve()
    raw = _request(
        "GET",
        "/",
        page.port,
        {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": base64.b64encode(b"0123456789abcdef").decode(),
        },
    )

    answer = _exchange(page.port, raw, read_s=5.0)

    assert _statuses(answer)[:1] == [403], answer
    assert _healthy(page)


# ---- a real browser on another origin -----------------------------------------------------------

_ATTACKER_PAGE = """<!doctype html><html><body><div id="out">pending</div>
<iframe name="sink" style="display:none"></iframe>
<form id="form" method="post" action="TARGET/api/reload" target="sink" enctype="text/plain">
<input name="a" value="b"></form>
<img id="frame" src="TARGET/api/cameras/dock/frame.jpg">
<script>
const target = "TARGET";
const smuggled = "POST /api/reload HTTP/1.1\\r\\nHost: HOSTPORT\\r\\nContent-Length: 0\\r\\n\\r\\n";
const results = [];
async function attempt(name, init) {
  try { await fetch(target + "/api/reload", init); results.push(name + ":sent"); }
  catch (error) { results.push(name + ":failed"); }
}
const image = new Promise((resolve) => {
  const img = document.getElementById("frame");
  img.onload = () => resolve("loaded");
  img.onerror = () => resolve("blocked");
});
(async () => {
  await attempt("big", {method: "POST", mode: "no-cors", body: "x".repeat(65536) + smuggled});
  await attempt("small", {method: "POST", mode: "no-cors", body: smuggled});
  await attempt("empty", {method: "POST", mode: "no-cors", credentials: "include"});
  const json = {"Content-Type": "application/json"};
  await attempt("json", {method: "POST", body: "{}", headers: json});
  document.getElementById("form").submit();
  results.push("img:" + await image);
  await new Promise((resolve) => setTimeout(resolve, 500));
  document.getElementById("out").textContent = results.join(",");
})();
</script></body></html>
"""


def _camera_view() -> LiveView:
    """A view with one camera `dock` that has a frame."""
    import numpy as np

    from detection.detections import Detections
    from edge_agent.capture.frames import CapturedFrame
    from edge_agent.config.camera import CameraConfig
    from edge_agent.pipeline import FrameOutcome

    view = LiveView()
    view.set_cameras([CameraConfig.model_validate({"name": "dock", "url": "rtsp://x:9/y"})], ["a"])
    image = np.full((120, 160, 3), 70, np.uint8)
    frame = CapturedFrame("dock", 1, time.time(), time.monotonic(), image)
    view.observe(FrameOutcome("dock", frame, Detections.empty(), [], 0.0, 0.0, 0.0))
    return view


@pytest.mark.process
def test_a_page_on_another_origin_cannot_reload_or_embed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What the old server let through (a `no-cors` fetch whose body held a second request):
    from a page on another origin, Chromium's fetches, a form post and an <img> of a live frame."""
    if chromium_executable() is None:
        pytest.skip("chromium not installed (apt-get install chromium)")
    reloads: list[int] = []

    def reload() -> dict[str, object]:
        reloads.append(1)
        return {"ok": True, "message": "reloaded"}

    server = StatusServer(WebConfig(port=0), _camera_view(), dict, reload=reload)
    server.start()
    site = tmp_path / "site"
    site.mkdir()
    target = f"http://127.0.0.1:{server.port}"
    page = _ATTACKER_PAGE.replace("TARGET", target).replace("HOSTPORT", f"127.0.0.1:{server.port}")
    (site / "index.html").write_text(page)
    handler = partial(_QuietHandler, directory=str(site))
    attacker = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=attacker.serve_forever, daemon=True)
    thread.start()
    try:
        own = _exchange(
            server.port,
            _request("GET", "/api/cameras/dock/frame.jpg", server.port, {"Connection": "close"}),
        )
        assert _statuses(own) == [200]  # the frame is there to be embedded
        dom = chromium_dom(
            f"http://localhost:{attacker.server_address[1]}/index.html",
            virtual_time_budget_ms=8000,
        )
    finally:
        attacker.shutdown()
        attacker.server_close()
        server.close()

    outcome = re.search(r'<div id="out">([^<]*)</div>', dom)
    assert outcome is not None and outcome.group(1) != "pending", dom[-2000:]
    results = outcome.group(1).split(",")
    # Cross-Origin-Resource-Policy: the browser hands the page neither answers nor the frame
    assert results == ["big:failed", "small:failed", "empty:failed", "json:failed", "img:blocked"]
    answers = [
        r.getMessage().split(" ", 1)[1] for r in caplog.records if r.name == "edge_agent.web.app"
    ]
    # the requests did reach the agent, and each was refused from its head
    assert answers.count("POST /api/reload -> 403") == 3, answers  # small, empty, the form
    # a request hidden at byte 65,536, where the old server stopped reading (it ran there)
    assert "POST /api/reload -> 413" in answers
    assert "OPTIONS /api/reload -> 405" in answers  # the JSON post's preflight fails
    assert reloads == []


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_reload_slower_than_the_client_timeout_still_answers() -> None:
    """The timeouts bound what a client sends, not how long the agent takes to answer (a reload
    that loads a new model may take longer than `client_timeout_s`)."""

    def slow_reload() -> dict[str, object]:
        time.sleep(2.5)
        return {"ok": True, "message": "reloaded: new model"}

    config = WebConfig(port=0, client_timeout_s=1.0)
    with StatusServer(config, LiveView(), dict, reload=slow_reload) as server:
        headers = {"Content-Length": "0", "Connection": "close"}
        answer = _exchange(server.port, _request("POST", "/api/reload", server.port, headers))

    assert _statuses(answer) == [200], answer
    assert answer.endswith(b'"message":"reloaded: new model"}')


def test_a_taken_port_fails_start_with_os_error(serve: Callable[..., Page]) -> None:
    page = serve()
    second = StatusServer(WebConfig(port=page.port), LiveView(), dict)

    with pytest.raises(OSError):
        second.start()
    assert _healthy(page)


@pytest.mark.parametrize(("authority", "expected"), [("localhost", 200), ("evil.example", 400)])
def test_http2_authority_is_the_host_checked(
    serve: Callable[..., Page], authority: str, expected: int
) -> None:
    page = serve()  # no auth, on loopback: loopback names only
    headers = [(":method", "GET"), (":path", "/api/status"), (":scheme", "http")]
    with socket.create_connection(("127.0.0.1", page.port), timeout=15) as sock:
        connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        connection.initiate_connection()
        status, _ = _h2_exchange(
            sock, connection, [*headers, (":authority", f"{authority}:{page.port}")], None
        )

    assert status == expected


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"max_request_head_bytes": 512}, "greater than or equal to 1024"),
        ({"max_request_body_bytes": -1}, "greater than or equal to 0"),
        ({"max_request_body_bytes": 2**21}, "less than or equal to 1048576"),
        ({"max_concurrent_requests": 0}, "greater than or equal to 1"),
        ({"client_timeout_s": 0}, "greater than 0"),
        ({"allowed_hosts": ["edge-01.lan:8480/x"]}, "should match pattern"),
        ({"allowed_hosts": [""]}, "at least 1 character"),
        ({"allowed_hosts": ["edge-01.lan", "[::1]", "192.168.1.5"]}, None),
    ],
)
def test_the_limits_are_bounded_in_config(settings: dict[str, Any], error: str | None) -> None:
    if error is None:
        WebConfig.model_validate(settings)
    else:
        with pytest.raises(pydantic.ValidationError, match=re.escape(error)):
            WebConfig.model_validate(settings)
