"""Fusion of late cloud answers into the tracks as they were at the answer's frame."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from detection.class_groups import GroupKeys
from detection.detections import Detections
from edge_agent.capture.frames import CapturedFrame
from edge_agent.config import CameraConfig, EscalationConfig
from edge_agent.config.escalation import FocusConfig, FusionConfig
from edge_agent.config.motion import MotionConfig
from edge_agent.config.tracker import TrackerConfig
from edge_agent.escalation import EscalationDecision, FrameSignals, SignalSettings
from edge_agent.pipeline import CameraPipeline
from edge_agent.tracking import CameraTracker, FusedTracker, NoEmbedder
from edge_agent.tracking.cloud_evidence import CloudTerms
from edge_agent.tracking.fusion import CloudTrust, FusionSettings, fuse_answer

PERSON, CAR = 0, 1
LIFT = FusionSettings(vouch_frames=-1)  # a confirmation lifts the track's score for life


def _dets(*rows: tuple[float, float, float, float, float, int]) -> Detections:
    if not rows:
        return Detections.empty()
    array = np.array([r[:5] for r in rows], dtype=np.float64)
    return Detections(array[:, :4], array[:, 4], np.array([r[5] for r in rows]))


def _moving_box(frame: int, x0: float = 100.0, speed: float = 4.0) -> tuple[float, ...]:
    x = x0 + speed * frame
    return (x, 100.0, x + 40.0, 200.0)


def _run(tracker: FusedTracker, frames: range, boxes: list[tuple[float, ...]], cls: int) -> None:
    for f in frames:
        tracker.update(_dets(*[(*b(f), 0.9, cls) for b in boxes]))  # type: ignore[operator]


def test_cloud_class_overrides_a_young_tracks_edge_class_but_not_a_long_history() -> None:
    tracker = FusedTracker(n_init=2)
    for f in range(3):
        tracker.update(_dets((*_moving_box(f), 0.9, CAR)))
    (track,) = tracker.tracks
    relabel = FusionSettings(relabel=True)
    result = fuse_answer(tracker, 1, _dets((*_moving_box(1), 0.95, PERSON)), settings=relabel)
    assert (result.matched, result.reclassified) == (1, 1)
    assert track.class_id == PERSON
    out = tracker.update(_dets((*_moving_box(3), 0.9, CAR)))
    assert out.class_id.tolist() == [PERSON]  # the rules see the corrected class
    for f in range(4, 12):
        tracker.update(_dets((*_moving_box(f), 0.9, CAR)))
    assert track.class_id == CAR  # twelve edge frames outweigh one cloud answer (weight 5)


def test_with_relabel_off_the_cloud_vouches_for_a_track_but_keeps_its_class() -> None:
    tracker = FusedTracker(n_init=2)
    for f in range(3):
        tracker.update(_dets((*_moving_box(f), 0.9, CAR)))
    (track,) = tracker.tracks
    settings = FusionSettings(relabel=False, hold_frames=6)
    result = fuse_answer(tracker, 1, _dets((*_moving_box(1), 0.95, PERSON)), settings=settings)
    assert (result.matched, result.reclassified) == (1, 0)
    assert track.class_id == CAR
    assert (track.cloud.score, track.cloud.hold) == (pytest.approx(0.95), 6)


def test_a_tentative_track_is_confirmed_or_removed_by_the_cloud() -> None:
    tracker = FusedTracker(n_init=5)
    for f in range(3):
        tracker.update(_dets((*_moving_box(f), 0.9, PERSON), (*_moving_box(f, x0=400), 0.9, CAR)))
    real, ghost = tracker.tracks
    assert real.is_tentative and ghost.is_tentative
    result = fuse_answer(tracker, 2, _dets((*_moving_box(2), 0.9, PERSON)))
    assert (result.confirmed, result.removed) == (1, 1)
    assert [t.track_id for t in tracker.tracks] == [real.track_id] and real.is_confirmed


def test_an_object_the_edge_missed_becomes_a_track_propagated_to_now() -> None:
    tracker = FusedTracker(n_init=2, low_score_threshold=0.1, confidence_threshold=0.5)
    for _ in range(8):
        tracker.update(Detections.empty())
    result = fuse_answer(tracker, 3, _dets((300.0, 50.0, 340.0, 150.0, 0.8, PERSON)))
    assert result.created == 1
    (track,) = tracker.tracks
    assert track.is_confirmed and track.class_id == PERSON
    # The edge's weak detection of it (below the start threshold) now extends the track.
    out = tracker.update(_dets((301.0, 51.0, 341.0, 151.0, 0.2, PERSON)))
    assert out.tracker_id.tolist() == [track.track_id]


def test_low_scoring_or_already_tracked_cloud_boxes_start_nothing() -> None:
    tracker = FusedTracker(n_init=1)
    for f in range(6):
        tracker.update(_dets((*_moving_box(f), 0.9, PERSON)))
    weak = (500.0, 50.0, 540.0, 150.0, 0.3, PERSON)
    moved_on = (*_moving_box(6), 0.9, PERSON)  # where the tracked object is now, not at frame 2
    result = fuse_answer(tracker, 2, _dets(weak, moved_on))
    assert result.created == 0 and len(tracker.tracks) == 1


def test_regions_limit_what_the_cloud_can_confirm_remove_or_create() -> None:
    tracker = FusedTracker(n_init=5)
    for f in range(3):
        tracker.update(_dets((*_moving_box(f), 0.9, PERSON), (*_moving_box(f, x0=400), 0.9, CAR)))
    region = (380.0, 80.0, 480.0, 220.0)  # around the second object only
    outside = (20.0, 20.0, 60.0, 80.0, 0.9, PERSON)
    result = fuse_answer(tracker, 2, _dets(outside), regions=[region])
    assert (result.removed, result.created) == (1, 0)
    assert len(tracker.tracks) == 1 and tracker.tracks[0].history[0][1][0] == pytest.approx(100.0)


@pytest.mark.parametrize("answer_frame", [-1, 30, 3])
def test_answers_past_the_horizon_or_from_the_future_are_dropped(answer_frame: int) -> None:
    tracker = FusedTracker(n_init=1)
    for f in range(20 if answer_frame != 3 else 40):
        tracker.update(_dets((*_moving_box(f), 0.9, CAR)))
    if answer_frame == -1:
        answer_frame = tracker.frame_index + 1
    result = fuse_answer(
        tracker, answer_frame, _dets((*_moving_box(3), 0.9, PERSON)), settings=FusionSettings()
    )
    assert result.dropped_late and tracker.tracks[0].class_id == CAR


def test_an_answer_older_than_the_tracks_history_starts_no_second_track() -> None:
    """Inside the horizon but past the boxes the tracks keep, no track can be matched to the
    answer: its box of the tracked person would start a second, confirmed track where the
    person was (traced on `scripts/demo`: the cloud's first answers, 31-37 frames late against
    a 30-frame history, left person tracks at the spot where people had walked in)."""
    tracker = FusedTracker(n_init=1, history_size=10)
    _run(tracker, range(20), [_moving_box], PERSON)
    settings = FusionSettings(horizon_frames=25, min_agreement=0.0)
    result = fuse_answer(tracker, 5, _dets((*_moving_box(5), 0.9, PERSON)), settings=settings)
    assert result.dropped_late and result.created == 0 and len(tracker.tracks) == 1
    recent = fuse_answer(tracker, 15, _dets((*_moving_box(15), 0.9, PERSON)), settings=settings)
    assert not recent.dropped_late and recent.matched == 1 and len(tracker.tracks) == 1


def test_a_track_the_edge_missed_on_the_answers_frame_is_not_started_again() -> None:
    """A fast person the edge misses for a few frames: the cloud's box of the answer's frame
    finds no measured box to match (the track coasted), and now, frames later, the track has
    moved on from it; where the track's motion model had it on that frame, the box overlaps:
    it is the same person, not a new track (before: a second confirmed track on them)."""
    fast = [lambda f: _moving_box(f, speed=10.0)]
    tracker = FusedTracker(n_init=1)
    _run(tracker, range(10), fast, PERSON)
    for _ in range(4):  # frames 10-13: the edge misses the person
        tracker.update(Detections.empty())
    settings = FusionSettings(min_agreement=0.0)
    result = fuse_answer(tracker, 11, _dets((*fast[0](11), 0.9, PERSON)), settings=settings)
    assert result.created == 0 and len(tracker.tracks) == 1
    elsewhere = (400.0, 300.0, 440.0, 400.0, 0.9, PERSON)  # someone the edge never saw
    assert fuse_answer(tracker, 12, _dets(elsewhere), settings=settings).created == 1


def test_a_track_the_edge_missed_only_on_the_answers_frame_is_not_started_again() -> None:
    """The edge boxes a fast person (25 px a frame, 40 px wide) on the frames around the
    answer's, not on it: the nearest box, a frame off, overlaps the cloud's too little to
    match (IoU 0.23), and the track's box now not at all; between its boxes before and after,
    the track was where the cloud saw someone, so that is the same person (before: a second
    confirmed track on them)."""

    def x_at(f: int) -> float:  # speeds up from 15 to 25 px a frame
        return 100.0 + 15.0 * min(f, 5) + 25.0 * max(0, f - 5)

    def box(f: int) -> tuple[float, ...]:
        return (x_at(f), 100.0, x_at(f) + 40.0, 200.0)

    tracker = FusedTracker(n_init=1)
    for f in range(16):
        tracker.update(_dets((*box(f), 0.9, PERSON)) if f != 10 else Detections.empty())
    assert len(tracker.tracks) == 1
    settings = FusionSettings(min_agreement=0.0)
    result = fuse_answer(tracker, 10, _dets((*box(10), 0.9, PERSON)), settings=settings)
    assert result.created == 0 and len(tracker.tracks) == 1


def test_box_offset_at_that_frame_nudges_the_current_state() -> None:
    tracker = FusedTracker(n_init=1)
    for f in range(10):
        tracker.update(_dets((*_moving_box(f), 0.9, PERSON)))
    before = tracker.tracks[0].to_xyxy().copy()
    x1, y1, x2, y2 = _moving_box(6)
    fuse_answer(tracker, 6, _dets((x1 + 10.0, y1, x2 + 10.0, y2, 0.9, PERSON)))
    shift = tracker.tracks[0].to_xyxy() - before
    assert shift[0] == pytest.approx(5.0, abs=0.5) and shift[1] == pytest.approx(0.0, abs=0.5)


def test_a_weak_cloud_box_never_relabels_and_one_object_gives_one_box() -> None:
    tracker = FusedTracker(n_init=1)
    for f in range(6):
        tracker.update(_dets((*_moving_box(f), 0.9, CAR)))
    box = _moving_box(4)
    weak_person = (*box, 0.3, PERSON)
    result = fuse_answer(tracker, 4, _dets(weak_person))
    assert result.matched == 0 and tracker.tracks[0].class_id == CAR
    # Per-class NMS at the cloud: "person 0.55" and "car 0.8" on one object; the best one wins.
    result = fuse_answer(tracker, 4, _dets((*box, 0.55, PERSON), (*box, 0.8, CAR)))
    assert (result.matched, result.reclassified, result.created) == (1, 0, 0)


def test_a_track_the_cloud_vouched_for_is_reported_for_a_while_without_the_edge() -> None:
    tracker = FusedTracker(n_init=1)
    settings = FusionSettings(hold_frames=3)
    for _ in range(4):
        tracker.update(Detections.empty())
    fuse_answer(tracker, 2, _dets((300.0, 50.0, 340.0, 150.0, 0.8, PERSON)), settings=settings)
    (track,) = tracker.tracks
    reported = [tracker.update(Detections.empty()) for _ in range(5)]
    assert [len(d) for d in reported] == [1, 1, 1, 0, 0]
    first = reported[0]
    assert first.tracker_id.tolist() == [track.track_id] and first.class_id.tolist() == [PERSON]
    assert first.confidence.tolist() == pytest.approx([0.8])


def test_a_held_boxs_score_halves_every_half_life_the_edge_misses_the_track() -> None:
    tracker = FusedTracker(n_init=1)
    settings = FusionSettings(hold_frames=4, hold_half_life_frames=2.0)
    for f in range(4):
        tracker.update(_dets((*_moving_box(f), 0.6, PERSON)))
    fuse_answer(tracker, 3, _dets((*_moving_box(3), 0.8, PERSON)), settings=settings)
    held = [tracker.update(Detections.empty()).confidence.tolist() for _ in range(5)]
    # missed 1, 2, 3, 4 frames: 0.8 * 0.5 ** (k / 2); then the hold is over
    assert held[:4] == [pytest.approx([0.8 * 0.5 ** (k / 2)]) for k in (1, 2, 3, 4)]
    assert held[4] == []
    # seen again by the edge and vouched for again: the decay starts over
    tracker.update(_dets((*_moving_box(9), 0.6, PERSON)))
    fuse_answer(tracker, 9, _dets((*_moving_box(9), 0.8, PERSON)), settings=settings)
    assert tracker.update(Detections.empty()).confidence.tolist() == pytest.approx([0.8 * 0.5**0.5])


def test_the_held_score_half_life_comes_from_the_config_in_frames() -> None:
    assert FusionSettings.from_config(FusionConfig(), 25.0).hold_half_life_frames == 3.0
    config = FusionConfig(hold_half_life_ms=200)
    assert FusionSettings.from_config(config, 25.0).hold_half_life_frames == pytest.approx(5.0)
    kept = FusionConfig(hold_half_life_ms=None)
    assert FusionSettings.from_config(kept, 25.0).hold_half_life_frames == 0.0


def test_a_held_track_whose_prediction_collapses_is_not_reported() -> None:
    tracker = FusedTracker(n_init=1)
    fuse_answer(tracker, -1, Detections.empty())  # nothing yet
    for f in range(3):
        tracker.update(_dets((100.0, 100.0 - 20 * f, 140.0, 200.0 - 40 * f, 0.9, PERSON)))
    (track,) = tracker.tracks
    track.cloud.vote(PERSON, 0.9, CloudTerms(hold_frames=40))
    rows = [len(tracker.update(Detections.empty())) for _ in range(10)]
    assert rows[0] == 1 and rows[-1] == 0  # the shrinking box stops being reported


def _one_track(score: float, frames: int = 6, cls: int = PERSON) -> FusedTracker:
    tracker = FusedTracker(n_init=1)
    for f in range(frames):
        tracker.update(_dets((*_moving_box(f), score, cls)))
    return tracker


@pytest.mark.parametrize(
    ("edge_score", "cloud_rows", "rejected"),
    [
        (0.5, [], True),  # a weak edge track, nothing there for the cloud: rejected
        (0.5, [(500.0, 50.0, 540.0, 150.0, 0.9, CAR)], True),  # the cloud saw something else
        (0.5, [(*_moving_box(4), 0.25, CAR)], False),  # a weak box of another class: seen
        (0.9, [], False),  # the edge was sure of it once: kept
    ],
)
def test_a_confirmed_track_the_cloud_saw_nothing_of_is_rejected_unless_the_edge_was_sure(
    edge_score: float,
    cloud_rows: list[tuple[float, float, float, float, float, int]],
    rejected: bool,
) -> None:
    tracker = _one_track(edge_score)
    (track,) = tracker.tracks
    settings = FusionSettings(new_track_min_score=1.0)  # no new track for the other object
    result = fuse_answer(tracker, 4, _dets(*cloud_rows), settings=settings)
    assert result.rejected == ((track.track_id,) if rejected else ())
    out = tracker.update(_dets((*_moving_box(6), edge_score, PERSON)))
    assert out.tracker_id.tolist() == [-1 if rejected else track.track_id]


@pytest.mark.parametrize(("hidden_coverage", "rejected"), [(0.5, False), (0.0, True)])
def test_a_person_half_hidden_behind_another_is_not_rejected_for_sharing_their_box(
    hidden_coverage: float, rejected: bool
) -> None:
    tracker = FusedTracker(n_init=2, confidence_threshold=0.3)
    front, behind = (100.0, 100.0, 140.0, 200.0), (125.0, 110.0, 150.0, 190.0)  # IoU 0.25
    for _ in range(3):
        tracker.update(_dets((*front, 0.9, PERSON), (*behind, 0.4, PERSON)))
    _, hidden = tracker.tracks
    settings = FusionSettings(hidden_coverage=hidden_coverage)
    cloud = _dets((*front, 0.9, PERSON))  # one box: the cloud cannot tell them apart either
    result = fuse_answer(tracker, tracker.frame_index, cloud, settings=settings)
    assert result.rejected == ((hidden.track_id,) if rejected else ())  # 60 % of it covered


def test_hidden_coverage_comes_from_the_config() -> None:
    assert FusionSettings.from_config(FusionConfig(), 25.0).hidden_coverage == 0.5
    assert FusionSettings.from_config(FusionConfig(hidden_coverage=0), 25.0).hidden_coverage == 0


def test_a_rejected_track_comes_back_under_its_id_when_the_cloud_sees_it() -> None:
    tracker = _one_track(0.5)
    (track,) = tracker.tracks
    assert fuse_answer(tracker, 4, Detections.empty()).rejected == (track.track_id,)
    for f in range(6, 9):
        assert tracker.update(_dets((*_moving_box(f), 0.5, PERSON))).tracker_id.tolist() == [-1]
    fuse_answer(tracker, 8, _dets((*_moving_box(8), 0.8, PERSON)), settings=LIFT)
    out = tracker.update(_dets((*_moving_box(9), 0.5, PERSON)))
    assert out.tracker_id.tolist() == [track.track_id]
    assert out.confidence.tolist() == pytest.approx([0.8])  # vouched for by the cloud


@pytest.mark.parametrize(
    ("shift", "vouched"),
    [(0.0, True), (8.0, True), (20.0, False)],  # IoU 1.0, ~0.67, ~0.33 (confirm_iou 0.5)
)
def test_only_a_cloud_box_that_agrees_with_the_track_vouches_for_it(
    shift: float, vouched: bool
) -> None:
    tracker = _one_track(0.4)
    x1, y1, x2, y2 = _moving_box(4)
    result = fuse_answer(
        tracker, 4, _dets((x1 + shift, y1, x2 + shift, y2, 0.9, CAR)), settings=LIFT
    )
    assert result.matched == 1 and result.rejected == ()
    out = tracker.update(_dets((*_moving_box(6), 0.4, PERSON)))
    assert out.confidence.tolist() == pytest.approx([0.9 if vouched else 0.4])


def test_by_default_a_confirmation_keeps_the_edge_score_and_holds_at_the_clouds() -> None:
    tracker = _one_track(0.4)
    settings = FusionSettings(hold_frames=3)  # vouch_frames 0: no lift
    fuse_answer(tracker, 4, _dets((*_moving_box(4), 0.9, PERSON)), settings=settings)
    out = tracker.update(_dets((*_moving_box(6), 0.4, PERSON)))
    assert out.confidence.tolist() == pytest.approx([0.4])  # the edge's own detection
    held = tracker.update(Detections.empty())  # the edge misses it: held at the cloud's score
    assert held.confidence.tolist() == pytest.approx([0.9])


def test_an_untrusted_cloud_only_vouches_and_a_trusted_one_corrects() -> None:
    settings = FusionSettings(min_agreement=0.8, trust_min_checks=3, hold_frames=0, relabel=True)
    sure = (*_moving_box(4, x0=300), 0.9, PERSON)  # another object the edge is sure of
    tracker = FusedTracker(n_init=1)
    for f in range(6):
        tracker.update(
            _dets((*_moving_box(f), 0.4, PERSON), (*_moving_box(f, x0=300), 0.9, PERSON))
        )
    weak, _ = tracker.tracks
    trust = CloudTrust()
    # The cloud keeps missing the sure object and calls the weak one a car: not trusted.
    for _ in range(3):
        result = fuse_answer(
            tracker, 4, _dets((*_moving_box(4), 0.9, CAR)), settings=settings, trust=trust
        )
        assert not result.trusted and result.reclassified == 0
    assert (trust.checked, trust.seen, trust.agreement) == (3, 0, 0.0)
    assert weak.class_id == PERSON and weak.cloud.score == pytest.approx(0.9)
    # Once it sees what the edge is sure of, agreement climbs: 1 of 4 is not enough, nor is 17
    # of 20 (its 90 % lower bound is 0.72); 27 of 30 is (0.81).
    answer = _dets((*_moving_box(4), 0.9, CAR), sure)
    assert not fuse_answer(tracker, 4, answer, settings=settings, trust=trust).trusted
    for _ in range(16):
        result = fuse_answer(tracker, 4, answer, settings=settings, trust=trust)
    assert not result.trusted and trust.agreement == pytest.approx(0.85)
    for _ in range(10):
        result = fuse_answer(tracker, 4, answer, settings=settings, trust=trust)
    assert result.trusted and weak.class_id == CAR
    assert trust.agreement_lower_bound() == pytest.approx(0.808, abs=0.001)
    assert CloudTrust().agreement is None
    assert CloudTrust().trusted(FusionSettings(min_agreement=0.0))


def test_an_untrusted_cloud_neither_rejects_nor_removes_nor_creates() -> None:
    settings = FusionSettings(trust_min_checks=10)
    distrusted = CloudTrust(checked=20, seen=8)  # enough checks, too few of them seen
    tracker = FusedTracker(n_init=5)
    for f in range(3):
        tracker.update(_dets((*_moving_box(f), 0.5, PERSON)))
    new_object = (500.0, 50.0, 540.0, 150.0, 0.95, CAR)
    result = fuse_answer(tracker, 2, _dets(new_object), settings=settings, trust=distrusted)
    assert (result.removed, result.created, result.rejected, result.trusted) == (0, 0, (), False)
    assert len(tracker.tracks) == 1


@pytest.mark.parametrize(
    ("seen", "checked", "lower_bound"),
    [(0, 0, 0.0), (10, 10, 0.859), (9, 10, 0.718), (90, 100, 0.855), (0, 10, 0.0)],
)
def test_trust_rests_on_the_lower_bound_of_the_agreement(
    seen: int, checked: int, lower_bound: float
) -> None:
    trust = CloudTrust(checked=checked, seen=seen)
    assert trust.agreement_lower_bound() == pytest.approx(lower_bound, abs=0.001)
    settings = FusionSettings(min_agreement=0.85, trust_min_checks=10)
    assert trust.trusted(settings) == (lower_bound >= 0.85)


def test_cloud_boxes_no_track_explains_come_back_as_hints() -> None:
    tracker = _one_track(0.9)
    far = (500.0, 50.0, 512.0, 70.0)
    answer = _dets((*_moving_box(4), 0.9, PERSON), (*far, 0.35, CAR), (*far, 0.3, PERSON))
    result = fuse_answer(tracker, 4, answer, settings=FusionSettings(new_track_min_score=1.0))
    # the tracked object is no hint; of two boxes on one place, the more confident one
    assert [(h.box, h.score, h.class_id) for h in result.unexplained] == [
        (far, pytest.approx(0.35), CAR)
    ]
    outside = fuse_answer(tracker, 4, _dets((*far, 0.9, CAR)), regions=[(0.0, 0.0, 300.0, 300.0)])
    assert outside.unexplained == ()  # the cloud did not look there
    created = fuse_answer(tracker, 4, _dets((*far, 0.9, CAR)), settings=FusionSettings())
    assert created.created == 1 and created.unexplained == ()  # a track explains it now


def test_a_heavier_cloud_vote_outweighs_a_longer_edge_history() -> None:
    tracker = FusedTracker(n_init=2)
    for f in range(3):
        tracker.update(_dets((*_moving_box(f), 0.9, CAR)))
    (track,) = tracker.tracks
    heavy = FusionSettings(relabel=True, cloud_vote_weight=20)
    fuse_answer(tracker, 1, _dets((*_moving_box(1), 0.95, PERSON)), settings=heavy)
    for f in range(3, 15):
        tracker.update(_dets((*_moving_box(f), 0.9, CAR)))
    assert track.class_id == PERSON  # 15 edge votes against one cloud vote worth 20


def _seen_then_missed(missed: int) -> tuple[FusedTracker, int]:
    """A confirmed track seen on frames 1-4, then missed `missed` frames; its last seen frame."""
    tracker = FusedTracker(n_init=2, max_age_frames=30)
    for f in range(4):
        tracker.update(_dets((*_moving_box(f), 0.9, PERSON)))
    last_seen = tracker.frame_index
    for _ in range(missed):
        tracker.update(Detections.empty())
    return tracker, last_seen


@pytest.mark.parametrize("sighting", [True, False])
def test_a_cloud_confirmation_counts_as_seeing_the_track_at_the_answers_frame(
    sighting: bool,
) -> None:
    tracker, last_seen = _seen_then_missed(5)
    (track,) = tracker.tracks
    assert track.time_since_update == 5
    settings = FusionSettings(cloud_sighting=sighting, hold_frames=10)
    answer_frame = last_seen + 1  # the history is looked up within a frame of it
    result = fuse_answer(
        tracker, answer_frame, _dets((*_moving_box(3), 0.9, PERSON)), settings=settings
    )
    assert result.matched == 1
    lag = tracker.frame_index - answer_frame
    assert track.time_since_update == (lag if sighting else 5)


def test_a_weak_second_box_inside_the_object_the_cloud_boxed_once_is_rejected() -> None:
    tracker = FusedTracker(n_init=2, confidence_threshold=0.3)
    whole, part = (100.0, 100.0, 200.0, 300.0), (100.0, 100.0, 200.0, 240.0)
    for _ in range(3):
        tracker.update(_dets((*whole, 0.9, CAR), (*part, 0.4, CAR)))
    truck, duplicate = tracker.tracks
    cloud = _dets((*whole, 0.9, CAR))
    kept = fuse_answer(tracker, tracker.frame_index, cloud, settings=FusionSettings())
    assert kept.rejected == ()  # the cloud box overlaps it (IoU 0.7): seen, so kept
    dedup = FusionSettings(reject_duplicates=True)
    result = fuse_answer(tracker, tracker.frame_index, cloud, settings=dedup)
    assert result.rejected == (duplicate.track_id,)
    assert duplicate.cloud.rejected and not truck.cloud.rejected


def test_a_neighbour_overlapping_the_object_the_cloud_boxed_is_not_a_duplicate() -> None:
    tracker = FusedTracker(n_init=2, confidence_threshold=0.3)
    left, right = (100.0, 100.0, 200.0, 300.0), (150.0, 100.0, 250.0, 300.0)
    for _ in range(3):
        tracker.update(_dets((*left, 0.9, PERSON), (*right, 0.4, PERSON)))
    dedup = FusionSettings(reject_duplicates=True)
    result = fuse_answer(tracker, tracker.frame_index, _dets((*left, 0.9, PERSON)), settings=dedup)
    assert result.rejected == ()  # half of it lies outside the matched box: another object


def test_a_camera_the_cloud_is_still_undecided_on_takes_its_new_objects() -> None:
    settings = FusionSettings(min_agreement=0.85, trust_min_checks=10)
    box = _dets((300.0, 50.0, 340.0, 150.0, 0.8, PERSON))
    tracker = FusedTracker(n_init=2)
    tracker.update(Detections.empty())
    undecided = fuse_answer(tracker, 0, box, settings=settings, trust=CloudTrust())
    assert (undecided.trusted, undecided.created) == (False, 1)
    tracker = FusedTracker(n_init=2)
    tracker.update(Detections.empty())
    distrusted = CloudTrust(checked=20, seen=8)  # it missed most of what the edge is sure of
    result = fuse_answer(tracker, 0, box, settings=settings, trust=distrusted)
    assert (result.trusted, result.created) == (False, 0)


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_a_held_box_whose_score_ran_down_below_the_floor_is_no_longer_reported(
    scale: float,
) -> None:
    # The floor applies to the held score (the cloud's evidence), the scale only to the rank.
    tracker = FusedTracker(n_init=2)
    for f in range(3):
        tracker.update(_dets((*_moving_box(f), 0.9, PERSON)))
    settings = FusionSettings(
        hold_frames=20, hold_half_life_frames=1.0, min_held_score=0.1, held_score_scale=scale
    )
    fuse_answer(tracker, 2, _dets((*_moving_box(2), 0.8, PERSON)), settings=settings)
    scores = [tracker.update(Detections.empty()).confidence.tolist() for _ in range(5)]
    held = [[pytest.approx(scale * s)] for s in (0.4, 0.2, 0.1)]
    assert scores == [*held, [], []]


def test_held_boxes_rank_below_a_fresh_detection_of_the_same_score() -> None:
    tracker = FusedTracker(n_init=2)
    for f in range(3):
        tracker.update(_dets((*_moving_box(f), 0.9, PERSON), (300, 300, 340, 380, 0.5, PERSON)))
    settings = FusionSettings(hold_frames=20, held_score_scale=0.25)
    fuse_answer(tracker, 2, _dets((*_moving_box(2), 0.5, PERSON)), settings=settings)
    out = tracker.update(_dets((300, 300, 340, 380, 0.5, PERSON)))
    assert sorted(out.confidence.tolist()) == [pytest.approx(0.125), pytest.approx(0.5)]


def test_the_clouds_box_fit_corrects_the_tracks_edge_boxes_for_a_while() -> None:
    # The edge boxes a person with a neighbour's arm: 20 px too wide on the right, every frame.
    def loose(f: int) -> tuple[float, ...]:
        x1, y1, x2, y2 = _moving_box(f)
        return (x1, y1, x2 + 20.0, y2)

    tracker = FusedTracker(n_init=2)
    for f in range(3):
        tracker.update(_dets((*loose(f), 0.9, PERSON)))
    settings = FusionSettings(fit_gain=0.5, fit_frames=3)
    fuse_answer(tracker, 2, _dets((*_moving_box(2), 0.9, PERSON)), settings=settings)
    boxes = [tracker.update(_dets((*loose(f), 0.9, PERSON))).xyxy[0].tolist() for f in (3, 4, 5)]
    # Half-way to the cloud's box (its centre 10 px left, its width 40 of 60: a ratio), on
    # the edge's own box as the person moves on.
    half_width = 60.0 * (40.0 / 60.0) ** 0.5 / 2.0
    wanted = [
        [x1 + 25.0 - half_width, y1, x1 + 25.0 + half_width, y2]
        for x1, y1, _, y2 in map(loose, (3, 4, 5))
    ]
    assert boxes == [pytest.approx(box) for box in wanted]
    after = tracker.update(_dets((*loose(6), 0.9, PERSON)))
    assert after.xyxy[0].tolist() == pytest.approx(list(loose(6)))  # the fit ran out
    (track,) = tracker.tracks
    assert track.history[-1][1].tolist() == pytest.approx(list(loose(6)))  # it measures raw boxes


def test_an_untrusted_cloud_fits_no_box() -> None:
    tracker = FusedTracker(n_init=2)
    for f in range(3):
        tracker.update(_dets((*_moving_box(f), 0.9, PERSON)))
    settings = FusionSettings(fit_gain=0.5, fit_frames=10, trust_min_checks=1)
    tighter = (110.0, 100.0, 140.0, 200.0, 0.9, PERSON)
    result = fuse_answer(
        tracker, 2, _dets(tighter), settings=settings, trust=CloudTrust(checked=5, seen=0)
    )
    assert not result.trusted
    out = tracker.update(_dets((*_moving_box(3), 0.9, PERSON)))
    assert out.xyxy[0].tolist() == pytest.approx(list(_moving_box(3)))


def test_the_box_fit_comes_from_the_config_in_frames() -> None:
    config = FusionConfig(fit_gain=0.4, fit_ms=1000)
    settings = FusionSettings.from_config(config, fps=10.0)
    assert (settings.fit_gain, settings.fit_frames) == (0.4, 10)
    assert FusionSettings.from_config(FusionConfig(), fps=25.0).fit_gain == 0.0  # off


BOAT = 8  # a class the camera's detector drops (its `classes` filter keeps PERSON and CAR)


def test_cloud_boxes_of_classes_the_edge_drops_confirm_seed_and_hint_nothing() -> None:
    """The cloud model answers every class it knows; on a camera whose detector keeps persons
    and cars, a cloud 'boat' over a person track is no confirmation (no hold, no vote) and a
    lone one seeds no track and is no hint, exactly as if the cloud had not sent it."""
    street = FusionSettings(classes=frozenset({PERSON, CAR}), hold_frames=6)
    tracker = _one_track(0.9)
    (track,) = tracker.tracks
    far = (500.0, 50.0, 540.0, 150.0)
    answer = _dets((*_moving_box(4), 0.9, BOAT), (*far, 0.9, BOAT))
    result = fuse_answer(tracker, 4, answer, settings=street)
    assert (result.matched, result.created, result.unexplained) == (0, 0, ())
    assert track.cloud.hold == 0 and len(tracker.tracks) == 1
    kept = fuse_answer(tracker, 4, _dets((*_moving_box(4), 0.9, PERSON)), settings=street)
    assert kept.matched == 1 and track.cloud.hold == 6
    every = fuse_answer(tracker, 4, answer, settings=replace(street, classes=None))
    assert every.created == 1  # without a filter every class counts, as before


def test_the_edges_classes_come_with_the_settings() -> None:
    settings = FusionSettings.from_config(FusionConfig(), 10.0, [CAR, PERSON])
    assert settings.classes == frozenset({PERSON, CAR})
    assert FusionSettings.from_config(FusionConfig(), 10.0).classes is None
    mixed = _dets((0.0, 0.0, 10.0, 10.0, 0.9, BOAT), (0.0, 0.0, 10.0, 10.0, 0.8, CAR))
    assert settings.edge_classes(mixed).class_id.tolist() == [CAR]
    assert len(settings.edge_classes(Detections.empty())) == 0


class _SendFirst:
    """An escalator sending the first frame it decides on, whole."""

    def __init__(self) -> None:
        self.signal_settings = SignalSettings.from_config(EscalationConfig())
        self.decided = 0

    def decide(self, signals: FrameSignals, camera: str) -> EscalationDecision:
        self.decided += 1
        send = self.decided == 1
        return EscalationDecision(send=send, score=1.0, reasons=("refresh",) if send else ())


def test_the_pipeline_drops_cloud_classes_its_detector_drops_before_fusing() -> None:
    """The camera's detector keeps class 0 only: a confident cloud box of class 3 on the
    escalated frame starts no track and is looked at by no crop, as if it had not come."""
    camera = CameraConfig(
        name="cam", url="/x.mp4", target_fps=10.0, motion=MotionConfig(enabled=False)
    )
    tracker = CameraTracker.from_config(TrackerConfig(embedder="none", n_init=1), 0.3, NoEmbedder())
    pipeline = CameraPipeline(
        camera, tracker, ["person", "bicycle", "car", "boat"],
        fusion=FusionSettings(classes=frozenset({0})),
        escalator=_SendFirst(), focus=FocusConfig(hint_ms=300, hint_min_score=0.3),
    )  # fmt: skip
    image = np.zeros((200, 200, 3), np.uint8)
    pipeline.process(CapturedFrame("cam", 0, 100.0, 0.0, image), Detections.empty())
    boat = Detections(np.array([[150.0, 150.0, 190.0, 170.0]]), np.array([0.9]), np.array([3]))
    result = pipeline.fuse(0, boat)
    assert result is not None and (result.created, result.unexplained) == (0, ())
    assert pipeline.focus_tiles(CapturedFrame("cam", 1, 100.1, 0.1, image)) == []
    assert pipeline.tracker.tracker.tracks == []


RIDER_KEYS = GroupKeys([(1, 3)])  # COCO-like: 1 bicycle and 3 motorcycle one group, 0 person alone
BICYCLE = 1


def test_the_riders_person_track_takes_the_clouds_person_box_and_the_bicycle_starts_its_own() -> (
    None
):
    """With class groups, cloud boxes meet tracks of their kind first: the rider's person
    track is confirmed by the cloud's person box, and the bicycle box under it (nearly the same
    box) becomes a bicycle track instead of relabelling the rider."""
    tracker = FusedTracker(n_init=2, class_keys=RIDER_KEYS)
    for f in range(3):
        tracker.update(_dets((*_moving_box(f), 0.9, PERSON)))
    (rider,) = tracker.tracks
    x1, y1, x2, y2 = _moving_box(1)
    answer = _dets((x1, y1, x2, y2, 0.8, PERSON), (x1 - 2, y1 + 30, x2 + 2, y2, 0.9, BICYCLE))
    result = fuse_answer(tracker, 1, answer, settings=FusionSettings(relabel=True))
    assert (result.matched, result.reclassified, result.created) == (1, 0, 1)
    assert rider.class_id == PERSON
    assert sorted(t.class_id for t in tracker.tracks) == [PERSON, BICYCLE]


@pytest.mark.parametrize("keys", [RIDER_KEYS, None], ids=["groups", "no-groups"])
def test_a_cloud_box_of_another_kind_alone_on_a_track_still_relabels_it(
    keys: GroupKeys | None,
) -> None:
    """Nothing of the track's kind there: the cloud's box is the same object, classed better."""
    tracker = FusedTracker(n_init=2, class_keys=keys)
    for f in range(3):
        tracker.update(_dets((*_moving_box(f), 0.9, PERSON)))
    bicycle = (*_moving_box(1), 0.95, BICYCLE)
    result = fuse_answer(tracker, 1, _dets(bicycle), settings=FusionSettings(relabel=True))
    assert (result.matched, result.reclassified, result.created) == (1, 1, 0)
