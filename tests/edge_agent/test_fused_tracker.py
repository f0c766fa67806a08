"""The tracker with the cloud's evidence (`FusedTracker`, `CloudTrack`, `CloudEvidence`), and
the core tracker's steps and hooks it extends."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from detection.detections import Detections
from edge_agent.tracking import DeepSortTracker, Track, TrackState
from edge_agent.tracking.cloud_evidence import CloudEvidence, CloudTerms, CloudTrack
from edge_agent.tracking.fused_tracker import FusedTracker
from edge_agent.tracking.kalman import FloatArray


def _scene(seed: int, frames: int = 40) -> list[Detections]:
    """Boxes of a few objects crossing at constant velocity, with noise, misses and
    low scores: every step of the tracker loop has work."""
    rng = np.random.default_rng(seed)
    starts = rng.uniform(0, 500, size=(8, 2))
    velocity = rng.uniform(-6, 6, size=(8, 2))
    out = []
    for f in range(frames):
        centres = starts + velocity * f + rng.normal(0, 1.5, size=(8, 2))
        keep = rng.random(8) > 0.15
        boxes = np.concatenate([centres - 20, centres + 20], axis=1)[keep]
        conf = rng.uniform(0.05, 0.95, size=len(boxes))
        out.append(
            Detections(
                boxes.astype(np.float32),
                conf.astype(np.float32),
                rng.integers(0, 3, size=len(boxes)).astype(np.int64),
            )
        )
    return out


def _one_box(score: float) -> Detections:
    return Detections(
        np.array([[10.0, 10.0, 50.0, 50.0]], dtype=np.float32),
        np.array([score], dtype=np.float32),
        np.zeros(1, dtype=np.int64),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_without_cloud_answers_the_fused_tracker_tracks_as_the_core_does(seed: int) -> None:
    settings = {"n_init": 2, "low_score_threshold": 0.1, "confidence_threshold": 0.4}
    core, fused = DeepSortTracker(**settings), FusedTracker(**settings)
    for frame in _scene(seed):
        a, b = core.update(frame, steps=2), fused.update(frame, steps=2)
        np.testing.assert_array_equal(a.tracker_id, b.tracker_id)
        np.testing.assert_array_equal(a.xyxy, b.xyxy)
        np.testing.assert_array_equal(a.confidence, b.confidence)
        np.testing.assert_array_equal(a.class_id, b.class_id)
    assert all(isinstance(t, CloudTrack) for t in fused.tracks)
    assert not any(isinstance(t, CloudTrack) for t in core.tracks)


class _HalfScores(DeepSortTracker):
    """A strategy through the hooks: matched detections reported at half their score, and a
    row per tentative track after them."""

    def _reported(
        self, track: Track, xyxy: FloatArray, confidence: float
    ) -> tuple[FloatArray, float] | None:
        return xyxy, confidence / 2

    def _extra_rows(self, matched: set[int], frame_size: tuple[int, int] | None) -> Detections:
        tentative = [t for t in self.tracks if t.is_tentative]
        if not tentative:
            return Detections.empty()
        return Detections(
            np.stack([t.to_xyxy() for t in tentative]).astype(np.float32),
            np.zeros(len(tentative), dtype=np.float32),
            np.array([t.class_id for t in tentative], dtype=np.int64),
            np.array([t.track_id for t in tentative], dtype=np.int64),
        )


def test_a_subclass_changes_what_is_reported_through_the_hooks() -> None:
    tracker = _HalfScores(n_init=3)
    box = _one_box(0.8)
    tracker.update(box)  # born tentative: not matched yet, so only the extra row
    out = tracker.update(box)
    assert out.tracker_id.tolist() == [1, 1]  # reported even tentative, plus its extra row
    assert out.confidence.tolist() == [pytest.approx(0.4), 0.0]


def test_cloud_votes_count_their_weight_and_ties_go_to_the_edges_class() -> None:
    evidence = CloudEvidence()
    edge_votes = Counter({2: 3})
    assert evidence.class_vote(edge_votes) == 2
    evidence.vote(7, 0.9, CloudTerms(vote_weight=3))
    assert evidence.class_vote(edge_votes) == 2  # 3 against 3
    evidence.vote(7, 0.9, CloudTerms(vote_weight=3))
    assert evidence.class_vote(edge_votes) == 7
    assert edge_votes == Counter({2: 3})  # the track's own votes are untouched


def test_a_rejected_track_is_reported_untracked_until_the_cloud_sees_it_again() -> None:
    tracker = FusedTracker(n_init=1)
    box = _one_box(0.5)
    tracker.update(box)
    [track] = tracker.cloud_tracks
    track.cloud.reject()
    assert tracker.update(box).tracker_id.tolist() == [-1]
    track.cloud.confirmed(0.9, CloudTerms(vouch_frames=-1))
    out = tracker.update(box)
    assert out.tracker_id.tolist() == [track.track_id]
    assert float(out.confidence[0]) == pytest.approx(0.9)  # vouched: the cloud's score


def _cloud_only_track(tracker: FusedTracker) -> CloudTrack:
    """A track started from a cloud box the edge never saw, held for 10 frames."""
    tracker.update(Detections.empty())
    track = tracker.spawn_track(np.array([100.0, 50.0, 140.0, 150.0]), 0, tracker.frame_index)
    track.state = TrackState.CONFIRMED
    track.cloud.vote(0, 0.9, CloudTerms(hold_frames=10))
    return track


def test_a_track_only_the_cloud_saw_moves_with_the_optical_flow_of_its_box() -> None:
    tracker = FusedTracker(n_init=2)
    track = _cloud_only_track(tracker)
    asked: list[list[tuple[float, float, float, float]]] = []

    def follow(boxes: list[tuple[float, float, float, float]]) -> list[tuple[float, float] | None]:
        asked.append(boxes)
        return [(6.0, 0.0)] * len(boxes)

    xs = []
    for _ in range(6):
        out = tracker.update(Detections.empty(), follow=follow)
        assert out.tracker_id.tolist() == [track.track_id]  # reported on the cloud's word
        xs.append(float(out.xyxy[0, 0]))
    assert len(asked) == 6 and all(len(b) == 1 for b in asked)
    assert xs[-1] - 100.0 > 20.0  # it went along (6 px a frame), learning the velocity
    assert track.time_since_update == 6  # following is not seeing: the track still ages
    assert track.box_at(tracker.frame_index) is not None  # a later answer finds it here


@pytest.mark.parametrize(("aging", "expected"), [(0.0, 0.9), (0.5, 0.9 * 0.5**1.5), (1.0, 0.9 / 8)])
def test_frames_flow_followed_count_their_share_of_the_held_scores_decay(
    aging: float, expected: float
) -> None:
    tracker = FusedTracker(n_init=2)
    tracker.update(Detections.empty())
    track = tracker.spawn_track(np.array([100.0, 50.0, 140.0, 150.0]), 0, tracker.frame_index)
    track.state = TrackState.CONFIRMED
    terms = CloudTerms(hold_frames=20, half_life_frames=1.0, followed_aging=aging)
    track.cloud.vote(0, 0.9, terms)
    for _ in range(3):
        tracker.update(Detections.empty(), follow=lambda boxes: [(2.0, 0.0)] * len(boxes))
    assert track.time_since_update == 3 and track.followed_frames == 3
    assert track.held_score == pytest.approx(expected)
    tracker.update(Detections.empty(), follow=lambda boxes: [None] * len(boxes))  # blind
    assert track.held_score == pytest.approx(expected / 2)
    track.seen_at(1)  # an answer about the last frame: 1 blind frame since
    assert track.followed_frames <= track.time_since_update == 1
    assert track.held_score == pytest.approx(0.9 * 0.5 ** (1 - (1 - aging) * track.followed_frames))


def test_without_flow_or_once_the_edge_saw_it_a_held_track_coasts_on_its_prediction() -> None:
    tracker = FusedTracker(n_init=2)
    track = _cloud_only_track(tracker)
    out = tracker.update(Detections.empty(), follow=lambda boxes: [None] * len(boxes))
    assert float(out.xyxy[0, 0]) == pytest.approx(100.0)  # no flow found: no velocity yet
    track.best_score = 0.6  # the edge matched it once: its own detections move it
    calls: list[int] = []
    tracker.update(Detections.empty(), follow=lambda boxes: calls.append(len(boxes)) or [])
    assert calls == []


def test_a_held_box_that_left_the_frame_is_no_longer_reported() -> None:
    tracker = FusedTracker(n_init=2)
    track = _cloud_only_track(tracker)  # a 40 px wide box at x 100-140
    track.mean[4] = 30.0  # moving right, 30 px a frame
    sizes = [len(tracker.update(Detections.empty(), frame_size=(200, 200))) for _ in range(4)]
    assert sizes == [1, 1, 0, 0]  # 130-170 and 160-200 inside; 190-230 is three quarters out
    assert track.cloud.hold > 0  # still held: only not shown while outside


def test_only_a_held_track_the_edge_keeps_missing_matches_late() -> None:
    """`_matches_late`: a cloud-held track coasting without the edge waits for the joint IoU
    step with the tentative tracks; a track the edge matched on the previous frame does not,
    nor does any track of the core tracker."""
    tracker = FusedTracker(n_init=2)
    held = _cloud_only_track(tracker)
    assert not tracker._matches_late(held)  # just started: seen on its own frame
    for _ in range(2):
        tracker.update(Detections.empty())
    assert held.is_held and held.time_since_update > 1 and tracker._matches_late(held)
    core = DeepSortTracker(n_init=1)
    core.update(Detections(np.array([[0.0, 0.0, 10.0, 10.0]]), np.array([0.9]), np.array([0])))
    core.update(Detections.empty())
    core.update(Detections.empty())
    assert not core._matches_late(core.tracks[0])
