"""The video uplink encoder (real libx264/libx265 through PyAV) and its per-camera bookkeeping."""

from __future__ import annotations

import logging

import numpy as np
import numpy.typing as npt
import pytest
from pydantic import ValidationError

from cloud_service.decoders.video import VideoSessions
from edge_agent.config.escalation import EscalationConfig
from edge_agent.config.uplink import UplinkConfig
from edge_agent.escalation.uplink import (
    CameraUplinks,
    EncodedPacket,
    UplinkEncodeError,
    VideoUplinkEncoder,
    coded_size,
)
from protos.analytics.v1 import analytics_pb2 as pb

BUDGET = 500_000.0


def scene(index: int, width: int = 320, height: int = 240) -> npt.NDArray[np.uint8]:
    """A fixed textured background with a bright box moving right: what a fixed camera sees."""
    rng = np.random.default_rng(7)
    background = rng.integers(40, 200, (height // 8, width // 8, 3), dtype=np.uint8)
    image = np.repeat(np.repeat(background, 8, axis=0), 8, axis=1)[:height, :width].copy()
    x = (10 + 6 * index) % (width - 40)
    image[100:160, x : x + 30] = (20, 220, 250)
    return image


def to_proto(packet: EncodedPacket) -> pb.VideoPacket:
    return pb.VideoPacket(
        codec=packet.codec,
        data=packet.data,
        keyframe=packet.keyframe,
        session=packet.session,
        sequence=packet.sequence,
        width=packet.width,
        height=packet.height,
    )


def test_a_session_starts_with_a_keyframe_then_inter_frames_much_smaller() -> None:
    encoder = VideoUplinkEncoder(UplinkConfig(), budget_bytes_per_s=BUDGET)
    packets = [encoder.encode(scene(i), now=0.5 * i) for i in range(6)]
    assert [p.keyframe for p in packets] == [True] + [False] * 5
    assert [p.sequence for p in packets] == list(range(6))
    assert len({p.session for p in packets}) == 1
    assert max(len(p.data) for p in packets[1:]) < len(packets[0].data) / 3
    decoders = VideoSessions()
    for i, packet in enumerate(packets):
        picture = decoders.decode("agent", "cam", to_proto(packet))
        assert picture.shape == (240, 320, 3)
        assert np.abs(picture.astype(int) - scene(i)).mean() < 8.0


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_both_codecs_round_trip_through_the_cloud_decoder(codec: str) -> None:
    encoder = VideoUplinkEncoder(
        UplinkConfig(codec=codec),  # type: ignore[arg-type]
        budget_bytes_per_s=BUDGET,
    )
    decoders = VideoSessions()
    for i in range(3):
        packet = encoder.encode(scene(i), now=float(i))
        assert packet.codec == codec
        picture = decoders.decode("agent", "cam", to_proto(packet))
        assert np.abs(picture.astype(int) - scene(i)).mean() < 8.0


def test_restart_and_keyframe_required_start_a_new_session() -> None:
    encoder = VideoUplinkEncoder(UplinkConfig(), budget_bytes_per_s=BUDGET)
    first = encoder.encode(scene(0), now=0.0)
    encoder.encode(scene(1), now=0.5)
    encoder.keyframe_required("some-older-session")  # not the current one: nothing happens
    third = encoder.encode(scene(2), now=1.0)
    assert (third.session, third.keyframe) == (first.session, False)
    encoder.keyframe_required(first.session)
    fourth = encoder.encode(scene(3), now=1.5)
    assert fourth.keyframe and fourth.sequence == 0 and fourth.session != first.session
    encoder.restart()
    assert encoder.session is None
    assert encoder.encode(scene(4), now=2.0).keyframe


def test_keyframe_interval_and_a_new_picture_size_start_a_new_session() -> None:
    encoder = VideoUplinkEncoder(UplinkConfig(keyframe_interval_s=5.0), budget_bytes_per_s=BUDGET)
    assert encoder.encode(scene(0), now=0.0).keyframe
    assert not encoder.encode(scene(1), now=4.9).keyframe
    assert encoder.encode(scene(2), now=5.0).keyframe
    bigger = encoder.encode(scene(3, width=352, height=288), now=5.5)
    assert bigger.keyframe and (bigger.width, bigger.height) == (352, 288)


def test_max_width_scales_down_to_even_sizes() -> None:
    assert coded_size(768, 576, 0) == (768, 576)
    assert coded_size(768, 576, 384) == (384, 288)
    assert coded_size(641, 271, 0) == (640, 270)
    assert coded_size(1000, 333, 500) == (500, 166)
    encoder = VideoUplinkEncoder(UplinkConfig(max_width=160), budget_bytes_per_s=BUDGET)
    packet = encoder.encode(scene(0), now=0.0)
    assert (packet.width, packet.height) == (160, 120)
    picture = VideoSessions().decode("a", "c", to_proto(packet))
    assert picture.shape == (120, 160, 3)


@pytest.mark.parametrize(
    "image",
    [
        np.zeros((1, 1, 3), np.uint8),
        np.zeros((240, 320), np.uint8),
        np.zeros((240, 320, 3), np.float32),
    ],
    ids=["too small", "grey", "float"],
)
def test_bad_images_are_refused_before_the_encoder_and_the_session_goes_on(
    image: npt.NDArray[np.generic],
) -> None:
    encoder = VideoUplinkEncoder(UplinkConfig(), budget_bytes_per_s=BUDGET)
    first = encoder.encode(scene(0), now=0.0)
    with pytest.raises(UplinkEncodeError):
        encoder.encode(image, now=0.5)  # type: ignore[arg-type]
    following = encoder.encode(scene(1), now=1.0)  # nothing was encoded, so nothing is missing
    assert (following.session, following.sequence) == (first.session, 1)


def test_quality_follows_the_byte_budget_at_the_next_session() -> None:
    """Far over a tiny budget, the encoder starts a new session at a higher CRF (fewer bytes),
    never above max_crf, and comes back down when the budget allows."""
    config = UplinkConfig(crf=24, max_crf=40)
    encoder = VideoUplinkEncoder(config, budget_bytes_per_s=200.0)
    crfs, sizes, keyframes = [], [], []
    for i in range(40):
        packet = encoder.encode(scene(i), now=0.2 * i)
        crfs.append(packet.crf)
        sizes.append(len(packet.data))
        keyframes.append(packet.keyframe)
    assert crfs[0] == 24
    assert max(crfs) > 24 and max(crfs) <= 40
    keyframe_sizes = [n for n, is_key in zip(sizes, keyframes, strict=True) if is_key]
    assert len(keyframe_sizes) >= 2 and keyframe_sizes[-1] < keyframe_sizes[0]
    relaxed = VideoUplinkEncoder(config, budget_bytes_per_s=10**9)
    assert {relaxed.encode(scene(i), now=0.2 * i).crf for i in range(10)} == {24}


def test_config_bounds_are_named() -> None:
    with pytest.raises(ValidationError, match="max_crf"):
        UplinkConfig(crf=30, max_crf=20)
    with pytest.raises(ValidationError, match="codec"):
        EscalationConfig.model_validate({"uplink": {"codec": "vp9"}})
    assert EscalationConfig().uplink.codec == "h264"
    with pytest.raises(ValueError, match="jpeg"):
        VideoUplinkEncoder(UplinkConfig(codec="jpeg"), budget_bytes_per_s=BUDGET)


# -- CameraUplinks -------------------------------------------------------------------------------

H264 = frozenset({"h264"})


def test_frames_go_as_jpeg_to_a_replica_that_does_not_announce_the_codec() -> None:
    uplinks = CameraUplinks(UplinkConfig(), camera_budget_bytes_per_s=BUDGET)
    assert uplinks.encode("cam", scene(0), 0.0, stream_id=1, codecs=frozenset()) is None
    assert uplinks.encode("cam", scene(0), 0.0, stream_id=1, codecs=frozenset({"hevc"})) is None
    assert uplinks.counters.jpeg_not_announced == 2
    jpeg = CameraUplinks(UplinkConfig(codec="jpeg"), camera_budget_bytes_per_s=BUDGET)
    assert not jpeg.enabled
    assert jpeg.encode("cam", scene(0), 0.0, stream_id=1, codecs=H264) is None


def test_a_new_stream_starts_each_camera_with_a_keyframe() -> None:
    uplinks = CameraUplinks(UplinkConfig(), camera_budget_bytes_per_s=BUDGET)
    kinds = []
    for i, stream in enumerate([1, 1, 1, 2, 2]):
        for camera in ("a", "b"):
            packet = uplinks.encode(camera, scene(i), 0.5 * i, stream_id=stream, codecs=H264)
            assert packet is not None
            kinds.append(packet.keyframe)
    assert kinds == [True, True, False, False, False, False, True, True, False, False]
    assert uplinks.counters.keyframes == 4 and uplinks.counters.video_frames == 10


@pytest.mark.parametrize(
    ("answered", "keyframe_required", "next_is_keyframe"),
    [(True, False, False), (True, True, True), (False, False, True)],
    ids=["answered", "cloud asks for a keyframe", "no answer"],
)
def test_answers_decide_whether_the_camera_starts_again(
    answered: bool, keyframe_required: bool, next_is_keyframe: bool
) -> None:
    uplinks = CameraUplinks(UplinkConfig(), camera_budget_bytes_per_s=BUDGET)
    first = uplinks.encode("cam", scene(0), 0.0, stream_id=1, codecs=H264)
    assert first is not None
    uplinks.sent("req-0", "cam", first)
    uplinks.answered("req-0", answered=answered, keyframe_required=keyframe_required)
    uplinks.answered("req-unknown", answered=False, keyframe_required=True)  # ignored
    following = uplinks.encode("cam", scene(1), 0.5, stream_id=1, codecs=H264)
    assert following is not None and following.keyframe is next_is_keyframe


def test_a_packet_that_could_not_be_sent_restarts_its_camera() -> None:
    uplinks = CameraUplinks(UplinkConfig(), camera_budget_bytes_per_s=BUDGET)
    first = uplinks.encode("cam", scene(0), 0.0, stream_id=1, codecs=H264)
    second = uplinks.encode("cam", scene(1), 0.5, stream_id=1, codecs=H264)
    assert first is not None and second is not None and not second.keyframe
    uplinks.unsent("cam", second)
    third = uplinks.encode("cam", scene(2), 1.0, stream_id=1, codecs=H264)
    assert third is not None and third.keyframe


def test_an_encoder_failure_sends_jpeg_and_warns_once_per_camera(
    caplog: pytest.LogCaptureFixture,
) -> None:
    uplinks = CameraUplinks(UplinkConfig(), camera_budget_bytes_per_s=BUDGET)
    tiny = np.zeros((1, 1, 3), np.uint8)
    with caplog.at_level(logging.DEBUG, logger="edge_agent.escalation.uplink"):
        for _ in range(3):
            assert uplinks.encode("cam", tiny, 0.0, stream_id=1, codecs=H264) is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "goes as JPEG" in warnings[0].getMessage()
    assert uplinks.counters.jpeg_encoder_failed == 3
    packet = uplinks.encode("cam", scene(0), 1.0, stream_id=1, codecs=H264)
    assert packet is not None and packet.keyframe


def test_a_frame_libx264_refuses_goes_as_jpeg_and_the_camera_goes_on_with_a_keyframe() -> None:
    """A real encoder failure (libx264 opens no encoder for a 16x20000 picture): that frame is
    JPEG, the next one starts a new session."""
    uplinks = CameraUplinks(UplinkConfig(), camera_budget_bytes_per_s=BUDGET)
    first = uplinks.encode("cam", scene(0), 0.0, stream_id=1, codecs=H264)
    refused = np.zeros((16, 20_000, 3), np.uint8)
    assert uplinks.encode("cam", refused, 0.5, stream_id=1, codecs=H264) is None
    assert uplinks.counters.jpeg_encoder_failed == 1
    after = uplinks.encode("cam", scene(1), 1.0, stream_id=1, codecs=H264)
    assert first is not None and after is not None
    assert after.keyframe and after.session != first.session


def test_without_pyav_the_uplink_is_jpeg_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A box installed without the edge extra has no PyAV: whole frames go as JPEG."""
    import edge_agent.escalation.uplink as uplink_module

    monkeypatch.setattr(uplink_module, "PYAV_INSTALLED", False)
    with caplog.at_level(logging.WARNING, logger="edge_agent.escalation.uplink"):
        uplinks = CameraUplinks(UplinkConfig(), camera_budget_bytes_per_s=BUDGET)
    assert not uplinks.enabled
    assert uplinks.encode("cam", scene(0), 0.0, stream_id=1, codecs=H264) is None
    assert ["PyAV" in r.getMessage() for r in caplog.records] == [True]


def test_the_metric_kinds_are_the_uplinks_own() -> None:
    from typing import get_args

    from edge_agent.escalation.uplink import UplinkKind
    from edge_agent.metrics import UPLINK_KINDS

    assert UPLINK_KINDS == get_args(UplinkKind)


def test_each_whole_frame_is_reported_by_kind() -> None:
    seen: list[tuple[str, str]] = []
    uplinks = CameraUplinks(
        UplinkConfig(),
        camera_budget_bytes_per_s=BUDGET,
        on_frame=lambda camera, kind: seen.append((camera, kind)),
    )
    uplinks.encode("cam", scene(0), 0.0, stream_id=1, codecs=H264)
    uplinks.encode("cam", scene(1), 0.5, stream_id=1, codecs=H264)
    uplinks.encode("cam", scene(2), 1.0, stream_id=1, codecs=frozenset())
    uplinks.encode("cam", np.zeros((16, 20_000, 3), np.uint8), 1.5, stream_id=1, codecs=H264)
    assert seen == [
        ("cam", "keyframe"),
        ("cam", "inter"),
        ("cam", "jpeg_not_announced"),
        ("cam", "jpeg_encoder_failed"),
    ]
