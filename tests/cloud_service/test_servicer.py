"""`InferenceServicer` (through its batcher): one result per frame even when processing fails."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import grpc
import pytest

from cloud_service.processor import empty_result
from cloud_service.servicer import InferenceServicer
from protos.analytics.v1 import analytics_pb2 as pb
from tests.fixtures.grpc_server import ServerFactory, make_request

RPC_TIMEOUT_S = 10.0
INTERNAL = grpc.StatusCode.INTERNAL.value[0]


class _Misbehaving:
    """Raises (mode "raise") or returns one result too few (mode "short")."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls = 0

    def process(self, requests: Sequence[pb.FrameRequest]) -> list[pb.FrameResult]:
        self.calls += 1
        if self.mode == "raise":
            raise RuntimeError("boom")
        return [empty_result(r) for r in requests][:-1]


@pytest.mark.parametrize("mode", ["raise", "short"])
def test_processor_failures_become_internal_results(
    grpc_server_factory: ServerFactory, mode: str
) -> None:
    running = grpc_server_factory(_Misbehaving(mode))
    requests = [make_request(f"cam-{i % 2}", i, jpeg=b"") for i in range(6)]

    unary = running.stub.DetectFrame(requests[0], timeout=RPC_TIMEOUT_S)
    streamed = list(running.stub.StreamFrames(iter(requests), timeout=RPC_TIMEOUT_S))

    assert unary.status.code == INTERNAL
    assert sorted(r.frame_id for r in streamed) == list(range(6))
    assert {r.status.code for r in streamed} == {INTERNAL}


class _Echo:
    def process(self, requests: Sequence[pb.FrameRequest]) -> list[pb.FrameResult]:
        return [empty_result(r) for r in requests]


def test_results_flow_before_the_client_half_closes(grpc_server_factory: ServerFactory) -> None:
    running = grpc_server_factory(_Echo())
    release = threading.Event()

    def frames() -> Iterator[pb.FrameRequest]:
        yield make_request("cam", 1, jpeg=b"")
        yield make_request("cam", 2, jpeg=b"")
        release.wait(RPC_TIMEOUT_S)  # keep the request side open

    call = running.stub.StreamFrames(frames(), timeout=RPC_TIMEOUT_S)
    try:
        first, second = next(call), next(call)
        call.cancel()
    finally:
        release.set()

    assert [first.frame_id, second.frame_id] == [1, 2]
    assert call.code() == grpc.StatusCode.CANCELLED


def test_servicer_validates_limits() -> None:
    with pytest.raises(ValueError, match="max_stream_inflight_frames"):
        InferenceServicer(_Echo(), max_stream_inflight_frames=0)


def test_streams_beyond_the_limit_are_refused_and_health_still_answers(
    grpc_server_factory: ServerFactory,
) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    # 8 threads, at most 2 frame streams: the other threads stay free for health checks
    running = grpc_server_factory(_Echo(), servicer_kwargs={"max_streams": 2})
    release = threading.Event()

    def frames(camera: str) -> Iterator[pb.FrameRequest]:
        yield make_request(camera, 1, jpeg=b"")
        release.wait(RPC_TIMEOUT_S)

    try:
        open_calls = [
            running.stub.StreamFrames(frames(f"cam-{i}"), timeout=RPC_TIMEOUT_S) for i in range(2)
        ]
        assert [next(call).frame_id for call in open_calls] == [1, 1]

        refused = running.stub.StreamFrames(frames("cam-x"), timeout=RPC_TIMEOUT_S)
        with pytest.raises(grpc.RpcError) as raised:
            next(refused)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "maximum of 2 frame streams" in str(raised.value.details())
        health = health_pb2_grpc.HealthStub(running.channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S)  # type: ignore[attr-defined]
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

        open_calls[0].cancel()
        attempts = 0
        while True:  # the freed slot is taken back as soon as the cancelled stream ends
            again = running.stub.StreamFrames(frames("cam-y"), timeout=RPC_TIMEOUT_S)
            try:
                assert next(again).frame_id == 1
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                attempts += 1
                assert attempts < 50
                threading.Event().wait(0.05)
    finally:
        release.set()


def test_config_keeps_threads_for_short_calls() -> None:
    from cloud_service.config import ServerConfig

    assert ServerConfig().max_frame_streams == 60
    assert ServerConfig(worker_threads=4).max_frame_streams == 1
    assert ServerConfig(worker_threads=16, reserved_threads=0).max_frame_streams == 16


def test_open_and_refused_streams_are_exported() -> None:
    from cloud_service.config import ServerConfig
    from cloud_service.metrics import ServiceMetrics
    from cloud_service.server import create_server
    from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub

    metrics = ServiceMetrics()
    servicer = InferenceServicer(_Echo(), max_streams=1, metrics=metrics)
    server, port = create_server(ServerConfig(listen_address="127.0.0.1:0"), servicer)
    server.start()
    release = threading.Event()

    def frames() -> Iterator[pb.FrameRequest]:
        yield make_request("cam", 1, jpeg=b"")
        release.wait(RPC_TIMEOUT_S)

    def value(name: str) -> float:
        return metrics.registry.get_sample_value(name) or 0.0

    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = InferenceServiceStub(channel)
            held = stub.StreamFrames(frames(), timeout=RPC_TIMEOUT_S)
            assert next(held).frame_id == 1
            assert value("cloud_service_frame_streams") == 1.0
            assert value("cloud_service_frame_streams_limit") == 1.0
            with pytest.raises(grpc.RpcError):
                next(stub.StreamFrames(frames(), timeout=RPC_TIMEOUT_S))
            assert value("cloud_service_frame_streams_refused_total") == 1.0
            held.cancel()
            release.set()
            for _ in range(100):  # the handler ends shortly after the cancel
                if value("cloud_service_frame_streams") == 0.0:
                    break
                threading.Event().wait(0.05)
            assert value("cloud_service_frame_streams") == 0.0
    finally:
        release.set()
        server.stop(0).wait()
