"""`DetectorFrameProcessor`: per-frame errors, deadlines, regions and scaling, detector failures."""

from __future__ import annotations

import time
from collections.abc import Sequence

import grpc
import numpy as np
import numpy.typing as npt
import pytest

from cloud_service.convert import status_code_from_proto, timestamp_from_seconds
from cloud_service.decoders import CpuDecoder, DecodeResult, JpegLimits
from cloud_service.processor import DetectorFrameProcessor
from detection.detections import Detections
from protos.analytics.v1 import analytics_pb2 as pb
from tests.fixtures.grpc_server import (
    FAKE_MODEL,
    FakeDetector,
    ServerFactory,
    make_jpeg,
    make_request,
)

GOOD = make_jpeg(160, 120)
BAD_PAYLOADS = {
    "corrupt": GOOD[:300] + bytes(range(256)) * 4 + GOOD[300 + 1024 :],
    "truncated": GOOD[: len(GOOD) // 2],
    "png": b"\x89PNG\r\n\x1a\n" + bytes(64),
    "text": b"hello, not an image",
}
RPC_TIMEOUT_S = 10.0


def _code(result: pb.FrameResult) -> grpc.StatusCode:
    return status_code_from_proto(result.status)


def test_bad_jpegs_fail_alone_in_a_batch() -> None:
    detector = FakeDetector()
    processor = DetectorFrameProcessor(detector, FAKE_MODEL)
    payloads = [GOOD, *BAD_PAYLOADS.values(), GOOD]
    requests = [make_request("cam", i, jpeg=p) for i, p in enumerate(payloads)]

    results = processor.process(requests)

    assert [r.frame_id for r in results] == list(range(len(payloads)))
    codes = [_code(r) for r in results]
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert codes == [grpc.StatusCode.OK, *[invalid] * len(BAD_PAYLOADS), grpc.StatusCode.OK]
    assert "truncated" in results[2].status.message
    assert "not a JPEG" in results[3].status.message
    assert all(not r.detections for r in results[1:-1])
    assert len(results[0].detections) == len(results[-1].detections) == 2
    assert detector.calls == [[(120, 160, 3), (120, 160, 3)]]


def test_bad_jpegs_through_the_stream(grpc_server_factory: ServerFactory) -> None:
    running = grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL))
    payloads = {"good-1": GOOD, **BAD_PAYLOADS, "good-2": GOOD}
    requests = [make_request(name, 1, jpeg=jpeg) for name, jpeg in payloads.items()]

    results = list(running.stub.StreamFrames(iter(requests), timeout=RPC_TIMEOUT_S))

    codes = {r.camera_id: _code(r) for r in results}
    assert len(results) == len(requests)
    assert codes == {
        name: grpc.StatusCode.OK if name.startswith("good") else grpc.StatusCode.INVALID_ARGUMENT
        for name in payloads
    }


def test_past_deadline_frames_skip_the_detector() -> None:
    now = 1_800_000_000.0
    detector = FakeDetector()
    processor = DetectorFrameProcessor(detector, FAKE_MODEL, clock=lambda: now)
    late = make_request("cam", 1, deadline=timestamp_from_seconds(now - 0.001))
    on_time = make_request("cam", 2, deadline=timestamp_from_seconds(now + 1.0))
    no_deadline = make_request("cam", 3)

    results = processor.process([late, on_time, no_deadline])

    assert [_code(r) for r in results] == [
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.OK,
        grpc.StatusCode.OK,
    ]
    assert not results[0].detections
    assert detector.images_seen == 2


def test_only_past_deadline_frames_never_call_the_detector(
    grpc_server_factory: ServerFactory,
) -> None:
    detector = FakeDetector()
    running = grpc_server_factory(DetectorFrameProcessor(detector, FAKE_MODEL))
    deadline = timestamp_from_seconds(time.time() - 5.0)
    requests = [make_request("cam", i, deadline=deadline) for i in range(5)]

    unary = running.stub.DetectFrame(make_request("cam", 99, deadline=deadline))
    streamed = list(running.stub.StreamFrames(iter(requests), timeout=RPC_TIMEOUT_S))

    assert {_code(r) for r in [unary, *streamed]} == {grpc.StatusCode.DEADLINE_EXCEEDED}
    assert len(streamed) == 5
    assert detector.calls == []


def test_regions_map_back_to_source_pixels() -> None:
    processor = DetectorFrameProcessor(FakeDetector(), FAKE_MODEL)
    # A 200x100 source region sent as a 100x50 crop: scale 2, offset (400, 300).
    region = pb.Region(x1=400, y1=300, x2=600, y2=400, jpeg=make_jpeg(100, 50))
    request = make_request(
        "cam", 1, jpeg=b"", original_width=1280, original_height=720, regions=[region]
    )

    (result,) = processor.process([request])

    assert _code(result) == grpc.StatusCode.OK, result.status.message
    first, second = result.detections
    assert (first.x1, first.y1, first.x2, first.y2) == (420.0, 340.0, 500.0, 460.0)
    assert (second.x1, second.y1, second.x2, second.y2) == (400.0, 300.0, 460.0, 360.0)
    assert first.region_index == 0 and second.HasField("region_index")


