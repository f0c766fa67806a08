"""Hot swap of in-process engines: `CloudService.reload` and SIGHUP on `cloud-service serve`.

The COCO NanoDet in FP32 answers first; the reload brings its INT8 export (another model version)
while frames keep streaming. Every frame gets an answer, none an error, and once the new version
answered the old one never does again. A reload whose model does not load keeps the old one.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import simplejpeg
import yaml

from cloud_service.app import build_service
from cloud_service.config import BatchingConfig, CloudServiceConfig, ServerConfig
from detection.config import DetectorConfig
from detection.runtimes.config import OnnxRuntimeConfig
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub
from tests.fixtures.cloud_process import CloudProcess
from tests.fixtures.grpc_server import make_request
from tests.fixtures.processes import free_tcp_port
from tests.fixtures.triton import FP32_MODEL, INT8_MODEL

OK = grpc.StatusCode.OK.value[0]
RPC_TIMEOUT_S = 60.0

Image = np.ndarray[Any, np.dtype[np.uint8]]


def _config(model: Path, listen: str = "127.0.0.1:0") -> CloudServiceConfig:
    return CloudServiceConfig(
        server=ServerConfig(listen_address=listen, worker_threads=8),
        batching=BatchingConfig(
            max_batch_size=4, max_queue_delay_ms=5.0, default_deadline_ms=60_000
        ),
        engine=DetectorConfig(
            runtime=OnnxRuntimeConfig(model_path=model, intra_op_threads=1),
            input_size=(320, 320),
        ),
    )


def _jpeg(image: Image) -> bytes:
    return bytes(simplejpeg.encode_jpeg(image, quality=90, colorspace="BGR"))


def test_reload_swaps_the_model_under_load_without_losing_a_frame(bus_image: Image) -> None:
    service = build_service(_config(FP32_MODEL))
    service.server.start()
    jpeg = _jpeg(bus_image)
    stop = threading.Event()
    answers: dict[int, list[pb.FrameResult]] = {}

    def stream(index: int, stub: InferenceServiceStub) -> None:
        got = answers.setdefault(index, [])
        frame_id = 0
        while not stop.is_set():
            frame_id += 1
            got.append(stub.DetectFrame(make_request(f"cam-{index}", frame_id, jpeg=jpeg)))

    try:
        with grpc.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            stub = InferenceServiceStub(channel)
            threads = [threading.Thread(target=stream, args=(i, stub)) for i in range(3)]
            for thread in threads:
                thread.start()
            time.sleep(1.0)
            swapped = service.reload(_config(INT8_MODEL))
            broken = service.reload(_config(Path("/no/such/model.onnx")))
            time.sleep(1.0)
            stop.set()
            for thread in threads:
                thread.join(timeout=RPC_TIMEOUT_S)
    finally:
        service.server.stop(1.0).wait()
        service.close()

    assert swapped and not broken
    results = [r for got in answers.values() for r in got]
    assert all(r.status.code == OK for r in results), {r.status.message for r in results}
    for got in answers.values():
        versions = [r.model_version for r in got]
        assert versions[0] == "3.0.4-fp32" and versions[-1] == "3.0.4-int8", versions
        assert "3.0.4-fp32" not in versions[versions.index("3.0.4-int8") :]


@pytest.mark.process
def test_sighup_reloads_the_config_file_of_a_running_service(
    tmp_path: Path, bus_image: Image
) -> None:
    address = f"127.0.0.1:{free_tcp_port()}"
    document = _config(FP32_MODEL, address).model_dump(mode="json")
    cloud = CloudProcess(document, tmp_path)
    jpeg = _jpeg(bus_image)
    cloud.start()
    try:
        with grpc.insecure_channel(address) as channel:
            stub = InferenceServiceStub(channel)
            before = stub.DetectFrame(make_request("cam", 1, jpeg=jpeg), timeout=RPC_TIMEOUT_S)
            document["engine"]["runtime"]["model_path"] = str(INT8_MODEL)
            cloud.config.write_text(yaml.safe_dump(document))
            cloud.process.send_signal(signal.SIGHUP)
            after = before
            deadline = time.monotonic() + 30.0
            frame_id = 1
            while after.model_version == before.model_version and time.monotonic() < deadline:
                frame_id += 1
                after = stub.DetectFrame(make_request("cam", frame_id, jpeg=jpeg), timeout=30)
                assert after.status.code == OK, after.status.message
                time.sleep(0.1)
    finally:
        cloud.stop()

    assert (before.model_version, after.model_version) == ("3.0.4-fp32", "3.0.4-int8")
    assert cloud.process.returncode == 0
