"""The server through real gRPC on loopback: unary, stream, health, reflection, limits, shutdown."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from cloud_service.batching import DynamicBatcher
from cloud_service.config import BatchingConfig, ServerConfig
from cloud_service.processor import DetectorFrameProcessor
from cloud_service.server import SERVICE_NAME, ServerBindError, create_server, serve_until_signalled
from cloud_service.servicer import InferenceServicer
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub
from tests.fixtures.grpc_server import (
    FAKE_MODEL,
    FakeDetector,
    RunningServer,
    ServerFactory,
    make_jpeg,
    make_request,
)

RPC_TIMEOUT_S = 10.0
OK = grpc.StatusCode.OK.value[0]


def test_unary_returns_detections_in_source_pixels(inference_stub: InferenceServiceStub) -> None:
    request = make_request(
        "cam-7", 42, jpeg=make_jpeg(160, 120), original_width=320, original_height=240
    )
    request.capture_time.FromSeconds(1_700_000_000)

    result = inference_stub.DetectFrame(request, timeout=RPC_TIMEOUT_S)

    assert result.status.code == OK, result.status.message
    assert (result.agent_id, result.camera_id, result.frame_id) == ("agent-1", "cam-7", 42)
    assert result.request_id == "cam-7/42"
    assert result.capture_time.seconds == 1_700_000_000
    assert (result.model_name, result.model_version) == (FAKE_MODEL.name, FAKE_MODEL.version)
    # The fake's first box (10, 20, 50, 80) on a 2x downscaled JPEG.
    first = result.detections[0]
    assert (first.x1, first.y1, first.x2, first.y2) == (20.0, 40.0, 100.0, 160.0)
    assert [d.class_name for d in result.detections] == ["person", "car"]
    assert not first.HasField("region_index")
    assert result.timings.total_time_ms >= result.timings.inference_time_ms > 0.0


def test_stream_interleaved_cameras_get_exactly_one_result_per_frame(
    inference_stub: InferenceServiceStub,
) -> None:
    cameras = ("cam-a", "cam-b", "cam-c")
    frames_per_camera = 12
    jpeg = make_jpeg()
    requests = [
        make_request(camera, frame, jpeg=jpeg)
        for frame in range(frames_per_camera)
        for camera in cameras
    ]

    results = list(inference_stub.StreamFrames(iter(requests), timeout=RPC_TIMEOUT_S))

    keys = Counter((r.camera_id, r.frame_id) for r in results)
    assert keys == Counter((r.camera_id, r.frame_id) for r in requests)
    assert all(r.status.code == OK and len(r.detections) == 2 for r in results)


def test_stream_with_no_frames_ends_cleanly(inference_stub: InferenceServiceStub) -> None:
    assert list(inference_stub.StreamFrames(iter([]), timeout=RPC_TIMEOUT_S)) == []


def test_stream_batches_frames_up_to_the_limit(grpc_server_factory: ServerFactory) -> None:
    detector = FakeDetector()
    batcher = DynamicBatcher(
        DetectorFrameProcessor(detector, FAKE_MODEL), BatchingConfig(max_batch_size=3)
    )
    batcher.start()
    running = grpc_server_factory(batcher)
    requests = [make_request("cam", i) for i in range(20)]

    try:
        results = list(running.stub.StreamFrames(iter(requests), timeout=RPC_TIMEOUT_S))
    finally:
        batcher.stop(grace_s=1.0)

    assert len(results) == 20
    assert all(1 <= len(call) <= 3 for call in detector.calls)
    assert detector.images_seen == 20


@pytest.mark.parametrize("service", ["", SERVICE_NAME])
def test_health_is_serving(inference_server: RunningServer, service: str) -> None:
    health = health_pb2_grpc.HealthStub(inference_server.channel)

    response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S)

    assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_health_of_an_unknown_service_is_not_found(inference_server: RunningServer) -> None:
    health = health_pb2_grpc.HealthStub(inference_server.channel)

    with pytest.raises(grpc.RpcError) as caught:
        health.Check(health_pb2.HealthCheckRequest(service="nope.v1.X"), timeout=RPC_TIMEOUT_S)

    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_turns_not_serving_when_stop_starts(
    grpc_server_factory: ServerFactory, fake_detector: FakeDetector
) -> None:
    running = grpc_server_factory(DetectorFrameProcessor(fake_detector, FAKE_MODEL))
    health = health_pb2_grpc.HealthStub(running.channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=RPC_TIMEOUT_S)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING

    stopped = running.server.stop(grace=2.0)

    assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
    watch.cancel()
    assert stopped.wait(timeout=RPC_TIMEOUT_S)


def test_reflection_lists_the_service(grpc_server_factory: ServerFactory) -> None:
    running = grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL))
    database = ProtoReflectionDescriptorDatabase(running.channel)

    services = database.get_services()

    assert SERVICE_NAME in services
    assert "grpc.health.v1.Health" in services
    found = database.FindFileContainingSymbol("analytics.v1.FrameRequest")
    assert found.package == "analytics.v1"


def test_reflection_off(grpc_server_factory: ServerFactory) -> None:
    config = ServerConfig(listen_address="127.0.0.1:0", reflection=False)
    running = grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL), config)

    with pytest.raises(grpc.RpcError) as caught:
        ProtoReflectionDescriptorDatabase(running.channel).get_services()

    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_message_too_large_is_resource_exhausted(grpc_server_factory: ServerFactory) -> None:
    config = ServerConfig(listen_address="127.0.0.1:0", max_receive_message_bytes=16 * 1024)
    running = grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL), config)
    request = make_request(jpeg=make_jpeg(320, 240, quality=95))
    assert request.ByteSize() > 16 * 1024

    with pytest.raises(grpc.RpcError) as caught:
        running.stub.DetectFrame(request, timeout=RPC_TIMEOUT_S)

    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_binding_a_port_in_use_fails(grpc_server_factory: ServerFactory) -> None:
    running = grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL))
    config = ServerConfig(listen_address=f"127.0.0.1:{running.port}")
    servicer = InferenceServicer(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL))

    with pytest.raises(ServerBindError, match=str(running.port)):
        create_server(config, servicer)


def test_serve_until_signalled_drains_on_sigterm() -> None:
    config = ServerConfig(listen_address="127.0.0.1:0")
    server, port = create_server(
        config, InferenceServicer(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL))
    )
    previous = signal.getsignal(signal.SIGTERM)
    answered: list[pb.FrameResult] = []

    def call_then_signal() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = InferenceServiceStub(channel)
            answered.append(
                stub.DetectFrame(make_request(), timeout=RPC_TIMEOUT_S, wait_for_ready=True)
            )
        os.kill(os.getpid(), signal.SIGTERM)

    caller = threading.Thread(target=call_then_signal)
    caller.start()
    serve_until_signalled(server, grace_period_s=0.5)
    caller.join(timeout=RPC_TIMEOUT_S)

    assert len(answered) == 1 and answered[0].status.code == OK
    assert signal.getsignal(signal.SIGTERM) == previous
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            InferenceServiceStub(channel).DetectFrame(make_request(), timeout=1.0)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_an_oversized_frame_is_answered_alone_and_its_stream_goes_on(
    grpc_server_factory: ServerFactory,
) -> None:
    # The default transport limit (64 MB) sits well above the JPEG limit (4 MB).
    running = grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL))
    big = make_request("cam-1", 2, jpeg=b"\xff\xd8" + bytes(10 * 1024 * 1024))
    requests = [make_request("cam-1", 1), big, make_request("cam-1", 3)]

    results = {r.frame_id: r for r in running.stub.StreamFrames(iter(requests), timeout=30.0)}

    assert sorted(results) == [1, 2, 3]
    assert results[1].status.code == OK and results[3].status.code == OK
    assert results[2].status.code == INVALID_ARGUMENT, results[2].status.message


def test_malformed_request_bytes_are_invalid_argument_without_a_traceback(
    grpc_server_factory: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    running = grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL))
    garbage = b"\xff\xff\xff\xff"
    unary = running.channel.unary_unary(
        f"/{SERVICE_NAME}/DetectFrame", response_deserializer=pb.FrameResult.FromString
    )
    with pytest.raises(grpc.RpcError) as caught:
        unary(garbage, timeout=RPC_TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed FrameRequest (4 bytes)" in (caught.value.details() or "")

    stream = running.channel.stream_stream(
        f"/{SERVICE_NAME}/StreamFrames", response_deserializer=pb.FrameResult.FromString
    )
    sent = [make_request("cam-1", 1).SerializeToString(), garbage]
    sent.append(make_request("cam-1", 3).SerializeToString())
    results = list(stream(iter(sent), timeout=RPC_TIMEOUT_S))

    assert len(results) == 3  # one answer per message, and the stream went on
    codes = Counter(r.status.code for r in results)
    assert codes == Counter({OK: 2, INVALID_ARGUMENT: 1})
    assert {r.frame_id for r in results if r.status.code == OK} == {1, 3}
    assert "Traceback" not in caplog.text and "Exception deserializing" not in caplog.text


@pytest.mark.parametrize(
    ("agent_id", "camera_id"),
    [("", "cam-1"), ("agent-1", ""), ("agent\n1", "cam-1"), ("a" * 257, "cam-1")],
)
def test_empty_or_odd_ids_are_invalid_argument(
    inference_stub: InferenceServiceStub, agent_id: str, camera_id: str
) -> None:
    request = make_request(camera_id, 5)
    request.agent_id = agent_id

    result = inference_stub.DetectFrame(request, timeout=RPC_TIMEOUT_S)

    assert result.status.code == INVALID_ARGUMENT
    assert "_id" in result.status.message


def test_reflection_answers_v1_too(grpc_server_factory: ServerFactory) -> None:
    from grpc_reflection.v1alpha import reflection_pb2

    running = grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL))
    call = running.channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    asked = reflection_pb2.ServerReflectionRequest(list_services="*")

    (answer,) = list(call(iter([asked]), timeout=RPC_TIMEOUT_S))

    names = {s.name for s in answer.list_services_response.service}
    assert {SERVICE_NAME, "grpc.reflection.v1.ServerReflection"} <= names
