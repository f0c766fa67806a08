"""The cloud service with `engine.runtime.type: triton` against a real Triton server.

Triton (PyTriton's bundled `tritonserver`, see `tests/fixtures/triton.py`) hosts the committed
COCO NanoDet through its Python backend. The service is built from config as in production and
driven over real gRPC: its answers match the in-process engine's, a version Triton loads while
frames stream takes over without a lost frame, an A/B split sends whole agents to the candidate,
and a Triton that is down gives a clear error at start and UNAVAILABLE per frame while running.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import simplejpeg

from cloud_service.app import CloudService, build_service
from cloud_service.config import BatchingConfig, CandidateConfig, CloudServiceConfig, ServerConfig
from cloud_service.models import TrafficSplit
from detection.config import DetectorConfig
from detection.errors import ModelLoadError
from detection.runtimes.config import OnnxRuntimeConfig, TritonConfig
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub
from protos.inference.v2 import inference_pb2 as triton_pb
from testbed.processes import free_tcp_port
from testbed.triton import RunningTriton, running_triton
from tests.fixtures.grpc_server import make_request
from tests.fixtures.triton import FP32_MODEL, INT8_MODEL, make_repository, require_triton

pytestmark = pytest.mark.process  # a real Triton server

OK = grpc.StatusCode.OK.value[0]
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
RPC_TIMEOUT_S = 60.0
INPUT = 320

Image = np.ndarray[Any, np.dtype[np.uint8]]


def _jpeg(image: Image) -> bytes:
    return bytes(simplejpeg.encode_jpeg(image, quality=90, colorspace="BGR"))


def _detector(runtime: OnnxRuntimeConfig | TritonConfig) -> DetectorConfig:
    return DetectorConfig(runtime=runtime, input_size=(INPUT, INPUT), box_units="pixels")


def _triton(
    server: RunningTriton, model: str = "nanodet", version: str = "", **fields: Any
) -> DetectorConfig:
    runtime = TritonConfig(
        url=server.grpc_target, model_name=model, model_version=version, **fields
    )
    return _detector(runtime)


def _config(engine: DetectorConfig, **fields: Any) -> CloudServiceConfig:
    return CloudServiceConfig(
        server=ServerConfig(listen_address="127.0.0.1:0", worker_threads=8),
        batching=BatchingConfig(
            max_batch_size=4, max_queue_delay_ms=5.0, default_deadline_ms=60_000
        ),
        engine=engine,
        **fields,
    )


@contextmanager
def _serving(config: CloudServiceConfig) -> Iterator[tuple[CloudService, InferenceServiceStub]]:
    service = build_service(config)
    service.server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            yield service, InferenceServiceStub(channel)
    finally:
        service.server.stop(1.0).wait()
        service.close()


def _boxes(result: pb.FrameResult) -> list[tuple[str, float, float, float, float, float]]:
    return sorted((d.class_name, d.score, d.x1, d.y1, d.x2, d.y2) for d in result.detections)


def test_triton_engine_answers_as_the_in_process_engine(
    triton: RunningTriton, bus_image: Image
) -> None:
    crop = np.ascontiguousarray(bus_image[400:900, 0:300])
    height, width = bus_image.shape[:2]
    requests = [
        make_request("cam", 1, jpeg=_jpeg(bus_image)),
        make_request(
            "cam",
            2,
            jpeg=b"",
            original_width=width,
            original_height=height,
            regions=[pb.Region(x1=0, y1=400, x2=300, y2=900, jpeg=_jpeg(crop))],
        ),
        make_request("cam", 3, jpeg=b"not a jpeg"),
    ]
    answers = {}
    for name, engine in (
        ("in-process", _detector(OnnxRuntimeConfig(model_path=FP32_MODEL))),
        ("triton", _triton(triton)),
    ):
        with _serving(_config(engine)) as (_, stub):
            answers[name] = sorted(
                stub.StreamFrames(iter(requests), timeout=RPC_TIMEOUT_S), key=lambda r: r.frame_id
            )

    local, remote = answers["in-process"], answers["triton"]
    assert (
        [r.status.code for r in remote]
        == [r.status.code for r in local]
        == [
            OK,
            OK,
            grpc.StatusCode.INVALID_ARGUMENT.value[0],
        ]
    )
    persons = [d for d in remote[0].detections if d.class_name == "person"]
    assert len(persons) >= 3  # bus.jpg: four people in front of the bus
    for here, there in zip(local[:2], remote[:2], strict=True):
        assert len(_boxes(here)) == len(_boxes(there)) > 0
        np.testing.assert_allclose(
            [b[1:] for b in _boxes(here)], [b[1:] for b in _boxes(there)], atol=1e-3
        )
        assert [b[0] for b in _boxes(here)] == [b[0] for b in _boxes(there)]
    # the name from the model's metadata (Triton config parameters), the version from Triton
    assert (remote[0].model_name, remote[0].model_version) == ("nanodet-coco", "1")
    assert (local[0].model_name, local[0].model_version) == ("nanodet-coco", "3.0.4-fp32")


def _stream_until(
    stub: InferenceServiceStub, agent: str, stop: threading.Event, jpeg: bytes
) -> list[pb.FrameResult]:
    """Send frames one after another until `stop`; every answer, in order."""
    answers = []
    frame_id = 0
    while not stop.is_set():
        frame_id += 1
        request = make_request("cam", frame_id, jpeg=jpeg)
        request.agent_id = agent
        answers.append(stub.DetectFrame(request, timeout=RPC_TIMEOUT_S))
    return answers


def test_a_version_triton_loads_under_load_takes_over_without_a_lost_frame(
    tmp_path: Path, bus_image: Image
) -> None:
    require_triton()
    repository = make_repository(tmp_path, "nanodet-live")
    jpeg = _jpeg(bus_image)
    with running_triton(repository, tmp_path / "work") as server:
        with _serving(_config(_triton(server, "nanodet-live"))) as (_, stub):
            stop = threading.Event()
            results: dict[str, list[pb.FrameResult]] = {}

            def run(agent: str) -> None:
                results[agent] = _stream_until(stub, agent, stop, jpeg)

            threads = [threading.Thread(target=run, args=(f"agent-{i}",)) for i in range(3)]
            for thread in threads:
                thread.start()
            time.sleep(1.5)
            from cloud_service.triton_repository import add_version

            add_version(repository, "nanodet-live", INT8_MODEL, 2, max_batch_size=8)
            server.stub().RepositoryModelLoad(
                triton_pb.RepositoryModelLoadRequest(model_name="nanodet-live"), timeout=120
            )
            time.sleep(1.5)
            stop.set()
            for thread in threads:
                thread.join(timeout=RPC_TIMEOUT_S)

    answers = [r for agent in results.values() for r in agent]
    assert len(answers) >= 6
    assert all(r.status.code == OK for r in answers), {r.status.message for r in answers}
    for agent in results.values():
        versions = [r.model_version for r in agent]
        assert versions[0] == "1" and versions[-1] == "2", versions
        # once version 2 answered, version 1 never did again
        assert "1" not in versions[versions.index("2") :], versions


def test_candidate_answers_its_share_of_agents(triton: RunningTriton, bus_image: Image) -> None:
    split = TrafficSplit(0.5, "agent")
    agents = [f"agent-{i}" for i in range(12)]
    to_candidate = {a for a in agents if split.to_candidate(a, "cam", 0)}
    assert 0 < len(to_candidate) < len(agents)
    config = _config(
        _triton(triton, "nanodet-ab", "1"),
        candidate=CandidateConfig(engine=_triton(triton, "nanodet-ab", "2"), share=0.5),
    )
    jpeg = _jpeg(bus_image)
    requests = []
    for agent in agents:
        for frame_id in (1, 2):
            request = make_request("cam", frame_id, jpeg=jpeg)
            request.agent_id = agent
            requests.append(request)

    with _serving(config) as (service, stub):
        results = list(stub.StreamFrames(iter(requests), timeout=RPC_TIMEOUT_S))
        registry = service.metrics.registry
        counted = {
            version: registry.get_sample_value(
                "cloud_service_model_frames_total", {"model": "nanodet-coco", "version": version}
            )
            for version in ("1", "2")
        }

    assert len(results) == len(requests)
    assert all(r.status.code == OK for r in results)
    for result in results:
        expected = "2" if result.agent_id in to_candidate else "1"
        assert result.model_version == expected, result.agent_id
    assert counted == {"1": 2.0 * (len(agents) - len(to_candidate)), "2": 2.0 * len(to_candidate)}


def test_a_triton_that_is_down_or_lacks_the_model_is_a_clear_error_at_start(
    triton: RunningTriton,
) -> None:
    down = _config(_triton_at(f"127.0.0.1:{free_tcp_port()}", startup_timeout_s=0.5))
    with pytest.raises(ModelLoadError, match=r"Triton at 127\.0\.0\.1:\d+, model 'nanodet'"):
        build_service(down)

    missing = _config(_triton(triton, "no-such-model", startup_timeout_s=0.5))
    with pytest.raises(ModelLoadError, match="model not ready"):
        build_service(missing)


def _triton_at(url: str, **fields: Any) -> DetectorConfig:
    return _detector(TritonConfig(url=url, model_name="nanodet", **fields))


def test_frames_get_unavailable_while_triton_hangs_or_is_down_and_ok_when_it_is_back(
    tmp_path: Path, bus_image: Image
) -> None:
    require_triton()
    repository = make_repository(tmp_path, "nanodet")
    jpeg = _jpeg(bus_image)
    with running_triton(repository, tmp_path / "work") as server:
        engine = _triton(server, request_timeout_s=2.0)
        with _serving(_config(engine)) as (_, stub):
            assert stub.DetectFrame(make_request("cam", 1, jpeg=jpeg), timeout=30).status.code == OK

            server.process.suspend()  # hung: accepts connections, answers nothing
            started = time.monotonic()
            hung = stub.DetectFrame(make_request("cam", 50, jpeg=jpeg), timeout=30)
            hung_waited = time.monotonic() - started
            server.process.resume()
            resumed = _answers_until_ok(stub, jpeg, timeout_s=15.0)

            server.process.kill()
            started = time.monotonic()
            down = stub.DetectFrame(make_request("cam", 2, jpeg=jpeg), timeout=30)
            waited = time.monotonic() - started

            server.process.start(ready_timeout_s=90)
            back = _answers_until_ok(stub, jpeg, timeout_s=15.0)

    assert hung.status.code == UNAVAILABLE, hung.status.message
    assert "DEADLINE_EXCEEDED" in hung.status.message
    assert 2.0 <= hung_waited < 10.0  # request_timeout_s, then the answer
    assert resumed[-1].status.code == OK
    assert down.status.code == UNAVAILABLE, down.status.message
    assert "Triton at" in down.status.message
    assert waited < 10.0  # the request deadline, not a hang
    # the channel reconnects by itself within its short back-off once Triton is back
    assert back[-1].status.code == OK, back[-1].status.message
    assert all(r.status.code in (OK, UNAVAILABLE) for r in back)


def _answers_until_ok(
    stub: InferenceServiceStub, jpeg: bytes, *, timeout_s: float
) -> list[pb.FrameResult]:
    """Frames every 0.2 s until one is answered OK (or `timeout_s`); all answers."""
    answers: list[pb.FrameResult] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answers.append(
            stub.DetectFrame(make_request("cam", 100 + len(answers), jpeg=jpeg), timeout=30)
        )
        if answers[-1].status.code == OK:
            break
        time.sleep(0.2)
    return answers
