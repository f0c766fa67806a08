"""Escalation client against the real cloud service on loopback (FakeDetector behind it)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
import numpy as np
import numpy.typing as npt
import pytest

from cloud_service.config import ServerConfig, TlsConfig
from cloud_service.processor import DetectorFrameProcessor
from detection.detections import Detections
from edge_agent.config.escalation import EscalationConfig
from edge_agent.escalation.client import ClientState, EscalationClient, EscalationResult
from edge_agent.escalation.encode import (
    build_frame_request,
    encode_jpeg,
    payload_bytes,
    payload_pixels,
)
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.timestamps import timestamp_to_seconds
from tests.fixtures.grpc_server import FAKE_MODEL, FakeDetector, RunningServer, ServerFactory

WAIT_S = 10.0
AUTH_VARIABLE = "ESCALATION_TEST_TOKENS"


class GatedDetector(FakeDetector):
    """`FakeDetector` that holds every batch while `gate` is clear."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()

    def detect(self, images: Sequence[npt.NDArray[np.uint8]]) -> list[Detections]:
        self.gate.wait(WAIT_S)
        return super().detect(images)


@pytest.fixture
def detector() -> Iterator[GatedDetector]:
    gated = GatedDetector()
    yield gated
    gated.gate.set()  # let batcher threads finish


@pytest.fixture
def make_client() -> Iterator[Callable[..., EscalationClient]]:
    clients: list[EscalationClient] = []

    def make(
        target: str,
        *,
        environ: dict[str, str] | None = None,
        start: bool = True,
        on_result: Callable[[EscalationResult], None] | None = None,
        **fields: object,
    ) -> EscalationClient:
        connection = {
            "reconnect_min_backoff_ms": 50,
            "reconnect_max_backoff_ms": 300,
            **fields.pop("connection", {}),  # type: ignore[dict-item]
        }
        config = EscalationConfig.model_validate(
            {"enabled": True, "cloud_address": target, "connection": connection, **fields}
        )
        client = EscalationClient(config, "agent-1", environ=environ or {}, on_result=on_result)
        clients.append(client)
        if start:
            client.start()
        return client

    yield make
    for client in clients:
        client.close()


def _image(width: int = 320, height: int = 240, seed: int = 0) -> npt.NDArray[np.uint8]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


def _request(camera: str, frame_id: int, **fields: object) -> pb.FrameRequest:
    return build_frame_request(
        _image(),
        agent_id="agent-1",
        camera_id=camera,
        frame_id=frame_id,
        capture_time_s=time.time(),
        jpeg_quality=80,
        **fields,  # type: ignore[arg-type]
    )


def _collect(client: EscalationClient, n: int) -> list[EscalationResult]:
    results: list[EscalationResult] = []
    deadline = time.monotonic() + WAIT_S
    while len(results) < n:
        assert time.monotonic() < deadline, f"got {len(results)} of {n} results"
        results += client.poll_results()
        time.sleep(0.01)
    return results


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _server(
    factory: ServerFactory, detector: FakeDetector, config: ServerConfig | None = None
) -> RunningServer:
    return factory(DetectorFrameProcessor(detector, FAKE_MODEL), config=config)


def test_answers_arrive_and_match_frames(
    grpc_server_factory: ServerFactory,
    detector: GatedDetector,
    make_client: Callable[..., EscalationClient],
) -> None:
    server = _server(grpc_server_factory, detector)
    client = make_client(server.target, max_in_flight=16, connection={"send_queue_frames": 16})
    assert client.wait_connected(WAIT_S) and client.connected
    sent = [(camera, frame) for frame in range(1, 5) for camera in ("cam-a", "cam-b")]
    for camera, frame in sent:
        assert client.submit(_request(camera, frame))

    results = _collect(client, len(sent))

    assert sorted((r.camera_id, r.frame_id) for r in results) == sorted(sent)
    for result in results:
        assert result.ok and result.result is not None
        assert result.request_id == f"agent-1/{result.camera_id}/{result.frame_id}"
        assert len(result.result.detections) == 2
        assert result.rtt_s is not None and 0.0 < result.rtt_s < WAIT_S
        assert result.queue_time_ms is not None and not result.overloaded
    stats = client.stats()
    assert (stats.sent, stats.answered, stats.failed, stats.in_flight) == (8, 8, 0, 0)
    assert len(stats.rtt_samples_s) == 8 and stats.state is ClientState.CONNECTED


