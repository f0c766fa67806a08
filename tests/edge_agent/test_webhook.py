"""The webhook sink against a real local HTTP server (stdlib, port 0) that records every request
and answers from a script; its pure parts (back-off, Retry-After, proxies, filters) by table."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pydantic
import pytest

from configkit.secrets import SecretError
from edge_agent.alerts.payload import event_payload
from edge_agent.alerts.sinks import AlertSink, EventContext
from edge_agent.alerts.webhook import (
    WebhookSink,
    WebhookStats,
    backoff_s,
    bypasses_proxy,
    classify_status,
    parse_retry_after,
    proxy_for,
)
from edge_agent.config.webhook import WebhookConfig, WebhookFilters
from edge_agent.rules.events import Phase, RuleEvent, RuleKind

TOKEN = "Bearer t0ken-value"  # noqa: S105 (a test value)
SIGNING_KEY = "s3cret-signing-key"
ENVIRON = {"WEBHOOK_TOKEN": TOKEN, "WEBHOOK_KEY": SIGNING_KEY}


@dataclass(frozen=True)
class Received:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    at_s: float


@dataclass
class Answer:
    """What the server answers to one request."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)


class Receiver:
    """A real HTTP server on 127.0.0.1 that records requests and answers `script` in turn
    (then 200); one request at a time, as a receiver sees an ordered stream."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[Received] = []
        self.script: deque[Answer] = deque()
        self._arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._arrived:
                    answer = receiver.script.popleft() if receiver.script else Answer()
                    receiver.requests.append(
                        Received(
                            self.command,
                            self.path,
                            {name.lower(): value for name, value in self.headers.items()},
                            body,
                            time.monotonic(),
                        )
                    )
                    receiver._arrived.notify_all()
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                reply = b"nope: bad request" if answer.status >= 400 else b"ok"
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook/abc-path-token"

    def wait_for(self, count: int, timeout_s: float = 5.0) -> list[Received]:
        """The first `count` requests, once they arrived."""
        with self._arrived:
            assert self._arrived.wait_for(lambda: len(self.requests) >= count, timeout_s), (
                f"expected {count} request(s), got {len(self.requests)}"
            )
            return list(self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _config(url: str, **overrides: Any) -> WebhookConfig:
    settings: dict[str, Any] = {
        "url": url,
        "timeout_s": 2.0,
        "min_backoff_s": 0.01,
        "max_backoff_s": 0.05,
    }
    settings.update(overrides)
    return WebhookConfig.model_validate(settings)


def _event(
    index: int, rule: str = "door-enter", kind: RuleKind = "zone_enter", phase: Phase = "start"
) -> tuple[EventContext, dict[str, object]]:
    event = RuleEvent(
        rule=rule,
        kind=kind,
        camera="cam-1",
        track_id=index,
        class_id=0,
        timestamp_s=1_764_485_750.0 + index,
        box=(10.0, 20.0, 110.0, 220.0),
        phase=phase,
        zone="door",
        label="person",
        frame_size=(1920, 1080),
    )
    event_id = f"event-{index}"
    return EventContext(event, event_id), event_payload(event, "edge-01", event_id)


def _wait(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _settled(sink: WebhookSink, count: int) -> Callable[[], bool]:
    def settled() -> bool:
        stats = sink.stats()
        return stats.sent + stats.failed + stats.dropped >= count

    return settled


# -- against a real server -----------------------------------------------------------------------


def test_delivers_in_order_with_the_exact_payload(receiver: Receiver) -> None:
    config = _config(
        receiver.url, headers={"Authorization": {"env": "WEBHOOK_TOKEN"}, "X-Site": "a"}
    )
    sink = WebhookSink(config, environ=ENVIRON)
    assert isinstance(sink, AlertSink)
    events = [_event(index) for index in range(10)]
    sink.start()
    for context, payload in events:
        sink.deliver(context, payload)
    requests = receiver.wait_for(10)
    sink.close(5.0)

    assert [json.loads(request.body) for request in requests] == [p for _, p in events]
    first = requests[0]
    assert first.method == "POST"
    assert first.path == "/hook/abc-path-token"
    assert first.body == json.dumps(events[0][1], separators=(",", ":")).encode()
    assert first.headers["content-type"] == "application/json"
    assert first.headers["user-agent"].startswith("edge-agent/")
    assert first.headers["authorization"] == TOKEN
    assert first.headers["x-site"] == "a"
    assert "x-edge-signature" not in first.headers
    assert sink.stats() == WebhookStats(sent=10)


def test_filters_send_only_matching_events(receiver: Receiver) -> None:
    filters = {"rules": ["door-enter", "dock-loiter"], "phases": ["start", "end"]}
    sink = WebhookSink(_config(receiver.url, filters=filters), environ={})
    sent = [
        _event(1, "door-enter", "zone_enter", "start"),
        _event(2, "dock-loiter", "loiter", "end"),
    ]
    left_out = [
        _event(3, "other-rule", "zone_enter", "start"),
        _event(4, "dock-loiter", "loiter", "update"),
        _event(5, "door-enter", "zone_enter", "retract"),
    ]
    with sink:
        for context, payload in [left_out[0], sent[0], left_out[1], left_out[2], sent[1]]:
            sink.deliver(context, payload)
        _wait(_settled(sink, 2))
    assert [json.loads(r.body)["event_id"] for r in receiver.requests] == ["event-1", "event-2"]


def test_signature_verifies_with_the_shared_secret(receiver: Receiver) -> None:
    config = _config(receiver.url, signing_secret={"env": "WEBHOOK_KEY"})
    with WebhookSink(config, environ=ENVIRON) as sink:
        sink.deliver(*_event(1))
        (request,) = receiver.wait_for(1)
    scheme, _, digest = request.headers["x-edge-signature"].partition("=")
    expected = hmac.new(SIGNING_KEY.encode(), request.body, hashlib.sha256).hexdigest()
    assert scheme == "sha256"
    assert hmac.compare_digest(digest, expected)
    wrong = hmac.new(b"another key", request.body, hashlib.sha256).hexdigest()
    assert not hmac.compare_digest(digest, wrong)


@pytest.mark.parametrize("status", [500, 502, 503, 408, 429])
def test_a_retryable_answer_is_retried_and_delivered_once(receiver: Receiver, status: int) -> None:
    receiver.script.append(Answer(status))
    with WebhookSink(_config(receiver.url), environ={}) as sink:
        sink.deliver(*_event(1))
        sink.deliver(*_event(2))
        requests = receiver.wait_for(3)
        _wait(_settled(sink, 2))
    assert [json.loads(r.body)["event_id"] for r in requests] == ["event-1", "event-1", "event-2"]
    assert requests[0].body == requests[1].body
    assert sink.stats() == WebhookStats(sent=2, retried=1)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422, 302, 307])
def test_a_refusal_is_not_retried(
    receiver: Receiver, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.script.append(Answer(status, {"Location": f"http://127.0.0.1:{receiver.port}/x"}))
    config = _config(receiver.url, headers={"Authorization": {"env": "WEBHOOK_TOKEN"}})
    with caplog.at_level(logging.INFO, "edge_agent.alerts.webhook"):
        with WebhookSink(config, environ=ENVIRON) as sink:
            sink.deliver(*_event(1))
            sink.deliver(*_event(2))
            _wait(_settled(sink, 2))
    assert [json.loads(r.body)["event_id"] for r in receiver.requests] == ["event-1", "event-2"]
    assert [r.path for r in receiver.requests] == ["/hook/abc-path-token"] * 2  # no redirect
    assert sink.stats() == WebhookStats(sent=1, failed=1)
    assert f"HTTP {status}" in caplog.text and "not retried" in caplog.text
    assert "abc-path-token" not in caplog.text and TOKEN not in caplog.text


def test_retry_after_is_honoured(receiver: Receiver) -> None:
    receiver.script.append(Answer(429, {"Retry-After": "1"}))
    config = _config(receiver.url, min_backoff_s=0.01, max_backoff_s=5.0)
    with WebhookSink(config, environ={}) as sink:
        sink.deliver(*_event(1))
        first, second = receiver.wait_for(2)
    assert 0.95 <= second.at_s - first.at_s < 2.0
    assert sink.stats() == WebhookStats(sent=1, retried=1)


def test_retry_after_is_capped_by_max_backoff(receiver: Receiver) -> None:
    receiver.script.extend([Answer(503, {"Retry-After": "3600"}), Answer(503), Answer(500)])
    waits: list[float] = []
    config = _config(receiver.url, min_backoff_s=0.01, max_backoff_s=0.03)
    with WebhookSink(config, environ={}, sleep=waits.append) as sink:
        sink.deliver(*_event(1))
        _wait(_settled(sink, 1))
    assert waits == [0.03, 0.02, 0.03]  # capped Retry-After, then the back-off (capped)
    assert sink.stats() == WebhookStats(sent=1, retried=3)


def test_a_full_queue_drops_the_oldest_and_counts(receiver: Receiver) -> None:
    sink = WebhookSink(_config(receiver.url, max_queue=3), environ={})
    for index in range(5):  # not started: nothing leaves the queue
        sink.deliver(*_event(index))
    assert sink.stats() == WebhookStats(dropped=2, queued=3)
    with sink:
        requests = receiver.wait_for(3)
        _wait(_settled(sink, 5))
    assert [json.loads(r.body)["event_id"] for r in requests] == ["event-2", "event-3", "event-4"]
    assert sink.stats() == WebhookStats(sent=3, dropped=2)


def test_a_server_down_at_first_gets_the_events_once_up() -> None:
    port = _free_port()
    config = _config(
        f"http://127.0.0.1:{port}/hook", max_attempts=40, min_backoff_s=0.02, max_backoff_s=0.05
    )
    with WebhookSink(config, environ={}) as sink:
        sink.deliver(*_event(1))
        sink.deliver(*_event(2))
        _wait(lambda: sink.stats().retried >= 3)
        receiver = Receiver(port)
        try:
            requests = receiver.wait_for(2)
            _wait(_settled(sink, 2))
        finally:
            receiver.close()
    assert [json.loads(r.body)["event_id"] for r in requests] == ["event-1", "event-2"]
    assert sink.stats().sent == 2 and sink.stats().failed == 0


def test_gives_up_after_max_attempts() -> None:
    config = _config(f"http://127.0.0.1:{_free_port()}/hook", max_attempts=3)
    with WebhookSink(config, environ={}) as sink:
        sink.deliver(*_event(1))
        _wait(_settled(sink, 1))
    assert sink.stats() == WebhookStats(failed=1, retried=2)


def test_close_drains_the_queue_within_its_bound(receiver: Receiver) -> None:
    sink = WebhookSink(_config(receiver.url), environ={})
    sink.start()
    for index in range(30):
        sink.deliver(*_event(index))
    sink.close(5.0)
    assert len(receiver.requests) == 30
    assert sink.stats() == WebhookStats(sent=30)
    with pytest.raises(RuntimeError, match="closed"):
        sink.deliver(*_event(31))


@pytest.mark.parametrize("dead", ["refusing", "silent"])
def test_close_returns_in_time_on_a_dead_server(dead: str) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        if dead == "silent":
            listener.listen(8)  # connects, never answers: each request waits out its timeout
        port = listener.getsockname()[1]
        config = _config(f"http://127.0.0.1:{port}/hook", max_attempts=100, timeout_s=3.0)
        sink = WebhookSink(config, environ={})
        sink.start()
        for index in range(5):
            sink.deliver(*_event(index))
        time.sleep(0.1)
        started = time.monotonic()
        sink.close(0.3)
        assert time.monotonic() - started < 0.8
    stats = sink.stats()
    assert stats.sent == 0 and stats.queued == 0
    assert stats.dropped >= 4  # the one in flight may still be settling in the background


@pytest.mark.parametrize(
    "secrets",
    [
        {"headers": {"Authorization": {"env": "MISSING_TOKEN"}}},
        {"signing_secret": {"env": "MISSING_KEY"}},
        {"signing_secret": {"credential": "webhook-key"}},
    ],
)
def test_a_missing_secret_raises_at_construction(secrets: dict[str, Any]) -> None:
    with pytest.raises(SecretError):
        WebhookSink(_config("https://hooks.example/in", **secrets), environ=ENVIRON)


def test_a_secret_header_with_a_line_break_is_refused() -> None:
    config = _config("https://hooks.example/in", headers={"Authorization": {"env": "T"}})
    with pytest.raises(SecretError, match="environment variable T") as raised:
        WebhookSink(config, environ={"T": "Bearer x\r\nX-Evil: 1"})
    assert "Bearer" not in str(raised.value)


def test_a_proxy_named_by_the_environment_is_used(receiver: Receiver) -> None:
    proxy = f"http://127.0.0.1:{receiver.port}"
    config = _config("http://hooks.example.invalid/in")
    with WebhookSink(config, environ={"http_proxy": proxy}) as sink:
        sink.deliver(*_event(1))
        (request,) = receiver.wait_for(1)
    assert request.path == "http://hooks.example.invalid/in"  # the absolute form: a proxy request


def test_no_proxy_reaches_the_server_directly(receiver: Receiver) -> None:
    dead_proxy = f"http://127.0.0.1:{_free_port()}"
    environ = {"HTTP_PROXY": dead_proxy, "NO_PROXY": "localhost,127.0.0.0/8"}
    with WebhookSink(_config(receiver.url, max_attempts=1), environ=environ) as sink:
        sink.deliver(*_event(1))
        (request,) = receiver.wait_for(1)
    assert request.path == "/hook/abc-path-token"


# -- pure parts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "verdict"),
    [(200, "delivered"), (204, "delivered"), (408, "retry"), (429, "retry"), (500, "retry")]
    + [(503, "retry"), (599, "retry"), (301, "failed"), (400, "failed"), (404, "failed")]
    + [(410, "failed"), (100, "failed")],
)
def test_classify_status(status: int, verdict: str) -> None:
    assert classify_status(status) == verdict


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_s(retry, 0.5, 5.0) for retry in range(1, 7)] == [0.5, 1, 2, 4, 5, 5]
    assert backoff_s(10_000, 0.5, 5.0) == 5.0
    with pytest.raises(ValueError, match="at least 1"):
        backoff_s(0, 0.5, 5.0)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("1", 1.0), (" 120 ", 120.0), ("0", 0.0), ("1.5", 1.5), (None, None), ("-1", None)]
    + [("nan", None), ("inf", None), ("Wed, 21 Oct 2026 07:28:00 GMT", None)],
)
def test_parse_retry_after(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header) == seconds


@pytest.mark.parametrize(
    ("url", "environ", "proxy"),
    [
        ("https://h.example/x", {}, None),
        ("https://h.example/x", {"http_proxy": "http://p:3128"}, None),
        ("https://h.example/x", {"HTTPS_PROXY": "http://p:3128"}, "http://p:3128"),
        (
            "https://h.example/x",
            {"https_proxy": "http://a:1", "HTTPS_PROXY": "http://b:1"},
            "http://a:1",
        ),
        ("http://h.example/x", {"http_proxy": "http://p:3128", "no_proxy": "*"}, None),
        (
            "http://h.example/x",
            {"http_proxy": "http://p:3128", "no_proxy": "xample"},  # not on a dot
            "http://p:3128",
        ),
        ("http://a.h.example/x", {"http_proxy": "http://p", "no_proxy": ".h.example"}, None),
        ("http://a.h.example/x", {"http_proxy": "http://p", "no_proxy": "example"}, None),
        ("http://h.example:8080/x", {"http_proxy": "http://p", "no_proxy": "h.example:8080"}, None),
        (
            "http://h.example/x",
            {"http_proxy": "http://p", "no_proxy": "h.example:8080"},
            "http://p",
        ),
        ("http://10.1.2.3/x", {"http_proxy": "http://p", "NO_PROXY": "10.0.0.0/8"}, None),
        ("http://[::1]:9/x", {"http_proxy": "http://p", "no_proxy": "::1"}, None),
        ("http://h.example/x", {"http_proxy": ""}, None),
    ],
)
def test_proxy_for(url: str, environ: dict[str, str], proxy: str | None) -> None:
    assert proxy_for(url, environ) == proxy


def test_bypasses_proxy_ignores_blank_entries() -> None:
    assert not bypasses_proxy("h.example", 80, " , ,")
    assert bypasses_proxy("H.Example", 80, "other, h.example ")


@pytest.mark.parametrize(
    ("filters", "accepted"),
    [
        ({}, True),
        ({"rules": ["door-enter"]}, True),
        ({"rules": ["other"]}, False),
        ({"kinds": ["zone_enter", "loiter"]}, True),
        ({"kinds": ["loiter"]}, False),
        ({"phases": ["end"]}, False),
        ({"rules": ["door-enter"], "kinds": ["zone_enter"], "phases": ["start"]}, True),
        ({"rules": ["door-enter"], "kinds": ["zone_enter"], "phases": ["end"]}, False),
    ],
)
def test_filters_accept(filters: dict[str, list[str]], accepted: bool) -> None:
    rules = WebhookFilters.model_validate(filters)
    assert rules.accepts("door-enter", "zone_enter", "start") is accepted


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"url": "ftp://h.example/x"}, "should match pattern"),
        ({"url": "https://user:pw@h.example/x"}, "no credentials in the URL"),
        ({"url": "https://h.example/x#frag"}, "fragment"),
        ({"url": "https://h.example:99999/x"}, "bad port"),
        ({"headers": {"Content-Type": "text/plain"}}, "set by the agent"),
        ({"headers": {"x-edge-signature": "x"}}, "set by the agent"),
        ({"headers": {"X-A": "1", "x-a": "2"}}, "given twice"),
        ({"headers": {"Bad Name": "x"}}, "should match pattern"),
        ({"headers": {"X-A": "a\r\nX-B: b"}}, "no line breaks"),
        ({"headers": {"X-A": {"env": "A", "credential": "b"}}}, "exactly one"),
        ({"filters": {"kinds": ["teleport"]}}, "unknown rule kind"),
        ({"filters": {"phases": ["middle"]}}, "'start', 'update', 'end' or 'retract'"),
        ({"filters": {"rules": ["no/slash"]}}, "should match pattern"),
        ({"min_backoff_s": 5.0, "max_backoff_s": 1.0}, "must not exceed"),
        ({"max_queue": 0}, "greater than or equal to 1"),
        ({"timeout_s": 0}, "greater than 0"),
        ({"retries": 3}, "Extra inputs"),
    ],
)
def test_config_rejects(settings: dict[str, Any], error: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=error):
        WebhookConfig.model_validate({"url": "https://h.example/x", **settings})


def test_config_defaults() -> None:
    config = WebhookConfig(url="https://h.example/x")
    assert (config.timeout_s, config.max_queue, config.max_attempts) == (5.0, 1000, 5)
    assert config.headers == {} and config.signing_secret is None
    assert config.filters.accepts("any", "loiter", "update")
    for name, info in WebhookConfig.model_fields.items():
        assert info.description, name
