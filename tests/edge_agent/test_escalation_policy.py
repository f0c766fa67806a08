"""Escalation policy: signals from detections and tracks, scores, refresh, region mode, budget."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest

from detection.detections import Detections
from edge_agent.config.escalation import EscalationConfig
from edge_agent.escalation.policy import (
    EscalationDecision,
    EscalationPolicy,
    FrameSignals,
    SignalSettings,
)
from edge_agent.escalation.roi import Box, iou, merge_overlapping, pad_box, regions_for
from edge_agent.tracking.fused_tracker import FusedTracker

W, H = 1000, 800


@dataclass
class FakeTrack:
    """Just the fields the policy reads from a track."""

    age: int
    time_since_update: int
    is_tentative: bool
    box: Box = (0.0, 0.0, 10.0, 10.0)
    is_held: bool = False
    track_id: int = 0
    cloud_only: bool = False

    def to_xyxy(self) -> npt.NDArray[np.float64]:
        return np.array(self.box, dtype=np.float64)


def _config(**fields: object) -> EscalationConfig:
    base: dict[str, object] = {
        "regions": {"enabled": True},  # crops are off by default; most tests here are of them
        "refresh_interval_s": 0.0,
        "per_camera_frames_per_s": 100.0,
        "per_agent_frames_per_s": 100.0,
        "per_camera_bytes_per_s": 10**9,
        "per_agent_bytes_per_s": 10**9,
    }
    return EscalationConfig.model_validate({**base, **fields})


def _policy(config: EscalationConfig | None = None) -> EscalationPolicy:
    config = config or _config()
    return EscalationPolicy.from_config(config, clock=lambda: 0.0)


def _detections(boxes: list[Box], scores: list[float]) -> Detections:
    if not boxes:
        return Detections.empty()
    return Detections(
        xyxy=np.array(boxes, np.float32),
        confidence=np.array(scores, np.float32),
        class_id=np.zeros(len(boxes), np.int64),
    )


BIG = (100.0, 100.0, 300.0, 400.0)  # 6 % of the frame
SMALL = (500.0, 500.0, 520.0, 520.0)  # 0.05 % of the frame
NEAR_BIG = (110.0, 110.0, 310.0, 410.0)  # IoU with BIG ~0.82


@pytest.mark.parametrize(
    ("boxes", "scores", "tracks", "motion", "expected"),
    [
        pytest.param([BIG], [0.9], [], None, {}, id="one-confident-box"),
        pytest.param([BIG], [0.3], [], None, {"uncertain": 1}, id="uncertain"),
        pytest.param([BIG], [0.25], [], None, {"uncertain": 1}, id="band-low-inclusive"),
        pytest.param([BIG], [0.6], [], None, {}, id="band-high-exclusive"),
        pytest.param([BIG], [0.2], [], None, {}, id="below-band"),
        pytest.param([SMALL], [0.9], [], None, {"small_objects": 1}, id="small"),
        pytest.param([BIG, NEAR_BIG], [0.9, 0.9], [], None, {"crowded": 2}, id="crowded"),
        pytest.param(
            [],
            [],
            [FakeTrack(1, 0, True), FakeTrack(4, 0, True), FakeTrack(9, 1, False)],
            None,
            {"new_tracks": 1, "tentative_tracks": 1, "lost_tracks": 1},
            id="track-states",
        ),
        pytest.param([], [], [FakeTrack(9, 2, False)], None, {}, id="lost-long-ago"),
        pytest.param(
            [],
            [],
            [FakeTrack(9, 3, False, is_held=True), FakeTrack(9, 1, False, is_held=True)],
            None,
            {"held_tracks": 1, "lost_tracks": 1},
            id="held-on-the-clouds-word",
        ),
        pytest.param(
            [],
            [],
            [FakeTrack(9, 3, False, (1100.0, 10.0, 1200.0, 50.0), is_held=True)],
            None,
            {},
            id="held-but-left-the-frame",
        ),
        pytest.param([], [], [], 0.5, {}, id="motion-is-kept-not-counted"),
    ],
)
def test_signals_from_frame(
    boxes: list[Box],
    scores: list[float],
    tracks: list[FakeTrack],
    motion: float | None,
    expected: dict[str, int],
) -> None:
    signals = FrameSignals.from_frame(
        _detections(boxes, scores), tracks, W, H, SignalSettings.from_config(_config()), motion
    )
    counts = {
        name: len(getattr(signals, name))
        for name in (
            "uncertain",
            "small_objects",
            "crowded",
            "new_tracks",
            "tentative_tracks",
            "lost_tracks",
            "held_tracks",
        )
    }
    assert {k: v for k, v in counts.items() if v} == expected
    assert signals.detection_count == sum(score >= 0.25 for score in scores)  # noise not counted
    assert signals.motion_score == motion


def test_signals_from_a_real_tracker() -> None:
    tracker = FusedTracker(n_init=1, max_age_frames=5)
    config = _config()
    first = tracker.update(_detections([BIG], [0.9]))
    signals = FrameSignals.from_frame(
        first, tracker.tracks, W, H, SignalSettings.from_config(config)
    )
    assert len(signals.new_tracks) == 1 and not signals.lost_tracks
    second = tracker.update(Detections.empty())
    signals = FrameSignals.from_frame(
        second, tracker.tracks, W, H, SignalSettings.from_config(config)
    )
    assert len(signals.lost_tracks) == 1 and not signals.new_tracks
    np.testing.assert_allclose(signals.lost_tracks[0], BIG, atol=1.0)


@pytest.mark.parametrize(
    ("signals", "score", "reasons"),
    [
        pytest.param(FrameSignals(W, H, detection_count=1), 0.0, (), id="nothing"),
        pytest.param(
            FrameSignals(W, H, detection_count=1, uncertain=(BIG,)), 1.0, ("uncertain",), id="unc"
        ),
        pytest.param(
            FrameSignals(W, H, detection_count=5, uncertain=(BIG,) * 5),
            3.0,
            ("uncertain",),
            id="count-capped",
        ),
        pytest.param(
            FrameSignals(W, H, new_tracks=(BIG,), lost_tracks=(SMALL,)),
            1.25,
            ("new_track", "lost_track"),
            id="tracks",
        ),
        pytest.param(FrameSignals(W, H, held_tracks=(SMALL, BIG)), 2.0, ("held_track",), id="held"),
        pytest.param(
            FrameSignals(W, H, motion_score=0.1),
            1.0,
            ("motion_without_detections",),
            id="motion-no-detections",
        ),
        pytest.param(FrameSignals(W, H, motion_score=0.01), 0.0, (), id="motion-below-threshold"),
        pytest.param(
            FrameSignals(W, H, detection_count=1, motion_score=0.1), 0.0, (), id="motion-with-dets"
        ),
    ],
)
def test_score(signals: FrameSignals, score: float, reasons: tuple[str, ...]) -> None:
    assert _policy().score(signals) == (pytest.approx(score), reasons)


def test_weights_and_threshold_come_from_config() -> None:
    config = _config(signals={"score_threshold": 2.0, "weights": {"small_object": 2.5}})
    policy = _policy(config)
    assert not policy.decide(FrameSignals(W, H, uncertain=(BIG,)), "cam", 0.0).send
    decision = policy.decide(FrameSignals(W, H, small_objects=(SMALL,)), "cam", 0.0)
    assert decision.send and decision.score == pytest.approx(2.5)


@pytest.mark.parametrize(
    ("signals", "mode", "n_regions"),
    [
        pytest.param(FrameSignals(W, H, small_objects=(SMALL,) * 2), "regions", 1, id="one-crop"),
        pytest.param(
            FrameSignals(W, H, uncertain=(BIG, SMALL)), "regions", 2, id="two-separate-crops"
        ),
        pytest.param(
            FrameSignals(W, H, uncertain=((0.0, 0.0, 900.0, 700.0),)), "frame", 0, id="too-big"
        ),
        pytest.param(
            FrameSignals(
                W,
                H,
                uncertain=tuple((x, 10.0, x + 20.0, 30.0) for x in range(0, 1000, 100)),
                small_objects=tuple((x, 500.0, x + 20.0, 520.0) for x in range(0, 1000, 100)),
            ),
            "frame",
            0,
            id="too-many",
        ),
        pytest.param(FrameSignals(W, H, motion_score=0.5), "frame", 0, id="frame-signal"),
    ],
)
def test_mode(signals: FrameSignals, mode: str, n_regions: int) -> None:
    decision = _policy().decide(signals, "cam", 0.0)
    assert decision.send
    assert decision.mode == mode
    assert len(decision.regions) == n_regions


def test_held_tracks_are_cropped_where_the_last_answer_found_them() -> None:
    decision = _policy().decide(FrameSignals(W, H, held_tracks=(SMALL,)), "cam", 0.0)
    assert decision.send and decision.reasons == ("held_track",)
    assert decision.mode == "regions" and len(decision.regions) == 1
    (x1, y1, x2, y2), (sx1, sy1, sx2, sy2) = decision.regions[0], SMALL
    assert x1 <= sx1 and y1 <= sy1 and x2 >= sx2 and y2 >= sy2
    off = _policy(_config(signals={"weights": {"held_track": 0.0}}))
    assert not off.decide(FrameSignals(W, H, held_tracks=(SMALL,)), "cam", 0.0).send


def test_boxes_wholly_outside_the_frame_leave_no_region_and_send_the_frame() -> None:
    outside = (W + 50.0, 10.0, W + 90.0, 60.0)
    decision = _policy().decide(FrameSignals(W, H, lost_tracks=(outside,) * 2), "cam", 0.0)
    assert decision.send and decision.mode == "frame" and decision.regions == ()


def test_region_mode_can_be_turned_off() -> None:
    decision = _policy(_config(regions={"enabled": False})).decide(
        FrameSignals(W, H, uncertain=(SMALL,)), "cam", 0.0
    )
    assert decision.send and decision.mode == "frame"


def test_whole_frames_are_sent_by_default() -> None:
    decision = _policy(_config(regions={})).decide(
        FrameSignals(W, H, uncertain=(SMALL,)), "cam", 0.0
    )
    assert decision.send and decision.mode == "frame" and decision.regions == ()


def test_regions_cover_the_hard_boxes_with_padding() -> None:
    decision = _policy().decide(FrameSignals(W, H, uncertain=(BIG,)), "cam", 0.0)
    (region,) = decision.regions
    assert region[0] <= BIG[0] - 50 and region[2] >= BIG[2] + 50  # 25 % of 200 px wide
    assert region == tuple(float(int(v)) for v in region)  # whole pixels


def test_refresh_sends_a_whole_frame_periodically_per_camera_whatever_crops_went() -> None:
    policy = _policy(_config(refresh_interval_s=10.0))
    easy = FrameSignals(W, H, detection_count=1)
    assert not policy.decide(easy, "a", 0.0).send  # starts the clock
    assert not policy.decide(easy, "a", 9.9).send
    refresh = policy.decide(easy, "a", 10.0)
    assert refresh.send and refresh.reasons == ("refresh",) and refresh.mode == "frame"
    assert not policy.decide(easy, "a", 15.0).send
    assert not policy.decide(easy, "b", 15.0).send  # camera b's clock starts now
    hard = policy.decide(FrameSignals(W, H, uncertain=(BIG,)), "a", 18.0)
    assert hard.send and hard.mode == "regions"
    # crops show the cloud only what the edge sees: they do not restart the clock
    assert policy.decide(easy, "a", 20.0).send
    assert not policy.decide(easy, "a", 29.9).send  # a whole frame does
    assert policy.decide(easy, "a", 30.0).send


def test_budget_refusal_is_reported_and_does_not_reset_refresh() -> None:
    config = _config(
        refresh_interval_s=10.0, per_camera_frames_per_s=0.5, per_agent_frames_per_s=1.0
    )
    policy = _policy(config)
    hard = FrameSignals(W, H, uncertain=(BIG,))
    assert policy.decide(hard, "a", 0.0).send
    refused = policy.decide(hard, "a", 0.1)
    assert not refused.send and refused.refused_by_budget
    assert refused.reasons == ("uncertain",)
    assert policy.budget.stats(0.1).refused_camera == 1


def test_easy_frames_cost_no_budget() -> None:
    policy = _policy(_config(per_camera_frames_per_s=0.5, per_agent_frames_per_s=1.0))
    for t in range(5):
        assert not policy.decide(FrameSignals(W, H, detection_count=1), "a", float(t)).send
    assert policy.budget.stats(5.0).granted == 0
    assert policy.decide(FrameSignals(W, H, uncertain=(BIG,)), "a", 5.0).send


def test_bytes_estimate_learns_from_encoded_sizes() -> None:
    policy = _policy()
    frame = FrameSignals(W, H, motion_score=0.5)
    first = policy.decide(frame, "a", 0.0)
    assert first.estimated_bytes == round(W * H * 0.15)
    for t in range(1, 30):
        decision = policy.decide(frame, "a", float(t))
        policy.record_encoded("a", decision, n_bytes=W * H // 100, pixels=W * H)
    assert policy.decide(frame, "a", 30.0).estimated_bytes == pytest.approx(W * H / 100, rel=0.05)
    assert policy.decide(frame, "a", 31.0, estimated_bytes=1234).estimated_bytes == 1234


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ((0.0, 0.0, 10.0, 10.0), (0.0, 0.0, 10.0, 10.0), 1.0),
        ((0.0, 0.0, 10.0, 10.0), (5.0, 0.0, 15.0, 10.0), 1.0 / 3.0),
        ((0.0, 0.0, 10.0, 10.0), (20.0, 20.0, 30.0, 30.0), 0.0),
        ((0.0, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0), 0.0),
    ],
)
def test_iou(a: Box, b: Box, expected: float) -> None:
    assert iou(a, b) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("box", "padding", "min_size", "expected"),
    [
        pytest.param((100.0, 100.0, 200.0, 200.0), 0.5, 0.0, (50.0, 50.0, 250.0, 250.0), id="pad"),
        pytest.param((100.0, 100.0, 104.0, 104.0), 0.0, 64.0, (70.0, 70.0, 134.0, 134.0), id="min"),
        pytest.param((0.0, 0.0, 100.0, 100.0), 0.5, 0.0, (0.0, 0.0, 150.0, 150.0), id="clipped"),
        pytest.param((990.0, 790.0, 1000.0, 800.0), 0.0, 64.0, (963.0, 763.0, W, H), id="corner"),
    ],
)
def test_pad_box(box: Box, padding: float, min_size: float, expected: Box) -> None:
    assert pad_box(box, padding, min_size, W, H) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("boxes", "expected"),
    [
        pytest.param([], [], id="none"),
        pytest.param([(0.0, 0.0, 10.0, 10.0)], [(0.0, 0.0, 10.0, 10.0)], id="one"),
        pytest.param(
            [(0.0, 0.0, 10.0, 10.0), (20.0, 0.0, 30.0, 10.0)],
            [(0.0, 0.0, 10.0, 10.0), (20.0, 0.0, 30.0, 10.0)],
            id="apart",
        ),
        pytest.param(
            [(0.0, 0.0, 10.0, 10.0), (5.0, 5.0, 15.0, 15.0)], [(0.0, 0.0, 15.0, 15.0)], id="pair"
        ),
        pytest.param(
            # The union of the first two reaches the third, which overlapped neither alone.
            [(0.0, 0.0, 10.0, 10.0), (8.0, 20.0, 20.0, 30.0), (9.0, 9.0, 12.0, 21.0)],
            [(0.0, 0.0, 20.0, 30.0)],
            id="chain",
        ),
        pytest.param(
            [(0.0, 0.0, 10.0, 10.0), (10.0, 0.0, 20.0, 10.0)],
            [(0.0, 0.0, 10.0, 10.0), (10.0, 0.0, 20.0, 10.0)],
            id="touching-not-merged",
        ),
    ],
)
def test_merge_overlapping(boxes: list[Box], expected: list[Box]) -> None:
    assert merge_overlapping(boxes) == expected


def test_regions_for_snaps_to_pixels_and_merges() -> None:
    regions = regions_for([(10.2, 10.7, 20.5, 20.1), (18.0, 18.0, 30.0, 30.0)], 0.0, 1.0, W, H)
    assert regions == [(10.0, 10.0, 30.0, 30.0)]


@pytest.mark.parametrize(
    ("width", "height", "motion", "error"),
    [(0, 10, None, "frame size"), (10, 10, float("nan"), "motion_score")],
)
def test_signals_reject_bad_values(
    width: int, height: int, motion: float | None, error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        FrameSignals(width, height, motion_score=motion)


@pytest.mark.parametrize(
    ("mode", "regions"),
    [("frame", ((0.0, 0.0, 10.0, 10.0),)), ("regions", ())],
    ids=["frame-with-regions", "regions-without-any"],
)
def test_a_decision_with_mode_and_regions_that_disagree_is_refused(
    mode: str, regions: tuple[Box, ...]
) -> None:
    with pytest.raises(ValueError, match="region mode needs regions"):
        EscalationDecision(send=True, score=1.0, mode=mode, regions=regions)  # type: ignore[arg-type]


def _bytes_short_policy(**regions: object) -> EscalationPolicy:
    """Whole frames preferred, a byte budget that pays for one whole frame (its 2 s burst)."""
    frame_bytes = round(W * H * 0.15)  # the first estimate of a whole frame
    return _policy(
        _config(
            regions={"enabled": False, **regions},
            per_camera_bytes_per_s=frame_bytes // 2,
            per_agent_bytes_per_s=10**9,
        )
    )


def test_crops_are_sent_where_the_byte_budget_cannot_pay_for_the_whole_frame() -> None:
    policy = _bytes_short_policy()
    hard = FrameSignals(W, H, uncertain=(SMALL,))
    first = policy.decide(hard, "a", 0.0)
    assert first.send and first.mode == "frame"
    second = policy.decide(hard, "a", 0.1)  # the bucket is spent: the frame is too dear
    assert second.send and second.mode == "regions" and len(second.regions) == 1
    assert second.estimated_bytes < first.estimated_bytes // 10


def test_without_the_fallback_a_frame_too_dear_is_refused() -> None:
    policy = _bytes_short_policy(crops_when_bytes_short=False)
    hard = FrameSignals(W, H, uncertain=(SMALL,))
    assert policy.decide(hard, "a", 0.0).send
    refused = policy.decide(hard, "a", 0.1)
    assert not refused.send and refused.refused_by_budget and refused.mode == "frame"


def test_a_frame_signal_cannot_fall_back_to_crops() -> None:
    policy = _bytes_short_policy()
    moving = FrameSignals(W, H, motion_score=0.5)  # motion without detections: nothing to crop
    assert policy.decide(moving, "a", 0.0).send
    refused = policy.decide(moving, "a", 0.1)
    assert not refused.send and refused.refused_by_budget
    assert policy.budget.stats(0.1).refused_camera == 1  # the fallback's check counts nothing
