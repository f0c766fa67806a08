"""Every shipped example config runs: `cloud-service serve` and `edge-agent run` on each of them.

A new user runs `configs/*.yaml` as written. Here each one is started for real. The test copy
changes only what names another site's machines: camera URLs become a real local clip (the
first enabled camera; the others are disabled), the broker and the cloud become local ones,
and TLS, credentials, ports and state paths become local ones. Model, detector, tracker, rules,
escalation and fusion settings stay as shipped.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from cloud_service.config import CloudServiceConfig
from cloud_service.triton_repository import add_version
from configkit.yaml_loader import load_config
from detection.runtimes.config import TritonConfig
from edge_agent.alerts.payload import status_topic
from edge_agent.config import EdgeAgentConfig
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub
from testbed.media import sample_image
from testbed.triton import running_triton
from tests.fixtures.agent_process import AgentProcess
from tests.fixtures.cloud_process import CloudProcess
from tests.fixtures.mqtt import MosquittoBroker, MqttRecorder
from tests.fixtures.processes import free_tcp_port
from tests.fixtures.rtsp import MEDIA_CACHE_DIR
from tests.fixtures.triton import FP32_MODEL, require_triton

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
CLOUD_CONFIGS = sorted(CONFIGS.glob("cloud-service*.yaml"))
EDGE_CONFIGS = sorted(CONFIGS.glob("edge-agent*.yaml"))
STREAMING_TIMEOUT_S = 90.0


def _load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def test_every_shipped_config_validates_and_names_committed_files() -> None:
    assert CLOUD_CONFIGS and EDGE_CONFIGS
    for path in CLOUD_CONFIGS:
        config = load_config(path, CloudServiceConfig)
        if isinstance(config.engine.runtime, TritonConfig):
            continue  # the model is in Triton's repository (made from a committed file here)
        model = getattr(config.engine.runtime, "model_path", None)
        assert model is not None and (REPO / model).is_file(), f"{path.name}: {model}"
    for path in EDGE_CONFIGS:
        edge = load_config(path, EdgeAgentConfig)
        model = getattr(edge.detector.runtime, "model_path", None)
        assert model is not None and (REPO / model).is_file(), f"{path.name}: {model}"


def _local_cloud(path: Path) -> dict[str, Any]:
    document = _load(path)
    document.setdefault("server", {})["listen_address"] = f"127.0.0.1:{free_tcp_port()}"
    document["server"].pop("tls", None)
    document["server"].pop("auth_tokens_env", None)
    document.setdefault("metrics", {})["listen_port"] = free_tcp_port()
    document["metrics"]["listen_host"] = "127.0.0.1"
    return document


@pytest.fixture(scope="module")
def bus_jpeg() -> bytes:
    return sample_image(MEDIA_CACHE_DIR, name="bus").read_bytes()


@contextmanager
def _engine_for(document: dict[str, Any], folder: Path) -> Iterator[None]:
    """For a `triton` engine, a real Triton serving the config's model name (the committed
    COCO NanoDet, which the shipped configs run) at the address the document then names."""
    runtime = document["engine"]["runtime"]
    if runtime["type"] != "triton":
        yield
        return
    require_triton()
    repository = folder / "triton-models"
    add_version(repository, runtime["model_name"], FP32_MODEL, 1)
    with running_triton(repository, folder / "triton") as triton:
        runtime["url"] = triton.grpc_target
        yield


@pytest.mark.process
@pytest.mark.parametrize("path", CLOUD_CONFIGS, ids=lambda p: p.name)
def test_cloud_config_serves_real_detections(tmp_path: Path, path: Path, bus_jpeg: bytes) -> None:
    document = _local_cloud(path)
    with _engine_for(document, tmp_path):
        _serve_the_bus(CloudProcess(document, tmp_path, name=path.stem), bus_jpeg)


def _serve_the_bus(cloud: CloudProcess, bus_jpeg: bytes) -> None:
    cloud.start()
    try:
        with grpc.insecure_channel(cloud.address) as channel:
            request = pb.FrameRequest(
                agent_id="shipped-config-test",
                camera_id="bus",
                frame_id=1,
                request_id="bus/1",
                jpeg=bus_jpeg,
            )
            result = InferenceServiceStub(channel).DetectFrame(request, timeout=60)
        assert result.model_name == "nanodet-coco"
        labels = [d.class_name for d in result.detections]
        assert labels.count("person") >= 3, labels  # bus.jpg shows four people and a bus
        assert "bus" in labels
    finally:
        cloud.stop()
    assert cloud.process.returncode == 0, cloud.log.read_text()[-2000:]


def _local_edge(
    path: Path,
    folder: Path,
    clip: Path,
    broker: MosquittoBroker,
    cloud_address: str,
) -> dict[str, Any]:
    document = _load(path)
    cameras = [c for c in document["cameras"] if c.get("enabled", True)]
    first = cameras[0]
    first["url"] = str(clip)
    for key in ("username", "password"):
        first.pop(key, None)
    first.pop("capture", None)  # site-specific decoding (e.g. a Jetson GStreamer pipeline)
    for camera in document["cameras"]:
        if camera is not first:
            camera["enabled"] = False
    mqtt = document.setdefault("mqtt", {})
    mqtt.update({"host": broker.host, "port": broker.port})
    for key in ("tls", "username", "password"):
        mqtt.pop(key, None)
    mqtt["outbox_path"] = str(folder / "outbox.sqlite3")
    mqtt["status_interval_s"] = 1
    escalation = document.get("escalation")
    if escalation and escalation.get("enabled"):
        escalation["cloud_address"] = cloud_address
        escalation["tls"] = False
        for key in ("tls_ca_path", "auth_token"):
            escalation.pop(key, None)
    metrics = document.setdefault("metrics", {})
    metrics.update({"listen_host": "127.0.0.1", "listen_port": free_tcp_port()})
    web = document.get("web")
    if web and web.get("enabled"):
        web.update({"host": "127.0.0.1", "port": free_tcp_port()})
        web.pop("auth", None)
    media = document.get("media")
    if media and media.get("enabled"):
        media["directory"] = str(folder / "media")
    return document


@pytest.fixture(scope="module")
def local_cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudProcess]:
    folder = tmp_path_factory.mktemp("cloud")
    cloud = CloudProcess(_local_cloud(CONFIGS / "cloud-service.cpu.yaml"), folder)
    cloud.start()
    yield cloud
    cloud.stop()


@pytest.mark.parametrize("path", EDGE_CONFIGS, ids=lambda p: p.name)
def test_edge_config_runs_on_a_real_clip(
    tmp_path: Path,
    path: Path,
    sample_clip: Path,
    mosquitto_broker: MosquittoBroker,
    local_cloud: CloudProcess,
) -> None:
    document = _local_edge(path, tmp_path, sample_clip, mosquitto_broker, local_cloud.address)
    config_path = tmp_path / path.name
    config_path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    camera = next(c["name"] for c in document["cameras"] if c.get("enabled", True))
    config = load_config(config_path, EdgeAgentConfig)
    agent_id, prefix = config.agent.id, config.mqtt.topic_prefix
    recorder = MqttRecorder(mosquitto_broker, f"{prefix}/#")
    agent = AgentProcess(config_path, tmp_path / "agent.log")
    try:
        topic = status_topic(prefix, agent_id, camera)

        def analysing(messages: list[Any]) -> bool:
            for message in messages:
                if message.topic == topic:
                    status = json.loads(message.payload)
                    if status.get("state") == "streaming" and status.get("frames_analysed", 0):
                        return True
            return False

        deadline = time.monotonic() + STREAMING_TIMEOUT_S
        while not analysing(recorder.messages):
            assert agent.process.poll() is None, agent.tail()
            assert time.monotonic() < deadline, agent.tail()
            time.sleep(0.2)
        if config.web.enabled:  # the shipped status page answers, with the camera on it
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            url = f"http://127.0.0.1:{config.web.port}/api/status"
            with opener.open(url, timeout=10) as response:
                report = json.loads(response.read())
            assert camera in json.dumps(report), report
    finally:
        code = agent.stop()
        recorder.close()
    assert code == 0, agent.tail()
