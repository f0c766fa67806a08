"""The cloud service with sliced inference on: the COCO NanoDet served over real gRPC.

Every test runs twice: on the in-process ONNX Runtime engine and on `engine.runtime.type:
triton` (the same model in a real Triton), which must pass them unchanged.

`build_service` from a `CloudServiceConfig` whose `slicing:` section is enabled, on port 0: whole
frames go to the detector with their tiles in one call, region crops alone, one answer per frame.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import simplejpeg

from cloud_service.app import CloudService, build_service
from cloud_service.config import BatchingConfig, CloudServiceConfig, ServerConfig
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.runtimes.config import OnnxRuntimeConfig, TritonConfig
from detection.slicing import SlicingConfig
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub
from testbed.triton import RunningTriton
from tests.fixtures.grpc_server import make_request

MODEL = Path(__file__).resolve().parents[2] / "models" / "coco" / "nanodet-coco-fp32.onnx"
INPUT = 320
OK = grpc.StatusCode.OK.value[0]
RPC_TIMEOUT_S = 60.0

pytestmark = pytest.mark.skipif(not MODEL.is_file(), reason=f"{MODEL.name} not present")


def _class_names() -> list[str]:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    names: list[str] = json.loads(session.get_modelmeta().custom_metadata_map["class_names"])
    return names


@pytest.fixture(
    scope="module", params=["onnxruntime", pytest.param("triton", marks=pytest.mark.process)]
)
def service(request: pytest.FixtureRequest) -> Iterator[CloudService]:
    """The service on the in-process engine, then the same tests on a real Triton."""
    runtime: OnnxRuntimeConfig | TritonConfig = OnnxRuntimeConfig(
        model_path=MODEL, intra_op_threads=2
    )
    if request.param == "triton":
        triton: RunningTriton = request.getfixturevalue("triton")
        runtime = TritonConfig(url=triton.grpc_target, model_name="nanodet")
    engine = DetectorConfig(
        runtime=runtime,
        class_names=_class_names(),
        input_size=(INPUT, INPUT),
        box_units="pixels",
    )
    config = CloudServiceConfig(
        server=ServerConfig(listen_address="127.0.0.1:0", worker_threads=4),
        # a sliced frame costs several model passes: generous deadlines on a busy CI machine
        batching=BatchingConfig(
            max_batch_size=2, max_queue_delay_ms=5.0, default_deadline_ms=60_000
        ),
        engine=engine,
        slicing=SlicingConfig(enabled=True),
        model_name="nanodet-coco",
        model_version="test",
    )
    built = build_service(config)
    built.server.start()
    yield built
    built.server.stop(1.0).wait()
    built.close()


@pytest.fixture
def calls(service: CloudService, monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[int, ...]]]:
    """The image shapes of each call the engine makes to the wrapped detector."""
    detector = service.engine.detector
    seen: list[list[tuple[int, ...]]] = []
    original = detector.detect

    def spy(images: Sequence[Any], *, scale_up: bool | Sequence[bool] = True) -> list[Detections]:
        seen.append([image.shape for image in images])
        return original(images, scale_up=scale_up)

    monkeypatch.setattr(detector, "detect", spy)
    return seen


@pytest.fixture
def stub(service: CloudService) -> Iterator[InferenceServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        yield InferenceServiceStub(channel)


def _jpeg(image: np.ndarray[Any, np.dtype[np.uint8]]) -> bytes:
    return bytes(simplejpeg.encode_jpeg(image, quality=90, colorspace="BGR"))


def test_sliced_service_answers_whole_frames_with_tiles_in_one_detector_call(
    service: CloudService,
    stub: InferenceServiceStub,
    calls: list[list[tuple[int, ...]]],
    bus_image: np.ndarray[Any, np.dtype[np.uint8]],
) -> None:
    assert service.engine.sliced is not None
    height, width = bus_image.shape[:2]
    tiles = service.engine.sliced.plan((height, width))
    assert len(tiles) > 1

    result = stub.DetectFrame(make_request("cam", 1, jpeg=_jpeg(bus_image)), timeout=RPC_TIMEOUT_S)

    assert result.status.code == OK, result.status.message
    assert (result.model_name, result.model_version) == ("nanodet-coco", "test")
    assert calls == [[(height, width, 3)] + [(t.height, t.width, 3) for t in tiles]]
    persons = [d for d in result.detections if d.class_name == "person"]
    assert len(persons) >= 3  # bus.jpg: four people in front of the bus
    assert any(d.class_name == "bus" for d in result.detections)
    for d in result.detections:
        assert 0 <= d.x1 < d.x2 <= width and 0 <= d.y1 < d.y2 <= height


def test_sliced_service_streams_one_answer_per_frame_and_never_slices_regions(
    stub: InferenceServiceStub,
    calls: list[list[tuple[int, ...]]],
    bus_image: np.ndarray[Any, np.dtype[np.uint8]],
) -> None:
    height, width = bus_image.shape[:2]
    crop = np.ascontiguousarray(bus_image[400:900, 0:300])  # a person; larger than the input
    region = pb.Region(x1=0, y1=400, x2=300, y2=900, jpeg=_jpeg(crop))
    requests = [
        make_request("cam", 10, jpeg=_jpeg(bus_image)),
        make_request(
            "cam", 11, jpeg=b"", original_width=width, original_height=height, regions=[region]
        ),
        make_request("cam", 12, jpeg=_jpeg(bus_image)),
    ]

    results = list(stub.StreamFrames(iter(requests), timeout=RPC_TIMEOUT_S))

    assert sorted(r.frame_id for r in results) == [10, 11, 12]
    assert all(r.status.code == OK for r in results), [r.status.message for r in results]
    images = [shape for call in calls for shape in call]
    assert images.count((500, 300, 3)) == 1  # the crop ran once, as it is: no tiles of it
    by_frame = {r.frame_id: r for r in results}
    assert any(d.class_name == "person" for d in by_frame[11].detections)
    for d in by_frame[11].detections:  # crop boxes come back in source-frame pixels
        assert d.region_index == 0
        assert 0 <= d.x1 and d.x2 <= 300 + 1 and 400 - 1 <= d.y1 and d.y2 <= 900 + 1
    assert len(by_frame[10].detections) == len(by_frame[12].detections)
