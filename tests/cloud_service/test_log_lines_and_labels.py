"""What the probe of issue 32 found in the cloud's log and metrics, each fixed:

- per-agent label slots of `frames_total` were first come, first served for ever: after a flood
  of 1,100 made-up id pairs a new agent counted as `other` until a restart;
- every refused stream logged a WARNING (140 lines for 200 streams);
- start-up said `model <metadata>:<metadata>`; a cancelled stream logged an empty client address;
  a stop logged the batcher's drain twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import pydantic
import pytest

from cloud_service.app import build_service, startup_line
from cloud_service.config import CloudMetricsConfig, CloudServiceConfig, ServerConfig
from cloud_service.metrics import ServiceMetrics
from cloud_service.processor import empty_result
from cloud_service.server import create_server
from cloud_service.servicer import InferenceServicer
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub
from tests.fixtures.grpc_server import ServerFactory, make_request

ROOT = Path(__file__).resolve().parents[2]
COCO_FP32 = ROOT / "models" / "coco" / "nanodet-coco-fp32.onnx"
RPC_TIMEOUT_S = 10.0


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _frames(metrics: ServiceMetrics, agent: str, camera: str) -> float | None:
    return metrics.registry.get_sample_value(
        "cloud_service_frames_total", {"agent_id": agent, "camera_id": camera, "code": "OK"}
    )


# ---- label slots --------------------------------------------------------------------------------


def test_a_flood_of_made_up_ids_holds_label_slots_only_while_it_lasts() -> None:
    clock = _Clock()
    metrics = ServiceMetrics(max_stream_labels=1_000, stream_label_idle_s=600.0, clock=clock)
    metrics.observe_answer("site-a", "dock", "OK")  # a running agent, answered all along
    for index in range(1_100):
        clock.now += 0.01
        metrics.observe_answer(f"flood-{index}", "cam", "OK")
        if index % 100 == 0:
            metrics.observe_answer("site-a", "dock", "OK")

    assert metrics.stream_labels("new-agent", "cam") == ("other", "other")  # the flood is fresh
    assert _frames(metrics, "other", "other") == 101.0  # 999 slots went to the flood

    clock.now += 600.0  # the flood stopped ten minutes ago; site-a did not
    metrics.observe_answer("site-a", "dock", "OK")
    metrics.observe_answer("new-agent", "cam", "OK")

    assert metrics.stream_labels("new-agent", "cam") == ("new-agent", "cam")
    assert _frames(metrics, "new-agent", "cam") == 1.0
    assert _frames(metrics, "site-a", "dock") == 13.0  # never evicted
    assert _frames(metrics, "flood-0", "cam") is None  # its slot and series went to new-agent
    assert _frames(metrics, "flood-1", "cam") == 1.0
    evicted = metrics.registry.get_sample_value("cloud_service_stream_labels_evicted_total")
    assert evicted == 1.0


def test_with_no_idle_time_the_least_recent_key_always_makes_room() -> None:
    clock = _Clock()
    metrics = ServiceMetrics(max_stream_labels=2, stream_label_idle_s=0.0, clock=clock)
    for camera in ("a", "b", "a", "c"):
        clock.now += 1.0
        metrics.observe_answer("agent", camera, "OK")

    assert metrics.stream_labels("agent", "a") == ("agent", "a")
    assert _frames(metrics, "agent", "b") is None
    assert _frames(metrics, "agent", "c") == 1.0


def test_label_idle_time_is_bounded_in_config() -> None:
    assert CloudMetricsConfig().stream_label_idle_s == 600.0
    with pytest.raises(pydantic.ValidationError, match="greater than or equal to 0"):
        CloudMetricsConfig(stream_label_idle_s=-1.0)


# ---- refused streams and cancelled ones, over gRPC ----------------------------------------------


class _Echo:
    def process(self, requests: Sequence[pb.FrameRequest]) -> list[pb.FrameResult]:
        return [empty_result(r) for r in requests]


def test_refused_streams_log_one_line_and_count_all(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cloud_service.servicer")
    metrics = ServiceMetrics()
    servicer = InferenceServicer(_Echo(), max_streams=1, metrics=metrics)
    server, port = create_server(ServerConfig(listen_address="127.0.0.1:0"), servicer)
    server.start()
    release = threading.Event()

    def frames() -> Iterator[pb.FrameRequest]:
        yield make_request("cam", 1, jpeg=b"")
        release.wait(RPC_TIMEOUT_S)

    def value(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = InferenceServiceStub(channel)
            held = stub.StreamFrames(frames(), timeout=RPC_TIMEOUT_S)
            assert next(held).frame_id == 1
            for _ in range(30):
                with pytest.raises(grpc.RpcError) as refused:
                    next(stub.StreamFrames(frames(), timeout=RPC_TIMEOUT_S))
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            held.cancel()
            release.set()
            closed = _wait_for_line(caplog, "closed after")
    finally:
        release.set()
        server.stop(0).wait()

    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelno == logging.WARNING
    assert value("cloud_service_frame_streams_refused_total") == 30.0
    suppressed = "cloud_service_log_lines_suppressed_total"
    assert value(suppressed, event="stream_refused") == 29.0
    # the cancelled stream names its client (gRPC's peer() is empty once a call is cancelled)
    assert closed.startswith("frame stream from ipv4:127.0.0.1:"), closed
    opened = [r.getMessage() for r in caplog.records if r.getMessage().endswith(" opened")]
    assert closed.split(" closed")[0] + " opened" in opened


def _wait_for_line(caplog: pytest.LogCaptureFixture, text: str) -> str:
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        for record in caplog.records:
            if text in record.getMessage():
                return record.getMessage()
        time.sleep(0.05)
    raise AssertionError(f"no log line with {text!r}")


# ---- start-up and stop lines of a real service --------------------------------------------------


def test_start_up_names_the_loaded_model_and_a_stop_drains_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="cloud_service")
    config = CloudServiceConfig.model_validate(
        {
            "server": {"listen_address": "127.0.0.1:0"},
            "batching": {"max_batch_size": 1},
            "engine": {
                "runtime": {"type": "onnxruntime", "model_path": str(COCO_FP32)},
                "input_size": [320, 320],
            },
        }
    )
    service = build_service(config)
    try:
        line = startup_line(config, service)
        service.server.start()
        service.server.stop(1.0).wait()
    finally:
        service.close()

    version = service.models.models[0].info.version
    assert line.startswith(f"cloud service: model nanodet-coco:{version} on onnxruntime"), line
    assert "<metadata>" not in line and f"(port {service.port})" in line
    drains = [r for r in caplog.records if r.getMessage().startswith("batcher draining")]
    assert len(drains) == 1, [r.getMessage() for r in drains]


def test_wrong_tokens_log_one_line(
    grpc_server_factory: ServerFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="cloud_service.auth")
    monkeypatch.setenv("LOG_TEST_TOKENS", "right")
    config = ServerConfig(listen_address="127.0.0.1:0", auth_tokens_env="LOG_TEST_TOKENS")
    running = grpc_server_factory(_Echo(), config)
    for _ in range(20):
        with pytest.raises(grpc.RpcError) as refused:
            running.stub.DetectFrame(
                make_request(), metadata=(("authorization", "Bearer wrong"),), timeout=10
            )
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED

    lines = [r.getMessage() for r in caplog.records if r.name == "cloud_service.auth"]
    assert lines == ["unauthenticated call to /analytics.v1.InferenceService/DetectFrame rejected"]