def test_boxes_are_clipped_to_the_source_frame() -> None:
    detector = FakeDetector(boxes=((-5.0, -5.0, 500.0, 500.0),), scores=(0.5,), class_ids=(7,))
    processor = DetectorFrameProcessor(detector, FAKE_MODEL)

    (result,) = processor.process([make_request(jpeg=make_jpeg(160, 120))])

    (box,) = result.detections
    assert (box.x1, box.y1, box.x2, box.y2) == (0.0, 0.0, 160.0, 120.0)
    assert box.class_id == 7 and box.class_name == ""


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"jpeg": b""}, "neither jpeg nor regions"),
        ({"regions": [pb.Region(x1=10, y1=10, x2=5, y2=20, jpeg=GOOD)]}, "x2 > x1"),
        ({"regions": [pb.Region(x1=0, y1=0, x2=5, y2=5)]}, "regions[0]: jpeg is empty"),
        ({"regions": [pb.Region(x1=-1, y1=0, x2=5, y2=5, jpeg=GOOD)]}, "invalid"),
        ({"regions": [pb.Region(x1=0, y1=0, x2=5, y2=5, jpeg=b"x")]}, "regions[0].jpeg: not a"),
    ],
)
def test_invalid_requests(request_fields: dict[str, object], message: str) -> None:
    detector = FakeDetector()
    processor = DetectorFrameProcessor(detector, FAKE_MODEL)
    fields = {"jpeg": b"", **request_fields}

    (result,) = processor.process([make_request(**fields)])  # type: ignore[arg-type]

    assert _code(result) == grpc.StatusCode.INVALID_ARGUMENT
    assert message in result.status.message
    assert detector.calls == []


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (JpegLimits(max_jpeg_bytes=len(GOOD) - 1), "max_jpeg_bytes"),
        (JpegLimits(max_image_pixels=160 * 120 - 1), "max_image_pixels"),
    ],
)
def test_limits_reject_big_frames(limits: JpegLimits, message: str) -> None:
    processor = DetectorFrameProcessor(FakeDetector(), FAKE_MODEL, limits=limits)

    (result,) = processor.process([make_request(jpeg=GOOD)])

    assert _code(result) == grpc.StatusCode.INVALID_ARGUMENT
    assert message in result.status.message


class _BrokenDetector:
    def __init__(self, extra: bool) -> None:
        self.extra = extra

    def detect(self, images: Sequence[npt.NDArray[np.uint8]]) -> list[Detections]:
        if self.extra:
            return [Detections.empty()] * (len(images) + 1)
        raise RuntimeError("GPU fell off")


@pytest.mark.parametrize("extra", [False, True])
def test_detector_failure_is_internal_for_the_detected_frames(extra: bool) -> None:
    processor = DetectorFrameProcessor(_BrokenDetector(extra), FAKE_MODEL)

    results = processor.process([make_request(frame_id=1), make_request(frame_id=2, jpeg=b"x")])

    assert [_code(r) for r in results] == [
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.INVALID_ARGUMENT,
    ]


class CountingDecoder(CpuDecoder):
    """A two-thread CPU decoder that records the size of each batch it is given."""

    def __init__(self) -> None:
        super().__init__(threads=2)
        self.batches: list[int] = []

    def decode_batch(self, payloads: Sequence[bytes]) -> list[DecodeResult]:
        self.batches.append(len(payloads))
        return super().decode_batch(payloads)


def test_all_jpegs_of_a_batch_go_to_the_decoder_at_once() -> None:
    decoder = CountingDecoder()
    processor = DetectorFrameProcessor(FakeDetector(), FAKE_MODEL, decoder=decoder)
    region = pb.Region(x1=0, y1=0, x2=10, y2=10, jpeg=GOOD)
    bad_region = pb.Region(x1=0, y1=0, x2=10, y2=10, jpeg=b"junk")
    requests = [
        make_request("cam", 1, jpeg=GOOD),
        make_request("cam", 2, jpeg=GOOD, regions=[region, bad_region]),
        make_request("cam", 3, jpeg=b"", regions=[region]),
    ]

    results = processor.process(requests)
    decoder.close()

    assert decoder.batches == [5]
    ok, invalid = grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT
    assert [_code(r) for r in results] == [ok, invalid, ok]
    assert results[1].status.message.startswith("regions[1].jpeg: not a JPEG")
    assert results[0].timings.decode_time_ms == results[2].timings.decode_time_ms > 0


def test_prepare_decodes_without_the_detector_and_finish_detects() -> None:
    detector = FakeDetector()
    processor = DetectorFrameProcessor(detector, FAKE_MODEL)
    requests = [make_request("cam", 1, jpeg=GOOD), make_request("cam", 2, jpeg=b"junk")]

    batch = processor.prepare(requests)
    assert detector.calls == [] and sorted(batch.frames) == [0]
    results = processor.finish(batch)

    assert detector.calls == [[(120, 160, 3)]]
    assert [_code(r) for r in results] == [grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT]
