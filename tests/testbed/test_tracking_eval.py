"""Tracking evaluation: IoU distances, ignored ground truth, MOTA/IDF1/ID switches, the oracle
detector, the frame loop and the embedder names."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from edge_agent.config.tracker import TrackerConfig
from edge_agent.tracking import CameraTracker, HistogramEmbedder, NoEmbedder
from testbed.scenes.writer import format_mot
from testbed.tracking_eval import (
    EmbedderUnavailableError,
    FrameBoxes,
    GroundTruthFrame,
    OracleSettings,
    available_embedders,
    blank_frames,
    drop_ignored,
    iou_distance,
    load_ground_truth,
    load_scene,
    make_embedder,
    oracle_detections,
    score_tracking,
    track_frames,
)

N_FRAMES = 40


def _frame(
    ids: list[int], xywh: list[list[float]], visibility: list[float] | None = None
) -> GroundTruthFrame:
    n = len(ids)
    return GroundTruthFrame(
        boxes=FrameBoxes(np.array(ids, np.int64), np.array(xywh, np.float64).reshape(-1, 4)),
        class_id=np.zeros(n, np.int64),
        visibility=np.array(visibility if visibility is not None else [1.0] * n, np.float64),
    )


def _two_walkers(n_frames: int = N_FRAMES) -> list[GroundTruthFrame]:
    """Object 1 walks right along the top, object 2 left along the bottom; never overlapping."""
    return [
        _frame([1, 2], [[10 + 3 * f, 20, 20, 40], [300 - 3 * f, 200, 20, 40]])
        for f in range(n_frames)
    ]


def _as_hypotheses(truth: list[GroundTruthFrame]) -> list[FrameBoxes]:
    return [t.boxes for t in truth]


def test_iou_distance_matches_hand_computed_overlaps() -> None:
    gt = np.array([[0, 0, 10, 10], [100, 100, 10, 10]], np.float64)
    hyp = np.array([[0, 0, 10, 10], [5, 0, 10, 10], [0, 0, 10, 5]], np.float64)

    distance = iou_distance(gt, hyp, max_distance=0.5)

    assert distance.shape == (2, 3)
    assert distance[0, 0] == pytest.approx(0.0)
    assert math.isnan(distance[0, 1])  # IoU 50/150 = 1/3: distance 2/3 > 0.5
    assert distance[0, 2] == pytest.approx(0.5)  # IoU 50/100
    assert np.isnan(distance[1]).all()
    assert iou_distance(gt, np.empty((0, 4)), 0.5).shape == (2, 0)
    assert iou_distance(np.empty((0, 4)), hyp, 0.5).shape == (0, 3)


def test_perfect_hypotheses_score_mota_and_idf1_one() -> None:
    truth = _two_walkers()

    scores = score_tracking(truth, _as_hypotheses(truth))

    assert scores.mota == pytest.approx(1.0)
    assert scores.idf1 == pytest.approx(1.0)
    assert scores.motp == pytest.approx(0.0)
    assert (scores.id_switches, scores.false_positives, scores.misses) == (0, 0, 0)
    assert scores.mostly_tracked == 2
    assert scores.num_objects == 2 * N_FRAMES
    assert scores.num_frames == N_FRAMES


def test_hypothesis_ids_swapped_mid_sequence_count_as_id_switches() -> None:
    truth = _two_walkers()
    swap_at = N_FRAMES // 2
    hypotheses = [
        FrameBoxes(t.boxes.ids[::-1].copy() if f >= swap_at else t.boxes.ids, t.boxes.xywh)
        for f, t in enumerate(truth)
    ]

    scores = score_tracking(truth, hypotheses)

    assert scores.id_switches == 2
    assert scores.mota == pytest.approx(1.0 - 2 / (2 * N_FRAMES))
    assert scores.idf1 == pytest.approx(0.5)
    assert (scores.false_positives, scores.misses) == (0, 0)


def test_renumbering_track_ids_consistently_changes_nothing() -> None:
    truth = _two_walkers()
    hypotheses = [FrameBoxes(t.boxes.ids + 100, t.boxes.xywh) for t in truth]

    assert score_tracking(truth, hypotheses) == score_tracking(truth, _as_hypotheses(truth))


def test_missing_and_spurious_hypotheses_count_as_misses_and_false_positives() -> None:
    truth = _two_walkers(10)
    hypotheses = [
        FrameBoxes(np.array([1, 9]), np.array([t.boxes.xywh[0], [500, 300, 20, 20]])) for t in truth
    ]

    scores = score_tracking(truth, hypotheses)

    assert (scores.misses, scores.false_positives) == (10, 10)
    assert scores.mota == pytest.approx(0.0)
    assert scores.mostly_lost == 1


def test_hidden_ground_truth_is_neither_a_miss_nor_a_false_positive_when_tracked() -> None:
    hidden = [_frame([1, 2], [[10, 10, 20, 40], [200, 10, 20, 40]], [1.0, 0.1])] * 5
    tracked_both = [h.boxes for h in hidden]
    tracked_visible = [FrameBoxes(h.boxes.ids[:1], h.boxes.xywh[:1]) for h in hidden]

    both = score_tracking(hidden, tracked_both)
    visible_only = score_tracking(hidden, tracked_visible)

    assert both == dataclasses.replace(visible_only, ignored_hypotheses=5)
    assert (both.mota, both.misses, both.false_positives) == (1.0, 0, 0)
    assert both.num_objects == 5
    assert score_tracking(hidden, tracked_both, min_visibility=0.0).num_objects == 10


def test_thin_ground_truth_is_ignored_like_hidden_ground_truth() -> None:
    frame = _frame([1], [[10, 10, 1, 40]])

    gt, hyp, dropped = drop_ignored(frame, frame.boxes, min_visibility=0.25, max_distance=0.5)

    assert (len(gt.ids), len(hyp.ids), dropped) == (0, 0, 1)


def test_a_hypothesis_on_a_visible_object_is_not_given_up_to_a_hidden_neighbour() -> None:
    # The hidden box overlaps the hypothesis slightly less than the visible one does.
    truth = _frame([1, 2], [[0, 0, 20, 40], [4, 0, 20, 40]], [1.0, 0.05])
    hyp = FrameBoxes(np.array([7, 8]), np.array([[0, 0, 20, 40], [300, 0, 20, 40]], float))

    gt, kept, dropped = drop_ignored(truth, hyp, min_visibility=0.25, max_distance=0.5)

    assert gt.ids.tolist() == [1]
    assert kept.ids.tolist() == [7, 8]
    assert dropped == 0


def test_score_tracking_needs_one_hypothesis_frame_per_ground_truth_frame() -> None:
    truth = _two_walkers(3)
    with pytest.raises(ValueError, match="3 frames of ground truth but 2"):
        score_tracking(truth, _as_hypotheses(truth)[:2])


def test_perfect_oracle_gives_the_ground_truth_boxes_as_detections() -> None:
    truth = [_frame([1, 2, 3], [[10, 20, 30, 40], [50, 60, 5, 5], [0, 0, 9, 9]], [1, 1, 0.1])]

    (dets,) = oracle_detections(truth, OracleSettings())

    np.testing.assert_allclose(dets.xyxy, [[10, 20, 40, 60], [50, 60, 55, 65]])
    assert dets.confidence.tolist() == [1.0, 1.0]
    assert dets.class_id.tolist() == [0, 0]


def test_noisy_oracle_is_seeded_and_drops_about_the_requested_share() -> None:
    truth = _two_walkers(500)
    noisy = OracleSettings(jitter_frac=0.05, drop_rate=0.2, seed=3)

    first, again = oracle_detections(truth, noisy), oracle_detections(truth, noisy)
    other = oracle_detections(truth, OracleSettings(jitter_frac=0.05, drop_rate=0.2, seed=4))

    kept = sum(len(d) for d in first) / (2 * len(truth))
    assert kept == pytest.approx(0.8, abs=0.04)
    assert all(np.array_equal(a.xyxy, b.xyxy) for a, b in zip(first, again, strict=True))
    assert not all(
        len(a) == len(b) and np.array_equal(a.xyxy, b.xyxy)
        for a, b in zip(first, other, strict=True)
    )
    assert all(np.all(d.xyxy[:, 2:] > d.xyxy[:, :2]) for d in first)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"min_visibility": 1.5}, "min_visibility must be in"),
        ({"jitter_frac": -0.1}, "jitter_frac must be in"),
        ({"drop_rate": 1.0}, r"drop_rate must be in \[0, 1\)"),
    ],
)
def test_oracle_settings_reject_values_out_of_range(
    settings: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        OracleSettings(**settings)


def test_tracker_on_a_perfect_oracle_misses_only_the_frames_before_confirmation() -> None:
    truth = _two_walkers()
    config = TrackerConfig(n_init=3)
    tracker = CameraTracker.from_config(config, 0.25, NoEmbedder())

    run = track_frames(blank_frames(360, 640), oracle_detections(truth, OracleSettings()), tracker)
    scores = score_tracking(truth, run.hypotheses)

    assert len(run.hypotheses) == N_FRAMES
    assert scores.misses == 2 * (config.n_init - 1)  # tentative tracks are not hypotheses
    assert (scores.id_switches, scores.false_positives) == (0, 0)
    assert scores.idf1 > 0.9
    assert run.embedded_boxes == 0
    assert run.ms_per_frame > 0


def test_track_frames_counts_the_boxes_the_embedder_saw() -> None:
    truth = _two_walkers(5)
    tracker = CameraTracker.from_config(TrackerConfig(), 0.25, HistogramEmbedder())

    run = track_frames(blank_frames(360, 640), oracle_detections(truth, OracleSettings()), tracker)

    # The tracker may skip boxes whose match needs no appearance (`embed_policy`).
    assert 0 < run.embedded_boxes <= 10


def test_track_frames_needs_a_frame_per_detection() -> None:
    truth = _two_walkers(3)
    tracker = CameraTracker.from_config(TrackerConfig(), 0.25, NoEmbedder())
    frames = [np.zeros((360, 640, 3), np.uint8)] * 2
    with pytest.raises(ValueError, match="3 frames of detections but only 2 frames"):
        track_frames(frames, oracle_detections(truth, OracleSettings()), tracker)


def test_ground_truth_is_read_per_frame_from_a_mot_file(tmp_path: Path) -> None:
    gt_file = tmp_path / "gt.txt"
    gt_file.write_text(
        format_mot(
            [
                (1, 4, 1, 2, 3, 4, 1, 2, 0.5),
                (3, 4, 5, 6, 7, 8, 1, 2, 1.0),
                (9, 1, 0, 0, 1, 1, 1, 0, 1.0),
            ]
        )
    )

    frames = load_ground_truth(gt_file, n_frames=3)

    assert len(frames) == 3
    assert frames[0].boxes.ids.tolist() == [4]
    assert frames[0].boxes.xywh.tolist() == [[1, 2, 3, 4]]
    assert frames[0].class_id.tolist() == [2]
    assert frames[0].visibility.tolist() == [0.5]
    assert len(frames[1].boxes.ids) == 0
    assert frames[2].boxes.xywh.tolist() == [[5, 6, 7, 8]]


def test_load_scene_names_the_missing_file(tmp_path: Path) -> None:
    (tmp_path / "video.mp4").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="gt.txt"):
        load_scene(tmp_path)


def test_embedders_are_built_by_name_and_mobilenetv2_is_skipped_without_a_model(
    tmp_path: Path,
) -> None:
    assert isinstance(make_embedder("none"), NoEmbedder)
    assert isinstance(make_embedder("histogram"), HistogramEmbedder)
    with pytest.raises(ValueError, match="unknown embedder 'sift'"):
        make_embedder("sift")
    with pytest.raises(EmbedderUnavailableError):
        make_embedder("mobilenetv2", model_dir=tmp_path)
    assert available_embedders(model_dir=tmp_path) == ["none", "histogram"]
