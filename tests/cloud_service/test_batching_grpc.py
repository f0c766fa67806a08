"""The batcher through a real gRPC channel: one reply per frame, boxes, fairness, codes, drain."""

from __future__ import annotations

import statistics
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import numpy.typing as npt
import pytest
import simplejpeg

from cloud_service.app import BatcherDrainingServer
from cloud_service.batching import DynamicBatcher
from cloud_service.config import BatchingConfig, ServerConfig
from cloud_service.convert import (
    detections_from_proto,
    status_code_from_proto,
)
from cloud_service.decoders import create_codec
from cloud_service.metrics import ServiceMetrics, start_metrics_exporter
from cloud_service.models import ModelInfo
from cloud_service.processor import DetectorFrameProcessor
from cloud_service.server import DrainingServer, create_server
from cloud_service.servicer import InferenceServicer
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from detection.runtimes.config import OnnxRuntimeConfig
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub
from protos.analytics.v1.timestamps import timestamp_from_seconds
from tests.fixtures.grpc_server import FAKE_MODEL, FakeDetector, make_jpeg

RPC_TIMEOUT_S = 30.0
WAIT_S = 10.0
OK = grpc.StatusCode.OK


@dataclass
class BatchedServer:
    """A started server whose servicer submits to `batcher`, with a connected stub."""

    server: DrainingServer
    batcher: DynamicBatcher
    metrics: ServiceMetrics
    stub: InferenceServiceStub


StartServer = Callable[..., BatchedServer]


@pytest.fixture
def start_server() -> Iterator[StartServer]:
    """`start(processor, **batching_fields)`: batcher + servicer + server on 127.0.0.1:0."""
    started: list[tuple[BatchedServer, grpc.Channel]] = []

    def start(processor: object, **batching: object) -> BatchedServer:
        config = BatchingConfig(**{"default_deadline_ms": 30_000, **batching})  # type: ignore[arg-type]
        metrics = ServiceMetrics()
        batcher = DynamicBatcher(processor, config, metrics=metrics)  # type: ignore[arg-type]
        servicer = InferenceServicer(
            batcher, max_stream_inflight_frames=config.max_stream_inflight_frames
        )
        server_config = ServerConfig(listen_address="127.0.0.1:0", worker_threads=24)
        inner, port = create_server(server_config, servicer)
        server = BatcherDrainingServer(inner, batcher)
        batcher.start()
        server.start()
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        running = BatchedServer(server, batcher, metrics, InferenceServiceStub(channel))
        started.append((running, channel))
        return running

    yield start
    for running, channel in started:
        channel.close()
        running.server.stop(0.5).wait()
        running.batcher.stop(0.0)


class SlowDetector(FakeDetector):
    """`FakeDetector` that takes `batch_s` per call and can be held with `gate`."""

    def __init__(self, batch_s: float = 0.0) -> None:
        super().__init__()
        self.batch_s = batch_s
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def detect(self, images: Sequence[npt.NDArray[np.uint8]]) -> list[Detections]:
        self.entered.set()
        assert self.gate.wait(WAIT_S)
        time.sleep(self.batch_s)
        return super().detect(images)


def _wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def _code(result: pb.FrameResult) -> grpc.StatusCode:
    return status_code_from_proto(result.status)


def _request(agent: str, camera: str, frame: int, jpeg: bytes, **fields: object) -> pb.FrameRequest:
    return pb.FrameRequest(
        agent_id=agent,
        camera_id=camera,
        frame_id=frame,
        request_id=f"{agent}/{camera}/{frame}",
        jpeg=jpeg,
        **fields,  # type: ignore[arg-type]
    )


def test_eight_concurrent_streams_get_exactly_one_reply_per_frame(
    start_server: StartServer,
) -> None:
    detector = FakeDetector()
    running = start_server(DetectorFrameProcessor(detector, FAKE_MODEL), max_batch_size=8)
    jpeg = make_jpeg()
    streams, frames = 8, 24
    replies: dict[str, list[pb.FrameResult]] = {}

    def run_stream(stream: int) -> None:
        agent = f"agent-{stream}"
        requests = [_request(agent, f"cam-{f % 2}", f, jpeg) for f in range(frames)]
        replies[agent] = list(running.stub.StreamFrames(iter(requests), timeout=RPC_TIMEOUT_S))

    threads = [threading.Thread(target=run_stream, args=(s,)) for s in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RPC_TIMEOUT_S)

    assert len(replies) == streams
    for agent, results in replies.items():
        expected = {f"{agent}/cam-{f % 2}/{f}" for f in range(frames)}
        assert Counter(r.request_id for r in results) == Counter(expected)
        assert all(r.agent_id == agent and _code(r) == OK for r in results)
        assert all(len(r.detections) == 2 for r in results)
        assert all(r.timings.total_time_ms >= r.timings.queue_time_ms >= 0.0 for r in results)
    assert detector.images_seen == streams * frames
    assert max(len(call) for call in detector.calls) > 1  # frames of many streams batched