def test_region_request_and_default_deadline(
    grpc_server_factory: ServerFactory,
    detector: GatedDetector,
    make_client: Callable[..., EscalationClient],
) -> None:
    server = _server(grpc_server_factory, detector)
    received: list[EscalationResult] = []
    client = make_client(server.target, deadline_ms=2_000, on_result=received.append)
    assert client.wait_connected(WAIT_S)
    request = _request("cam-a", 7, regions=[(100.0, 50.0, 200.0, 150.0)], region_jpeg_quality=95)
    assert not request.jpeg and len(request.regions) == 1 and request.jpeg_quality == 95
    assert payload_bytes(request) == len(request.regions[0].jpeg)
    assert payload_pixels(request) == 100 * 100
    request.ClearField("deadline")
    before = time.time()

    assert client.submit(request)

    _wait_for(lambda: len(received) == 1)
    (result,) = received
    assert result.ok and result.result is not None and not client.poll_results()
    # The fake's box (10, 20, 50, 80) found in the crop at (100, 50).
    first = result.result.detections[0]
    assert (first.x1, first.y1, first.x2, first.y2) == (110.0, 70.0, 150.0, 130.0)
    assert first.region_index == 0
    assert not request.HasField("deadline")  # the caller's request is not changed
    assert timestamp_to_seconds(result.result.capture_time) == pytest.approx(before, abs=5.0)


def test_full_window_refuses_without_blocking(
    grpc_server_factory: ServerFactory,
    detector: GatedDetector,
    make_client: Callable[..., EscalationClient],
) -> None:
    server = _server(grpc_server_factory, detector)
    client = make_client(server.target, max_in_flight=2, deadline_ms=30_000)
    assert client.wait_connected(WAIT_S)
    detector.gate.clear()
    assert client.submit(_request("cam-a", 1))
    assert client.submit(_request("cam-a", 2))

    started = time.monotonic()
    refused = [client.submit(_request("cam-a", 3 + i)) for i in range(5)]
    elapsed = time.monotonic() - started

    assert refused == [False] * 5
    assert elapsed < 10.0  # refused at once; a blocking submit would wait out the 30 s deadline
    assert client.stats().dropped_full == 5 and client.stats().in_flight == 2
    detector.gate.set()
    assert sorted(r.frame_id for r in _collect(client, 2)) == [1, 2]
    assert client.submit(_request("cam-a", 10))
    assert [r.frame_id for r in _collect(client, 1)] == [10]


def test_server_restart_fails_in_flight_and_reconnects(
    grpc_server_factory: ServerFactory,
    detector: GatedDetector,
    make_client: Callable[..., EscalationClient],
) -> None:
    server = _server(grpc_server_factory, detector)
    client = make_client(server.target, max_in_flight=8, deadline_ms=30_000)
    assert client.wait_connected(WAIT_S)
    assert client.submit(_request("cam-a", 1))
    assert _collect(client, 1)[0].ok
    detector.gate.clear()
    for frame in (2, 3, 4):
        assert client.submit(_request("cam-a", frame))
    _wait_for(lambda: client.stats().sent == 4)

    server.server.stop(0).wait()

    failed = _collect(client, 3)
    assert sorted(r.frame_id for r in failed) == [2, 3, 4]
    assert all(r.result is None and not r.ok and "broke" in r.message for r in failed)
    _wait_for(lambda: not client.connected)
    started = time.monotonic()
    assert not any(client.submit(_request("cam-a", 100 + i)) for i in range(20))
    assert time.monotonic() - started < 0.5
    assert client.stats().dropped_disconnected >= 20
    time.sleep(0.5)  # a few reconnect attempts against the closed port
    detector.gate.set()

    restarted_config = ServerConfig(listen_address=f"127.0.0.1:{server.port}", worker_threads=8)
    _server(grpc_server_factory, FakeDetector(), restarted_config)

    assert client.wait_connected(WAIT_S)
    assert client.submit(_request("cam-a", 5))
    results = _collect(client, 1)
    assert [(r.frame_id, r.ok) for r in results] == [(5, True)]
    stats = client.stats()
    assert stats.reconnects >= 1 and stats.failed == 3 and stats.in_flight == 0
    assert stats.last_error is None  # cleared by the first answer after the reconnect


