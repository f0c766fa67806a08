"""The cloud's video uplink decoders and the processor path, with real encoders and decoders."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import grpc
import numpy as np
import numpy.typing as npt
import pytest
from prometheus_client import CollectorRegistry

from cloud_service.batching import DynamicBatcher, FrameProcessor
from cloud_service.config import BatchingConfig
from cloud_service.decoders.video import VideoLimits, VideoRejected, VideoSessions
from cloud_service.metrics import ServiceMetrics
from cloud_service.processor import DetectorFrameProcessor
from detection.detections import Detections
from edge_agent.config.uplink import UplinkConfig
from edge_agent.escalation.uplink import VideoUplinkEncoder
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.timestamps import timestamp_from_seconds
from tests.edge_agent.test_uplink import scene, to_proto
from tests.fixtures.grpc_server import FAKE_MODEL, FakeDetector, make_jpeg

BUDGET = 500_000.0


def packets(n: int, **config: object) -> list[pb.VideoPacket]:
    encoder = VideoUplinkEncoder(UplinkConfig.model_validate(config), budget_bytes_per_s=BUDGET)
    return [to_proto(encoder.encode(scene(i), now=0.5 * i)) for i in range(n)]


def rejection(sessions: VideoSessions, packet: pb.VideoPacket) -> VideoRejected:
    with pytest.raises(VideoRejected) as caught:
        sessions.decode("agent", "cam", packet)
    return caught.value


def test_a_gap_asks_for_a_keyframe_until_one_comes() -> None:
    sessions = VideoSessions()
    first, second, third, fourth = packets(4)
    sessions.decode("agent", "cam", first)
    lost = rejection(sessions, third)  # `second` never arrived
    assert lost.code is grpc.StatusCode.FAILED_PRECONDITION and lost.keyframe_required
    assert "send a keyframe" in lost.message
    # the session stays broken: even the packet that would have been next is refused
    assert rejection(sessions, second).keyframe_required
    assert rejection(sessions, fourth).keyframe_required
    restart = packets(2)
    assert sessions.decode("agent", "cam", restart[0]).shape == (240, 320, 3)
    assert sessions.decode("agent", "cam", restart[1]).shape == (240, 320, 3)


def test_an_unknown_session_and_an_evicted_decoder_ask_for_a_keyframe() -> None:
    sessions = VideoSessions(VideoLimits(max_sessions=2))
    inter = packets(2)[1]
    assert rejection(sessions, inter).code is grpc.StatusCode.FAILED_PRECONDITION
    streams = [packets(2) for _ in range(3)]
    for camera, stream in zip(("a", "b", "c"), streams, strict=True):
        sessions.decode("agent", camera, stream[0])
    assert len(sessions) == 2  # "a" was the least recently used
    with pytest.raises(VideoRejected) as caught:
        sessions.decode("agent", "a", streams[0][1])
    assert caught.value.keyframe_required
    assert sessions.decode("agent", "c", streams[2][1]).shape == (240, 320, 3)


def test_idle_sessions_are_dropped() -> None:
    now = [0.0]
    sessions = VideoSessions(VideoLimits(session_idle_s=10.0), clock=lambda: now[0])
    first = packets(2)
    sessions.decode("agent", "a", first[0])
    now[0] = 11.0
    sessions.decode("agent", "b", packets(1)[0])  # any new session sweeps the idle ones
    assert len(sessions) == 1
    assert rejection(sessions, first[1]).keyframe_required


@pytest.mark.parametrize(
    ("mangle", "code"),
    [
        (lambda p: p.__setattr__("data", p.data[: len(p.data) // 2]), "INVALID_ARGUMENT"),
        (lambda p: p.__setattr__("data", bytes(b ^ 0x5A for b in p.data)), "INVALID_ARGUMENT"),
        (lambda p: p.__setattr__("data", b""), "INVALID_ARGUMENT"),
        (lambda p: p.__setattr__("codec", "vp9"), "INVALID_ARGUMENT"),
        (lambda p: p.__setattr__("session", ""), "INVALID_ARGUMENT"),
        (lambda p: p.__setattr__("width", 100_000), "INVALID_ARGUMENT"),
    ],
    ids=["truncated", "corrupt", "empty", "unknown codec", "no session", "huge picture"],
)
def test_bad_keyframes_are_refused_per_frame_and_the_next_keyframe_decodes(
    mangle: object, code: str
) -> None:
    sessions = VideoSessions()
    bad = packets(1)[0]
    mangle(bad)  # type: ignore[operator]
    refused = rejection(sessions, bad)
    assert refused.code.name == code
    good = packets(2)
    sessions.decode("agent", "cam", good[0])
    sessions.decode("agent", "cam", good[1])


def test_a_corrupt_inter_frame_breaks_its_session_until_a_keyframe() -> None:
    sessions = VideoSessions()
    stream = packets(4)
    sessions.decode("agent", "cam", stream[0])
    stream[1].data = bytes(b ^ 0x5A for b in stream[1].data)
    assert rejection(sessions, stream[1]).keyframe_required
    assert rejection(sessions, stream[2]).code is grpc.StatusCode.FAILED_PRECONDITION


def test_a_stream_that_restarts_mid_sequence_goes_on_from_its_new_keyframe() -> None:
    sessions = VideoSessions()
    old, new = packets(3), packets(3)
    sessions.decode("agent", "cam", old[0])
    sessions.decode("agent", "cam", old[1])
    for packet in new:  # the edge restarted its encoder: a new session, from 0
        sessions.decode("agent", "cam", packet)
    assert sessions.decode("agent", "cam", old[2]).shape == (240, 320, 3)  # sessions are apart


def test_events_are_counted() -> None:
    metrics = ServiceMetrics(CollectorRegistry())
    sessions = VideoSessions(on_event=metrics.observe_video_packet)
    stream = packets(3)
    sessions.decode("agent", "cam", stream[0])
    with pytest.raises(VideoRejected):
        sessions.decode("agent", "cam", stream[2])
    registry = metrics.registry
    value = registry.get_sample_value
    assert value("cloud_service_video_packets_total", {"outcome": "decoded"}) == 1.0
    assert value("cloud_service_video_packets_total", {"outcome": "reference_lost"}) == 1.0
    with pytest.raises(ValueError, match="unknown video outcome"):
        metrics.observe_video_packet("bogus")


# -- the processor -------------------------------------------------------------------------------


def video_request(packet: pb.VideoPacket, frame_id: int, **fields: object) -> pb.FrameRequest:
    request = pb.FrameRequest(
        agent_id="agent-1",
        camera_id="cam-1",
        frame_id=frame_id,
        request_id=f"cam-1/{frame_id}",
        **fields,  # type: ignore[arg-type]
    )
    request.video.CopyFrom(packet)
    return request


def test_the_processor_detects_on_decoded_video_in_source_pixels() -> None:
    detector = FakeDetector()
    processor = DetectorFrameProcessor(detector, FAKE_MODEL, videos=VideoSessions())
    stream = packets(2, max_width=160)  # coded at half the camera's 320 px
    results = processor.process(
        [
            video_request(stream[0], 1, original_width=320, original_height=240),
            video_request(stream[1], 2, original_width=320, original_height=240),
        ]
    )
    assert [r.status.code for r in results] == [0, 0]
    assert detector.calls[-1] == [(120, 160, 3), (120, 160, 3)]
    box = results[0].detections[0]  # FakeDetector's (10, 20, 50, 80) on the half-size picture
    assert (box.x1, box.y1, box.x2, box.y2) == (20.0, 40.0, 100.0, 160.0)


def test_a_late_video_frame_is_still_decoded_so_the_next_one_is_not_lost() -> None:
    now = 1_000.0
    processor = DetectorFrameProcessor(
        FakeDetector(), FAKE_MODEL, videos=VideoSessions(), clock=lambda: now
    )
    stream = packets(2)
    late = video_request(stream[0], 1)
    late.deadline.CopyFrom(timestamp_from_seconds(now - 1.0))
    results = processor.process([late, video_request(stream[1], 2)])
    assert [grpc.StatusCode.DEADLINE_EXCEEDED.value[0], 0] == [r.status.code for r in results]
    assert not results[0].keyframe_required


@pytest.mark.parametrize(
    ("videos", "extra", "message", "keyframe_required"),
    [
        (None, {}, "does not decode the video uplink", True),
        (VideoSessions(), {"jpeg": make_jpeg()}, "both set", False),
    ],
    ids=["jpeg-only processor", "jpeg and video"],
)
def test_video_requests_a_processor_cannot_take_are_refused_by_name(
    videos: VideoSessions | None, extra: dict[str, object], message: str, keyframe_required: bool
) -> None:
    processor = DetectorFrameProcessor(FakeDetector(), FAKE_MODEL, videos=videos)
    (result,) = processor.process([video_request(packets(1)[0], 1, **extra)])
    assert result.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert message in result.status.message
    assert result.keyframe_required is keyframe_required


def test_a_gap_is_answered_keyframe_required_and_the_batch_goes_on() -> None:
    processor = DetectorFrameProcessor(FakeDetector(), FAKE_MODEL, videos=VideoSessions())
    stream = packets(3)
    jpeg = pb.FrameRequest(
        agent_id="agent-1", camera_id="cam-2", frame_id=9, request_id="j", jpeg=make_jpeg()
    )
    results = processor.process([video_request(stream[0], 1), video_request(stream[2], 3), jpeg])
    codes = [r.status.code for r in results]
    assert codes == [0, grpc.StatusCode.FAILED_PRECONDITION.value[0], 0]
    assert [r.keyframe_required for r in results] == [False, True, False]
    assert np.isfinite(results[2].detections[0].x2)


def test_without_pyav_a_replica_announces_no_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    import cloud_service.decoders.video as video_module

    monkeypatch.setattr(video_module, "PYAV_INSTALLED", False)
    assert VideoSessions().codecs == ()


def test_the_metric_outcomes_are_the_decoders_own_events() -> None:
    from typing import get_args

    from cloud_service.decoders.video import VideoEvent
    from cloud_service.metrics import VIDEO_OUTCOMES

    assert VIDEO_OUTCOMES == get_args(VideoEvent)


class HeldDetector(FakeDetector):
    """A slow engine: its first call waits for `release` (the queue fills behind it)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def detect(self, images: Sequence[npt.NDArray[np.uint8]]) -> list[Detections]:
        self.entered.set()
        assert self.release.wait(10.0)
        return super().detect(images)


