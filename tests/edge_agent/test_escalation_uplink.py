"""The video uplink end to end: the agent's escalation stage, the real gRPC client and a real
cloud servicer on loopback, new and old (a replica that does not announce the codec)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import cv2
import numpy as np
import pytest

from cloud_service.decoders.video import VideoSessions
from cloud_service.processor import DetectorFrameProcessor
from edge_agent.capture import CapturedFrame
from edge_agent.config.escalation import EscalationConfig
from edge_agent.config.labels import LabelStoreConfig
from edge_agent.escalation import EscalationClient, EscalationDecision, EscalationResult
from edge_agent.labels import LabelStore
from edge_agent.pipeline.escalation import EscalationStage
from tests.edge_agent.test_uplink import scene
from tests.fixtures.grpc_server import (
    FAKE_MODEL,
    FakeDetector,
    RecordingDetector,
    RunningServer,
    ServerFactory,
)

WAIT_S = 20.0
WHOLE_FRAME = EscalationDecision(
    send=True, score=1.0, reasons=("refresh",), mode="frame", estimated_bytes=1_000
)


@pytest.fixture
def make_stage() -> Iterator[Callable[..., EscalationStage]]:
    stages: list[EscalationStage] = []

    def make(target: str, labels: LabelStore | None = None, **uplink: object) -> EscalationStage:
        config = EscalationConfig.model_validate(
            {
                "enabled": True,
                "cloud_address": target,
                "deadline_ms": 5_000,
                "max_in_flight": 64,
                "connection": {"reconnect_min_backoff_ms": 50, "reconnect_max_backoff_ms": 300},
                "uplink": uplink,
            }
        )
        client = EscalationClient(config, "agent-1")
        stage = EscalationStage(config, "agent-1", client, labels=labels)
        stage.start()
        assert stage.client.wait_connected(WAIT_S)
        stages.append(stage)
        return stage

    yield make
    for stage in stages:
        stage.close()


def _serve(factory: ServerFactory, detector: FakeDetector, codecs: Sequence[str]) -> RunningServer:
    videos = VideoSessions(codecs=codecs) if codecs else None
    processor = DetectorFrameProcessor(detector, FAKE_MODEL, videos=videos)
    return factory(processor, servicer_kwargs={"uplink_codecs": tuple(codecs)})


def _frame(index: int) -> CapturedFrame:
    return CapturedFrame("cam-1", index, time.time(), time.monotonic(), scene(index))


def _send_and_collect(stage: EscalationStage, indices: Sequence[int]) -> list[EscalationResult]:
    results: list[EscalationResult] = []
    for index in indices:
        assert stage.submit("cam-1", _frame(index), WHOLE_FRAME)
        deadline = time.monotonic() + WAIT_S
        while len(results) < len(indices[: indices.index(index) + 1]):
            assert time.monotonic() < deadline, f"no answer for frame {index}"
            results += stage.poll()
            time.sleep(0.01)
    return results


def _wait_codecs(stage: EscalationStage) -> None:
    deadline = time.monotonic() + WAIT_S
    while not stage.client.uplink_codecs:
        assert time.monotonic() < deadline, "the replica's codecs never arrived"
        time.sleep(0.01)


def test_whole_frames_go_as_video_and_the_cloud_sees_the_cameras_pictures(
    grpc_server_factory: ServerFactory, make_stage: Callable[..., EscalationStage]
) -> None:
    detector = RecordingDetector()
    server = _serve(grpc_server_factory, detector, ("h264", "hevc"))
    stage = make_stage(server.target)
    _wait_codecs(stage)
    assert stage.client.uplink_codecs == frozenset({"h264", "hevc"})
    results = _send_and_collect(stage, list(range(6)))
    assert all(r.ok for r in results), [r.message for r in results]
    counters = stage.uplinks.counters
    assert (counters.video_frames, counters.keyframes, counters.jpeg_not_announced) == (6, 1, 0)
    assert len(detector.images) == 6
    for index, image in enumerate(detector.images):
        assert np.abs(image.astype(int) - scene(index)).mean() < 8.0
    # the uplink is a fraction of what JPEG frames cost (the first, a keyframe, is the dearest)
    assert stage.counters.bytes_sent < 6 * 20_000


def test_a_replica_that_does_not_announce_the_codec_gets_jpeg_with_one_warning(
    grpc_server_factory: ServerFactory,
    make_stage: Callable[..., EscalationStage],
    caplog: pytest.LogCaptureFixture,
) -> None:
    detector = RecordingDetector()
    server = _serve(grpc_server_factory, detector, ())
    with caplog.at_level(logging.INFO, logger="edge_agent.escalation.client"):
        stage = make_stage(server.target)
        results = _send_and_collect(stage, list(range(3)))
    assert all(r.ok for r in results)
    assert stage.uplinks.counters.jpeg_not_announced == 3
    assert stage.uplinks.counters.video_frames == 0
    warnings = [r.getMessage() for r in caplog.records if "does not decode the h264" in r.message]
    assert len(warnings) == 1, warnings


def test_the_cloud_losing_its_decoder_costs_one_frame_then_a_keyframe_recovers(
    grpc_server_factory: ServerFactory, make_stage: Callable[..., EscalationStage]
) -> None:
    """A replica that dropped the camera's decoder (evicted, restarted) answers the next packet
    `keyframe_required`; the agent's following frame is a keyframe and is answered."""
    detector = RecordingDetector()
    videos = VideoSessions()
    processor = DetectorFrameProcessor(detector, FAKE_MODEL, videos=videos)
    server = grpc_server_factory(processor, servicer_kwargs={"uplink_codecs": ("h264",)})
    stage = make_stage(server.target)
    _wait_codecs(stage)
    assert all(r.ok for r in _send_and_collect(stage, [0, 1]))
    videos.close()  # every decoder gone, as after an eviction
    lost, recovered = _send_and_collect(stage, [2, 3])
    assert not lost.ok and lost.result is not None and lost.result.keyframe_required
    assert recovered.ok
    assert stage.uplinks.counters.keyframes == 2
    assert stage.uplinks.counters.keyframes_asked == 1