def _frames(image: npt.NDArray[np.uint8]) -> list[bytes]:
    height, width = image.shape[:2]
    variants = [
        image,
        image[: height // 2],
        image[:, width // 3 :],
        np.ascontiguousarray(image[:, ::-1]),
        image[height // 4 : 3 * height // 4, : width // 2],
        image[::2, ::2],
    ]
    return [
        bytes(simplejpeg.encode_jpeg(np.ascontiguousarray(v), quality=90, colorspace="BGR"))
        for v in variants
    ]


def test_boxes_match_a_direct_engine_call(
    start_server: StartServer, yolov5s_onnx: Path, bus_image: npt.NDArray[np.uint8]
) -> None:
    config = DetectorConfig(
        runtime=OnnxRuntimeConfig(model_path=yolov5s_onnx, intra_op_threads=2),
        confidence_threshold=0.0,
        max_detections=10,
        input_size=(320, 320),
    )
    jpegs = _frames(bus_image)
    with Detector.from_config(config) as detector:
        model = ModelInfo("yolov5s-random", "test")
        running = start_server(DetectorFrameProcessor(detector, model), max_batch_size=4)
        requests = [_request(f"agent-{i % 3}", "cam", i, j) for i, j in enumerate(jpegs)]
        streamed: list[pb.FrameResult] = []

        def run_stream(agent: str) -> None:
            mine = [r for r in requests if r.agent_id == agent]
            streamed.extend(running.stub.StreamFrames(iter(mine), timeout=RPC_TIMEOUT_S))

        threads = [threading.Thread(target=run_stream, args=(f"agent-{a}",)) for a in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(RPC_TIMEOUT_S)
        unary = running.stub.DetectFrame(requests[0], timeout=RPC_TIMEOUT_S)
        decoder = create_codec()
        direct = detector.detect([decoder.decode(j) for j in jpegs])

    by_frame = {r.frame_id: r for r in streamed}
    assert sorted(by_frame) == list(range(len(jpegs)))
    for frame_id, expected in enumerate(direct):
        result = by_frame[frame_id]
        assert _code(result) == OK, result.status.message
        got = detections_from_proto(result.detections)
        assert len(expected) > 0 and len(got) == len(expected)
        np.testing.assert_allclose(got.xyxy, expected.xyxy, atol=0.05)
        np.testing.assert_allclose(got.confidence, expected.confidence, atol=1e-4)
        np.testing.assert_array_equal(got.class_id, expected.class_id)
    np.testing.assert_allclose(
        detections_from_proto(unary.detections).xyxy, direct[0].xyxy, atol=0.05
    )


def test_a_flooding_stream_does_not_delay_a_quiet_one(start_server: StartServer) -> None:
    batch_s = 0.03
    detector = SlowDetector(batch_s=batch_s)
    running = start_server(
        DetectorFrameProcessor(detector, FAKE_MODEL),
        max_batch_size=4,
        max_queue_delay_ms=2,
        per_stream_queue_frames=12,
        max_stream_inflight_frames=1024,
    )
    jpeg = make_jpeg(64, 48)
    flood_requests = [_request("agent-flood", "cam", f, jpeg) for f in range(400)]
    flood: list[pb.FrameResult] = []
    flooding = threading.Thread(
        target=lambda: flood.extend(
            running.stub.StreamFrames(iter(flood_requests), timeout=RPC_TIMEOUT_S)
        )
    )
    flooding.start()
    assert detector.entered.wait(WAIT_S)
    time.sleep(0.1)  # the flood fills its queue
    quiet: list[pb.FrameResult] = []
    for frame in range(8):
        request = _request("agent-quiet", "cam", frame, jpeg)
        quiet.append(running.stub.DetectFrame(request, timeout=RPC_TIMEOUT_S))
        time.sleep(0.02)
    flooding.join(RPC_TIMEOUT_S)

    assert len(flood) == len(flood_requests)
    flood_codes = Counter(_code(r) for r in flood)
    assert flood_codes[grpc.StatusCode.RESOURCE_EXHAUSTED] > 0  # it did overload its queue
    assert all(_code(r) == OK for r in quiet)
    flood_waits = [r.timings.queue_time_ms for r in flood if _code(r) == OK]
    quiet_waits = [r.timings.queue_time_ms for r in quiet]
    # A quiet frame waits at most for the running batch (plus scheduling slack) ...
    assert max(quiet_waits) < 1000.0 * (2 * batch_s) + 40.0, quiet_waits
    # ... while the flood's frames queue behind each other.
    assert statistics.median(flood_waits) > max(quiet_waits), (flood_waits, quiet_waits)


def test_expired_deadlines_and_overload_codes(start_server: StartServer) -> None:
    detector = SlowDetector()
    detector.gate.clear()
    running = start_server(
        DetectorFrameProcessor(detector, FAKE_MODEL),
        max_batch_size=1,
        max_queue_delay_ms=0,
        per_stream_queue_frames=3,
        max_queue_frames=8,
    )
    jpeg = make_jpeg()
    past = timestamp_from_seconds(time.time() - 1.0)

    late = running.stub.DetectFrame(
        _request("a", "cam", 0, jpeg, deadline=past), timeout=RPC_TIMEOUT_S
    )
    holder = running.stub.DetectFrame.future(_request("a", "cam", 1, jpeg), timeout=RPC_TIMEOUT_S)
    assert detector.entered.wait(WAIT_S)  # frame 1 holds the engine
    soon = timestamp_from_seconds(time.time() + 0.2)
    expiring = running.stub.DetectFrame.future(
        _request("b", "cam", 0, jpeg, deadline=soon), timeout=RPC_TIMEOUT_S
    )
    burst = [_request("a", "cam", f, jpeg) for f in range(2, 8)]
    call = running.stub.StreamFrames(iter(burst), timeout=RPC_TIMEOUT_S)
    rejected = [next(call) for _ in range(3)]  # frames 5, 6, 7: the camera's queue is full
    time.sleep(0.3)
    detector.gate.set()
    rest = list(call)

    assert _code(late) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert _code(holder.result()) == OK
    assert _code(expiring.result()) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert [(r.frame_id, _code(r)) for r in rejected] == [
        (f, grpc.StatusCode.RESOURCE_EXHAUSTED) for f in (5, 6, 7)
    ]
    assert all(r.queue_depth >= 3 for r in rejected)  # the depth lets the edge back off
    assert sorted((r.frame_id, _code(r)) for r in rest) == [(f, OK) for f in (2, 3, 4)]
    assert detector.images_seen == 4  # the late and expired frames never reached it


def test_a_corrupt_jpeg_fails_only_its_frame(start_server: StartServer) -> None:
    detector = FakeDetector()
    running = start_server(
        DetectorFrameProcessor(detector, FAKE_MODEL), max_batch_size=4, max_queue_delay_ms=500
    )
    good = make_jpeg()
    corrupt = good[:300] + bytes(range(256)) * 4 + good[300 + 1024 :]
    requests = [_request("a", f"cam-{i}", i, corrupt if i == 2 else good) for i in range(4)]

    results = list(running.stub.StreamFrames(iter(requests), timeout=RPC_TIMEOUT_S))

    codes = {r.frame_id: _code(r) for r in results}
    assert codes == {0: OK, 1: OK, 2: grpc.StatusCode.INVALID_ARGUMENT, 3: OK}
    assert detector.calls == [[(120, 160, 3)] * 3]  # one batch, without the corrupt frame


def test_stop_drains_queued_frames_and_refuses_new_ones(start_server: StartServer) -> None:
    detector = SlowDetector()
    detector.gate.clear()
    running = start_server(
        DetectorFrameProcessor(detector, FAKE_MODEL), max_batch_size=1, max_queue_delay_ms=0
    )
    jpeg = make_jpeg()
    more = threading.Event()

    def frames() -> Iterator[pb.FrameRequest]:
        yield from (_request("a", "cam", f, jpeg) for f in range(3))
        assert more.wait(WAIT_S)
        yield _request("a", "cam", 99, jpeg)

    call = running.stub.StreamFrames(frames(), timeout=RPC_TIMEOUT_S)
    assert detector.entered.wait(WAIT_S)
    _wait_until(lambda: running.batcher.depth == 2)  # frame 0 runs, 1 and 2 are queued
    stopped = running.server.stop(grace=5.0)
    more.set()
    refused = next(call)
    detector.gate.set()
    rest = [next(call) for _ in range(3)]

    assert (refused.frame_id, _code(refused)) == (99, grpc.StatusCode.UNAVAILABLE)
    assert sorted((r.frame_id, _code(r)) for r in rest) == [(f, OK) for f in range(3)]
    call.cancel()
    assert stopped.wait(WAIT_S)


def test_metrics_are_served_over_http(start_server: StartServer) -> None:
    running = start_server(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL))
    running.stub.DetectFrame(_request("a", "cam", 1, make_jpeg()), timeout=RPC_TIMEOUT_S)
    exporter = start_metrics_exporter(running.metrics, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{exporter.port}/metrics"
        with urllib.request.urlopen(url, timeout=WAIT_S) as response:  # noqa: S310 - loopback
            text = response.read().decode()
    finally:
        exporter.close()

    assert 'cloud_service_frames_total{agent_id="a",camera_id="cam",code="OK"} 1.0' in text
    for name in (
        "cloud_service_queue_time_seconds_bucket",
        "cloud_service_batch_size_frames_bucket",
        "cloud_service_decode_time_seconds_count",
        "cloud_service_inference_time_seconds_count",
        "cloud_service_frames_in_flight",
    ):
        assert name in text