@pytest.mark.parametrize("skips", [True, False], ids=["decoded", "not decoded"])
def test_a_packet_that_expires_in_the_queue_does_not_break_its_session(skips: bool) -> None:
    """A slow batch: the packet queued behind it expires; the batcher still has it decoded, so
    the packet after it is answered, not refused for a lost reference (which cost the busy demo
    two more answers per expired one). Without `skip` the session breaks, as it used to."""
    detector = HeldDetector()
    decoding = DetectorFrameProcessor(detector, FAKE_MODEL, videos=VideoSessions())
    processor: FrameProcessor = decoding if skips else _WithoutSkip(decoding)
    batcher = DynamicBatcher(processor, BatchingConfig(max_batch_size=1, max_queue_delay_ms=0))
    batcher.start()
    results: dict[int, pb.FrameResult] = {}
    done = threading.Condition()

    def reply(result: pb.FrameResult) -> None:
        with done:
            results[result.frame_id] = result
            done.notify_all()

    try:
        stream = packets(3)
        batcher.submit(video_request(stream[0], 0), reply)
        assert detector.entered.wait(10.0)
        batcher.submit(video_request(stream[1], 1), reply, time_remaining_s=0.05)
        batcher.submit(video_request(stream[2], 2), reply)
        time.sleep(0.2)  # packet 1's deadline passes while packet 0 is detected
        detector.release.set()
        with done:
            assert done.wait_for(lambda: len(results) == 3, 10.0)
    finally:
        batcher.stop(grace_s=1.0)
    late, after = results[1], results[2]
    assert late.status.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    if skips:
        assert not late.keyframe_required
        assert after.status.code == 0 and len(after.detections) == 2
    else:
        assert late.keyframe_required
        assert after.status.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert after.keyframe_required


class _WithoutSkip:
    """A processor that cannot keep references (e.g. one written before `skip`)."""

    def __init__(self, inner: DetectorFrameProcessor) -> None:
        self._inner = inner

    def process(self, requests: Sequence[pb.FrameRequest]) -> list[pb.FrameResult]:
        return self._inner.process(requests)