def test_the_jpeg_uplink_setting_sends_jpeg_to_any_replica(
    grpc_server_factory: ServerFactory, make_stage: Callable[..., EscalationStage]
) -> None:
    detector = RecordingDetector()
    server = _serve(grpc_server_factory, detector, ("h264",))
    stage = make_stage(server.target, codec="jpeg")
    _wait_codecs(stage)
    assert all(r.ok for r in _send_and_collect(stage, [0, 1]))
    assert stage.uplinks.counters.video_frames == 0


def test_a_cloud_that_goes_away_is_not_taken_for_one_without_the_codec(
    grpc_server_factory: ServerFactory,
    make_stage: Callable[..., EscalationStage],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stream that breaks before the replica's headers (a killed replica) says nothing about
    its codecs: no JPEG-fallback warning, and video again once a replica answers."""
    server = _serve(grpc_server_factory, RecordingDetector(), ("h264",))
    with caplog.at_level(logging.INFO, logger="edge_agent.escalation.client"):
        stage = make_stage(server.target)
        _wait_codecs(stage)
        server.server.stop(None).wait()
        deadline = time.monotonic() + WAIT_S
        while stage.client.stream_id < 3:  # reconnect attempts against nothing
            assert time.monotonic() < deadline, "the client did not retry"
            time.sleep(0.05)
    assert not [r for r in caplog.records if "does not decode" in r.getMessage()]


def test_whole_frames_sent_as_video_are_kept_as_jpeg_labels(
    grpc_server_factory: ServerFactory,
    make_stage: Callable[..., EscalationStage],
    tmp_path: Path,
) -> None:
    """The label store keeps the cloud's answers with the frame they are about: a video packet
    is no picture on its own, so a whole frame sent as video is kept as a JPEG of the frame."""
    server = _serve(grpc_server_factory, RecordingDetector(), ("h264",))
    store = LabelStore(LabelStoreConfig(enabled=True, directory=tmp_path / "labels"), "agent-1")
    stage = make_stage(server.target, labels=store)  # the stage starts and closes the store
    _wait_codecs(stage)
    assert all(r.ok for r in _send_and_collect(stage, [0, 1, 2]))
    deadline = time.monotonic() + WAIT_S
    while store.counters.kept_frames < 3:
        assert time.monotonic() < deadline, store.counters
        time.sleep(0.02)
    assert stage.uplinks.counters.video_frames == 3
    pictures = sorted((tmp_path / "labels").rglob("*.jpg"))
    assert len(pictures) == 3
    kept = cv2.imread(str(pictures[0]))
    assert kept.shape == (240, 320, 3) and np.abs(kept.astype(int) - scene(0)).mean() < 8.0