def test_overdue_answer_fails_locally_and_late_answer_is_counted(
    grpc_server_factory: ServerFactory,
    detector: GatedDetector,
    make_client: Callable[..., EscalationClient],
) -> None:
    server = _server(grpc_server_factory, detector)
    client = make_client(server.target, deadline_ms=100, connection={"answer_grace_ms": 100})
    assert client.wait_connected(WAIT_S)
    detector.gate.clear()
    assert client.submit(_request("cam-a", 1))

    (result,) = _collect(client, 1)

    assert result.code is grpc.StatusCode.DEADLINE_EXCEEDED and result.result is None
    assert client.stats().in_flight == 0
    detector.gate.set()
    _wait_for(lambda: client.stats().late_answers == 1)
    assert client.connected


def test_bad_token_is_a_clear_state_without_log_spam(
    grpc_server_factory: ServerFactory,
    detector: GatedDetector,
    make_client: Callable[..., EscalationClient],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(AUTH_VARIABLE, "right-token")
    config = ServerConfig(listen_address="127.0.0.1:0", auth_tokens_env=AUTH_VARIABLE)
    server = _server(grpc_server_factory, detector, config)
    caplog.set_level(logging.DEBUG, logger="edge_agent.escalation.client")
    client = make_client(
        server.target,
        auth_token={"env": "EDGE_TOKEN"},
        environ={"EDGE_TOKEN": "wrong-token"},
        connection={"auth_retry_ms": 200},
    )

    _wait_for(lambda: client.stats().reconnects >= 3)

    stats = client.stats()
    assert stats.last_error is not None and stats.last_error.startswith("UNAUTHENTICATED")
    assert stats.reconnects < 15  # waits auth_retry_ms between attempts, no tight loop
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "rejected the escalation token" in errors[0].getMessage()
    assert "wrong-token" not in caplog.text


def test_bad_token_state_and_submit(
    grpc_server_factory: ServerFactory,
    detector: GatedDetector,
    make_client: Callable[..., EscalationClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(AUTH_VARIABLE, "right-token")
    config = ServerConfig(listen_address="127.0.0.1:0", auth_tokens_env=AUTH_VARIABLE)
    server = _server(grpc_server_factory, detector, config)
    client = make_client(
        server.target,
        auth_token={"env": "EDGE_TOKEN"},
        environ={"EDGE_TOKEN": "wrong-token"},
        connection={"auth_retry_ms": 600_000},
    )
    _wait_for(lambda: client.state is ClientState.UNAUTHENTICATED)
    assert not client.connected and not client.submit(_request("cam-a", 1))


def test_missing_token_fails_at_construction(
    make_client: Callable[..., EscalationClient],
) -> None:
    from edge_agent.escalation.client import EscalationClientError

    with pytest.raises(EscalationClientError, match="EDGE_TOKEN is not set"):
        make_client("127.0.0.1:1", auth_token={"env": "EDGE_TOKEN"}, environ={}, start=False)


def test_close_fails_frames_in_flight(
    grpc_server_factory: ServerFactory,
    detector: GatedDetector,
    make_client: Callable[..., EscalationClient],
) -> None:
    server = _server(grpc_server_factory, detector)
    client = make_client(server.target, deadline_ms=30_000)
    assert client.wait_connected(WAIT_S)
    detector.gate.clear()
    assert client.submit(_request("cam-a", 1))

    client.close()

    (result,) = client.poll_results()
    assert result.code is grpc.StatusCode.CANCELLED and client.state is ClientState.CLOSED
    assert not client.submit(_request("cam-a", 2))


def test_encode_jpeg_round_trip() -> None:
    import cv2

    image = _image(64, 48)
    decoded = cv2.imdecode(np.frombuffer(encode_jpeg(image, 90), np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape == image.shape
    with pytest.raises(ValueError, match="quality"):
        encode_jpeg(image, 0)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
def test_tls_with_ca_file_and_token(
    grpc_server_factory: ServerFactory,
    detector: GatedDetector,
    make_client: Callable[..., EscalationClient],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "server.key",
            "-out", "server.crt", "-subj", "/CN=localhost", "-days", "2",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )  # fmt: skip
    monkeypatch.setenv(AUTH_VARIABLE, "right-token")
    tls = TlsConfig(cert_path=tmp_path / "server.crt", key_path=tmp_path / "server.key")
    config = ServerConfig(listen_address="127.0.0.1:0", tls=tls, auth_tokens_env=AUTH_VARIABLE)
    server = grpc_server_factory(
        DetectorFrameProcessor(detector, FAKE_MODEL),
        config=config,
        channel_credentials=grpc.ssl_channel_credentials(tls.cert_path.read_bytes()),
    )
    client = make_client(
        server.target,
        tls=True,
        tls_ca_path=str(tmp_path / "server.crt"),
        auth_token={"env": "EDGE_TOKEN"},
        environ={"EDGE_TOKEN": "right-token"},
    )
    assert client.wait_connected(WAIT_S)
    assert client.submit(_request("cam-a", 1))
    assert _collect(client, 1)[0].ok


def _submit_steadily(
    client: EscalationClient, camera: str, seconds: float, per_s: float = 40.0
) -> list[int]:
    """Submit frames at `per_s` for `seconds`; the frame ids accepted."""
    accepted: list[int] = []
    frame, ends = 0, time.monotonic() + seconds
    while time.monotonic() < ends:
        frame += 1
        if client.submit(_request(camera, frame)):
            accepted.append(frame)
        time.sleep(1.0 / per_s)
    return accepted


def test_connection_age_rotates_the_stream_without_losing_a_frame(
    grpc_server_factory: ServerFactory,
    detector: GatedDetector,
    make_client: Callable[..., EscalationClient],
) -> None:
    # The server asks every connection to go away after ~1 s (GOAWAY), with a long grace.
    config = ServerConfig(
        listen_address="127.0.0.1:0", max_connection_age_s=1.0, max_connection_age_grace_s=30.0
    )
    server = _server(grpc_server_factory, detector, config)
    received: list[EscalationResult] = []
    client = make_client(server.target, deadline_ms=5_000, on_result=received.append)
    assert client.wait_connected(WAIT_S)

    accepted = _submit_steadily(client, "cam-a", 3.5)

    _wait_for(lambda: len(received) >= len(accepted))
    stats = client.stats()
    assert stats.rotations >= 1  # moved to a new stream, not cut after the grace
    assert (stats.dropped_disconnected, stats.dropped_full, stats.failed) == (0, 0, 0)
    assert sorted(r.frame_id for r in received) == accepted  # each exactly once
    assert all(r.ok for r in received)
    assert stats.state is ClientState.CONNECTED


def test_round_robin_moves_the_stream_when_its_replica_dies(
    grpc_server_factory: ServerFactory, make_client: Callable[..., EscalationClient]
) -> None:
    detectors = (GatedDetector(), GatedDetector())
    servers = [_server(grpc_server_factory, d) for d in detectors]
    received: list[EscalationResult] = []
    target = "ipv4:" + ",".join(s.target for s in servers)
    client = make_client(target, deadline_ms=10_000, max_in_flight=8, on_result=received.append)
    assert client.wait_connected(WAIT_S)
    assert client.submit(_request("cam-a", 1))
    _wait_for(lambda: len(received) == 1)
    serving = 0 if detectors[0].images_seen else 1
    survivor = detectors[1 - serving]
    detectors[serving].gate.clear()  # frames 2-4 stay in flight on the doomed replica
    for frame in (2, 3, 4):
        assert client.submit(_request("cam-a", frame))
    _wait_for(lambda: client.stats().sent == 4)

    servers[serving].server.stop(0).wait()
    detectors[serving].gate.set()

    _wait_for(lambda: len(received) == 4)
    assert sorted(r.frame_id for r in received) == [1, 2, 3, 4]
    assert all(r.ok for r in received)  # answered by the survivor, none failed, none twice
    assert survivor.images_seen == 3
    assert client.stats().resent == 3 and client.stats().failed == 0
    _wait_for(lambda: client.connected)
    assert client.submit(_request("cam-a", 5))
    _wait_for(lambda: len(received) == 5)
    assert received[-1].ok and survivor.images_seen == 4
