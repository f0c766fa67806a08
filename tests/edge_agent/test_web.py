"""The status page: a real agent on the `events` scene behind the real HTTP server and Chromium;
auth, media paths and escaping against a view fed by hand."""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pydantic
import pytest

from configkit.secrets import SecretError
from detection.detections import Detections
from edge_agent.alerts.sinks import EventContext
from edge_agent.capture.frames import CapturedFrame
from edge_agent.config import EdgeAgentConfig
from edge_agent.config.camera import CameraConfig
from edge_agent.config.web import WebConfig
from edge_agent.pipeline import EdgeAgent, FrameOutcome
from edge_agent.rules import RuleEvent
from edge_agent.web import LiveView, StatusServer, attach_status_page
from testbed.alert_check import SCENE_CAMERA, scene_agent_config
from testbed.broker import mosquitto_executable
from testbed.scenes.writer import SceneFolder
from testbed.status_page_shot import (
    chromium_dom,
    chromium_executable,
    chromium_screenshot,
)
from tests.fixtures.mqtt import MosquittoBroker
from tests.fixtures.scenes import scene_video

REPO_ROOT = Path(__file__).resolve().parents[2]
EDGE_MODEL = REPO_ROOT / "models" / "edge" / "edge-yolov5n-320-int8.tflite"
CLASS_NAMES = ["person", "car", "truck", "forklift"]
SCENE_RULES = {"enter-zone-a", "exit-zone-a", "loiter-zone-a", "cross-line-a"}
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str, headers: Mapping[str, str] | None = None) -> tuple[int, Any, bytes]:
    """Status, headers and body of a GET through urllib (errors are answers too)."""
    request = urllib.request.Request(url, headers=dict(headers or {}))  # noqa: S310 (http only)
    try:
        with _NO_PROXY.open(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def _raw(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    """A request with `path` sent exactly as written (no client-side normalisation)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


# ---- a real agent on the events scene ----------------------------------------------------------


@dataclass
class LivePage:
    server: StatusServer
    agent: EdgeAgent


@pytest.fixture(scope="module")
def live_page(
    events_scene: SceneFolder, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LivePage]:
    """The agent on the events scene (looping, so the camera stays live) with its status page
    on a free port and event snapshots written by the media store."""
    executable = mosquitto_executable()
    if executable is None:
        pytest.skip("mosquitto binary not found (apt-get install mosquitto)")
    work = tmp_path_factory.mktemp("web")
    broker = MosquittoBroker(work, executable=executable)
    broker.start()
    document = scene_agent_config(
        events_scene.root,
        camera_url=str(scene_video(events_scene)),
        model_path=EDGE_MODEL,
        class_names=CLASS_NAMES,
        mqtt_port=broker.port,
        outbox_path=work / "outbox.sqlite3",
        loop_file=True,
    )
    document["media"] = {"enabled": True, "directory": str(work / "media")}
    agent = EdgeAgent.from_config(EdgeAgentConfig.model_validate(document))
    assert agent.media is not None
    server = attach_status_page(
        agent, WebConfig(enabled=True, port=0), media_resolver=agent.media.resolve
    )
    assert server is not None
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    agent.start()
    runner.start()
    try:
        yield LivePage(server, agent)
    finally:
        stop.set()
        runner.join(10)
        server.close()
        agent.close(flush_timeout_s=2.0)
        broker.stop()


def _wait_for_report(
    page: LivePage, ready: Callable[[dict[str, Any]], bool], timeout_s: float = 40.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    report: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status, _, body = _get(page.server.url + "api/status")
        assert status == 200, body
        report = json.loads(body)
        if ready(report):
            return report
        time.sleep(0.25)
    raise AssertionError(f"the status page never got ready: {json.dumps(report)[:2000]}")


def _live_with_events(report: Mapping[str, Any]) -> bool:
    (camera,) = report["cameras"]
    status = camera["status"] or {}
    return (
        status.get("state") == "streaming"
        and status.get("frames_analysed", 0) > 10
        and camera["frame"] is not None
        and len(report["events"]) >= 3
    )


def test_status_api_shows_the_streaming_camera_and_its_events(live_page: LivePage) -> None:
    report = _wait_for_report(live_page, _live_with_events)

    assert report["schema"] == "edge-status-page/v1"
    assert report["agent"] == "scene-agent"
    (camera,) = report["cameras"]
    assert camera["name"] == SCENE_CAMERA
    assert camera["status"]["schema"] == "edge-camera-status/v1"
    assert camera["status"]["cloud"] == "off"
    assert camera["status"]["fps"] > 0
    assert camera["frame"]["width"] == 640 and camera["frame"]["height"] == 360
    assert camera["frame"]["url"].startswith(f"/api/cameras/{SCENE_CAMERA}/frame.jpg?f=")
    for entry in report["events"]:
        event = entry["event"]
        assert event["schema"] == "edge-alert/v1"
        assert event["camera"] == SCENE_CAMERA
        assert event["rule"] in SCENE_RULES
        assert event["label"] in CLASS_NAMES
        assert entry["links"]["snapshot"] == "/media/" + event["media"]["snapshot"]["path"]
    stamps = [entry["event"]["timestamp"] for entry in report["events"]]
    assert stamps == sorted(stamps, reverse=True)  # newest first


def test_live_frame_decodes_to_the_frame_size(live_page: LivePage) -> None:
    _wait_for_report(live_page, lambda r: r["cameras"][0]["frame"] is not None)

    status, headers, body = _get(live_page.server.url + f"api/cameras/{SCENE_CAMERA}/frame.jpg")

    assert status == 200
    assert headers["Content-Type"] == "image/jpeg"
    assert int(headers["X-Frame-Index"]) >= 0
    image = cv2.imdecode(np.frombuffer(body, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and image.shape == (360, 640, 3)
    assert _get(live_page.server.url + "api/cameras/nope/frame.jpg")[0] == 404


def test_event_snapshots_are_served_from_the_media_store(live_page: LivePage) -> None:
    report = _wait_for_report(live_page, _live_with_events)
    link = report["events"][-1]["links"]["snapshot"]  # the oldest: written long ago

    status, headers, body = _get(live_page.server.url + link.lstrip("/"))

    assert status == 200, body
    assert headers["Content-Type"] == "image/jpeg"
    image = cv2.imdecode(np.frombuffer(body, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and image.shape == (360, 640, 3)


@pytest.mark.process
def test_chromium_renders_the_live_page(live_page: LivePage, tmp_path: Path) -> None:
    if chromium_executable() is None:
        pytest.skip(
            "chromium not installed (apt-get install chromium; scripts/install-system-deps)"
        )
    _wait_for_report(live_page, _live_with_events)

    png = chromium_screenshot(live_page.server.url, tmp_path / "page.png")
    dom = chromium_dom(live_page.server.url)

    image = cv2.imread(str(png), cv2.IMREAD_COLOR)
    assert image is not None and image.shape == (900, 1280, 3)
    assert float(image.std()) > 20.0  # not a blank page
    colours = np.unique(image.reshape(-1, 3), axis=0)
    assert len(colours) > 1_000  # the live frame is in it, not only text on white
    assert f'data-camera="{SCENE_CAMERA}"' in dom
    assert f'src="/api/cameras/{SCENE_CAMERA}/frame.jpg?f=' in dom
    assert ">streaming<" in dom
    assert 'src="/media/' in dom  # event thumbnails
    assert any(f">{rule}<" in dom for rule in SCENE_RULES)


# ---- auth, routes, media and escaping, on a view fed by hand -----------------------------------

_CAMERA = CameraConfig.model_validate(
    {
        "name": "dock",
        "url": "rtsp://127.0.0.1:9/x",
        "zones": [{"name": "bay", "points": [[0.1, 0.5], [0.5, 0.5], [0.5, 0.9], [0.1, 0.9]]}],
    }
)
_IDLE = CameraConfig.model_validate({"name": "idle", "url": "rtsp://127.0.0.1:9/y"})


def _outcome(index: int) -> FrameOutcome:
    image = np.full((120, 160, 3), 70, np.uint8)
    frame = CapturedFrame("dock", index, 1_780_000_000.0 + index, time.monotonic(), image)
    detections = Detections(
        xyxy=np.array([[10.0, 20.0, 60.0, 100.0]]),
        confidence=np.array([0.9]),
        class_id=np.array([0]),
        tracker_id=np.array([7]),
    )
    return FrameOutcome("dock", frame, detections, [], 0.0, 0.0, 0.0)


def _event_payload(label: str, media_path: str | None) -> dict[str, object]:
    payload: dict[str, object] = {
        "schema": "edge-alert/v1",
        "event_id": "e1",
        "phase": "start",
        "rule": "enter-bay",
        "kind": "zone_enter",
        "camera": "dock",
        "track_id": 7,
        "label": label,
        "timestamp": "2026-12-02T10:00:00.000Z",
    }
    if media_path is not None:
        payload["media"] = {"snapshot": {"path": media_path, "url": f"/media/{media_path}"}}
    return payload


def _context() -> EventContext:
    event = RuleEvent("enter-bay", "zone_enter", "dock", 7, 0, 1_780_000_000.0, None)
    return EventContext(event, "e1")


@pytest.fixture
def media_root(tmp_path: Path) -> Path:
    root = tmp_path / "media"
    (root / "dock").mkdir(parents=True)
    (root / "dock" / "snap.jpg").write_bytes(b"\xff\xd8jpeg")
    (root / "dock" / "clip.mp4").write_bytes(b"mp4")
    (root / "dock" / ".tmp-snap.jpg").write_bytes(b"\xff\xd8half")
    (tmp_path / "secret.txt").write_text("do not serve")
    return root


def _serve(
    config: WebConfig,
    media_root: Path | None = None,
    environ: Mapping[str, str] | None = None,
    status: Mapping[str, Mapping[str, object]] | None = None,
) -> StatusServer:
    view = LiveView()
    view.set_cameras([_CAMERA, _IDLE], CLASS_NAMES)
    view.observe(_outcome(3))
    view.deliver(_context(), _event_payload("person", "dock/snap.jpg"))
    documents = status if status is not None else {"dock": {"state": "streaming"}}
    # a deliberately naive resolver: the server alone must keep requests inside the store
    resolver = None if media_root is None else (lambda relative: media_root / relative)
    server = StatusServer(config, view, lambda: documents, resolver, environ=environ)
    server.start()
    return server


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Callable[..., StatusServer]]:
    servers: list[StatusServer] = []

    def serve(*args: Any, **kwargs: Any) -> StatusServer:
        servers.append(_serve(*args, **kwargs))
        return servers[-1]

    yield serve
    for server in servers:
        server.close()


def _basic(user: str, password: str) -> dict[str, str]:
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {pair}"}


_BASIC = {"type": "basic", "username": "viewer", "password": {"env": "WEB_PASSWORD"}}
_BEARER = {"type": "bearer", "token": {"env": "WEB_TOKEN"}}
_SECRETS = {"WEB_PASSWORD": "s3cret:pass", "WEB_TOKEN": "tok-123"}


@pytest.mark.parametrize(
    ("auth", "headers", "expected"),
    [
        (None, {}, 200),
        (_BASIC, {}, 401),
        (_BASIC, _basic("viewer", "wrong"), 401),
        (_BASIC, _basic("someone", "s3cret:pass"), 401),
        (_BASIC, {"Authorization": "Basic !!notbase64"}, 401),
        (_BASIC, {"Authorization": "Bearer s3cret:pass"}, 401),
        (_BASIC, _basic("viewer", "s3cret:pass"), 200),
        (_BEARER, {}, 401),
        (_BEARER, {"Authorization": "Bearer wrong"}, 401),
        (_BEARER, _basic("viewer", "tok-123"), 401),
        (_BEARER, {"Authorization": "Bearer tok-123"}, 200),
        (_BEARER, {"Authorization": "bearer  tok-123 "}, 200),
    ],
)
def test_auth_guards_every_route_but_healthz(
    served: Callable[..., StatusServer],
    media_root: Path,
    auth: dict[str, Any] | None,
    headers: dict[str, str],
    expected: int,
) -> None:
    server = served(WebConfig(port=0, auth=auth), media_root, environ=_SECRETS)
    routes = ["", "api/status", "api/cameras/dock/frame.jpg", "media/dock/snap.jpg"]

    answers = {route: _get(server.url + route, headers) for route in routes}

    assert {route: a[0] for route, a in answers.items()} == dict.fromkeys(routes, expected)
    if expected == 401:
        challenge = answers[""][1]["WWW-Authenticate"]
        assert challenge.startswith("Basic realm=" if auth is _BASIC else "Bearer realm=")
    assert _get(server.url + "healthz")[:1] == (200,)


def test_an_unavailable_secret_stops_the_server_from_starting() -> None:
    config = WebConfig(port=0, auth=_BEARER)
    with pytest.raises(SecretError, match="WEB_TOKEN"):
        StatusServer(config, LiveView(), dict, environ={})


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/media/dock/snap.jpg", 200),
        ("/media/dock/clip.mp4", 200),
        ("/media/../secret.txt", 404),
        ("/media/%2e%2e/secret.txt", 404),
        ("/media/dock/..%2F..%2Fsecret.txt", 404),
        ("/media/dock/%2e%2e/%2e%2e/secret.txt", 404),
        ("/media/%2Fetc%2Fpasswd", 404),
        ("/media//etc/passwd", 404),
        ("/media/dock\\..\\..\\secret.txt", 404),
        ("/media/dock/snap.jpg%00.png", 404),
        ("/media/./dock/snap.jpg", 404),
        ("/media/dock/.tmp-snap.jpg", 404),  # being written
        ("/media/dock/missing.jpg", 404),
        ("/media/dock", 404),
        ("/media/", 404),
        ("/nope", 404),
        ("/api/cameras/dock/../../media/dock/snap.jpg", 404),
        ("/api/cameras/unknown/frame.jpg", 404),
        ("/api/cameras/dock%2Fx/frame.jpg", 404),
        ("/api/cameras//frame.jpg", 404),
        ("/api/cameras/idle/frame.jpg", 503),  # configured, no frame yet
        ("/api/cameras/dock/frame.jpg?f=3", 200),
    ],
)
def test_only_known_routes_and_plain_media_paths_are_served(
    served: Callable[..., StatusServer], media_root: Path, path: str, expected: int
) -> None:
    server = served(WebConfig(port=0), media_root)

    status, body = _raw(server.port, path)

    assert status == expected, body
    assert b"do not serve" not in body


@pytest.mark.parametrize(
    ("path", "content_type"),
    [("/media/dock/snap.jpg", "image/jpeg"), ("/media/dock/clip.mp4", "video/mp4")],
)
def test_media_has_its_content_type(
    served: Callable[..., StatusServer], media_root: Path, path: str, content_type: str
) -> None:
    server = served(WebConfig(port=0), media_root)

    status, headers, body = _get(server.url + path.lstrip("/"))

    assert (status, headers["Content-Type"]) == (200, content_type)
    assert body == (media_root / path.removeprefix("/media/")).read_bytes()
    assert _raw(server.port, path, "HEAD") == (200, b"")


def test_media_is_404_without_a_resolver(served: Callable[..., StatusServer]) -> None:
    server = served(WebConfig(port=0))

    assert _raw(server.port, "/media/dock/snap.jpg")[0] == 404
    report = json.loads(_get(server.url + "api/status")[2])
    # no resolver: the payload's own (site-absolute) URL is the link
    assert report["events"][0]["links"]["snapshot"] == "/media/dock/snap.jpg"


def test_names_and_texts_are_escaped_in_the_page(served: Callable[..., StatusServer]) -> None:
    hostile = "<script>alert(1)</script>"
    status = {
        "dock": {"state": "stalled", "reason": hostile, "last_error": f'"{hostile}'},
        "x<y>": {"state": "error"},
    }
    server = served(WebConfig(port=0), status=status)
    server.view.deliver(_context(), _event_payload(hostile, None))

    code, headers, body = _get(server.url)
    page = body.decode()

    assert code == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert hostile not in page and "x<y>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'data-camera="x&lt;y&gt;"' in page
    assert "script-src 'sha256-" in headers["Content-Security-Policy"]
    assert page.count("<script>") == 1  # only the page's own


def test_live_view_draws_and_encodes_each_frame_once() -> None:
    view = LiveView(jpeg_quality=90)
    view.set_cameras([_CAMERA], CLASS_NAMES)
    assert view.frame_jpeg("dock") is None
    view.observe(_outcome(1))

    first = view.frame_jpeg("dock")
    again = view.frame_jpeg("dock")
    view.observe(_outcome(2))
    second = view.frame_jpeg("dock")

    assert first is not None and again is first  # cached: encoded once per frame
    assert second is not None and second.info.index == 2 and second is not first
    image = cv2.imdecode(np.frombuffer(first.data, np.uint8), cv2.IMREAD_COLOR)
    assert image.shape == (120, 160, 3)
    assert float(np.abs(image.astype(int) - 70).max()) > 50  # zone and box drawn on grey


def test_live_view_keeps_the_newest_events_first() -> None:
    view = LiveView(recent_events=3)
    for index in range(5):
        view.deliver(_context(), {**_event_payload("person", None), "event_id": f"e{index}"})

    assert [e["event_id"] for e in view.recent_events()] == ["e4", "e3", "e2"]


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({}, None),
        ({"host": "localhost"}, None),
        ({"host": "::1"}, None),
        ({"host": "127.0.0.2"}, None),
        ({"host": "0.0.0.0"}, "would show the cameras to the network"),  # noqa: S104
        ({"host": "edge-01.lan"}, "would show the cameras to the network"),
        ({"host": "0.0.0.0", "auth": _BASIC}, None),  # noqa: S104
        ({"host": "0.0.0.0", "allow_unauthenticated_remote": True}, None),  # noqa: S104
        ({"auth": {"type": "basic", "username": "a:b", "password": {"env": "P"}}}, "pattern"),
        ({"auth": {"type": "digest"}}, "tag"),
        ({"port": 70_000}, "less than or equal"),
    ],
)
def test_web_config_refuses_an_open_page_on_the_network(
    settings: dict[str, Any], error: str | None
) -> None:
    if error is None:
        WebConfig.model_validate(settings)
    else:
        with pytest.raises(pydantic.ValidationError, match=error):
            WebConfig.model_validate(settings)


@pytest.mark.parametrize(
    ("reload", "headers", "expected"),
    [
        (True, {}, 401),
        (True, {"Origin": "http://evil.example"}, 403),
        (True, {"Origin": "same"}, 200),
        (True, {}, 200),
        (False, {}, 404),
    ],
    ids=["no-credentials", "cross-site", "same-origin", "applied", "no-reload-action"],
)
def test_reload_endpoint_needs_credentials_and_the_same_origin(
    reload: bool, headers: dict[str, str], expected: int
) -> None:
    config = WebConfig.model_validate({"port": 0, "auth": _BASIC})
    calls: list[int] = []

    def action() -> dict[str, object]:
        calls.append(1)
        return {"ok": True, "message": "reloaded: no change"}

    view = LiveView()
    server = StatusServer(config, view, dict, environ=_SECRETS, reload=action if reload else None)
    server.start()
    try:
        auth = {} if expected == 401 else _basic("viewer", "s3cret:pass")
        if headers.get("Origin") == "same":
            headers = {"Origin": f"http://127.0.0.1:{server.port}"}
        request = urllib.request.Request(  # noqa: S310 (http only)
            f"http://127.0.0.1:{server.port}/api/reload",
            data=b"",
            method="POST",
            headers={**auth, **headers},
        )
        try:
            with _NO_PROXY.open(request, timeout=10) as response:
                status = int(response.status)
        except urllib.error.HTTPError as error:
            status = int(error.code)
    finally:
        server.close()
    assert status == expected
    assert len(calls) == (1 if expected == 200 else 0)
