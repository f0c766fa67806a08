"""`DeepSortTracker`: the per-camera tracker loop (predict, match, update, birth, death)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from edge_agent.config.tracker import TrackerConfig
from edge_agent.tracking.kalman import FloatArray, KalmanFilter, xyxy_to_xyah
from edge_agent.tracking.matching import (
    Assignment,
    cosine_cost,
    gate_cost_matrix,
    iou_cost,
    linear_assignment,
    matching_cascade,
)
from edge_agent.tracking.track import Track


def _check_range(
    name: str, value: float, low: float, high: float, *, high_open: bool = False
) -> None:
    ok = math.isfinite(value) and low <= value and (value < high if high_open else value <= high)
    if not ok:
        bracket = ")" if high_open else "]"
        raise ValueError(f"{name} must be in [{low}, {high}{bracket}, got {value}")


class DeepSortTracker:
    """DeepSORT with a ByteTrack-style second pass for low-score detections.

    Each `update` takes one frame's detections (and optionally their appearance embeddings,
    one row per detection) and returns a new `Detections`, same rows and order, with
    `tracker_id` set where a detection is matched to a confirmed track and -1 elsewhere.
    Detections scoring below `confidence_threshold` only extend existing confirmed tracks
    (when `low_score_threshold` is set) and never start one.
    """

    def __init__(
        self,
        max_age_frames: int = 30,
        n_init: int = 3,
        max_iou_distance: float = 0.7,
        max_cosine_distance: float = 0.2,
        gallery_size: int = 100,
        low_score_threshold: float | None = None,
        confidence_threshold: float = 0.0,
        second_pass_max_iou_distance: float = 0.5,
        history_size: int = 30,
    ) -> None:
        _check_range("max_age_frames", max_age_frames, 1, 10_000)
        _check_range("n_init", n_init, 1, 100)
        _check_range("max_iou_distance", max_iou_distance, 0.0, 1.0)
        _check_range("max_cosine_distance", max_cosine_distance, 0.0, 2.0)
        _check_range("gallery_size", gallery_size, 1, 10_000)
        _check_range("confidence_threshold", confidence_threshold, 0.0, 1.0)
        _check_range("second_pass_max_iou_distance", second_pass_max_iou_distance, 0.0, 1.0)
        _check_range("history_size", history_size, 1, 100_000)
        if low_score_threshold is not None:
            _check_range(
                "low_score_threshold",
                low_score_threshold,
                0.0,
                confidence_threshold,
                high_open=True,
            )
        self.max_age_frames = int(max_age_frames)
        self.n_init = int(n_init)
        self.max_iou_distance = float(max_iou_distance)
        self.max_cosine_distance = float(max_cosine_distance)
        self.gallery_size = int(gallery_size)
        self.low_score_threshold = low_score_threshold
        self.confidence_threshold = float(confidence_threshold)
        self.second_pass_max_iou_distance = float(second_pass_max_iou_distance)
        self.history_size = int(history_size)
        self.kalman = KalmanFilter()
        self.tracks: list[Track] = []
        self.frame_index = -1
        self._next_id = 1

    @classmethod
    def from_config(cls, config: TrackerConfig, confidence_threshold: float) -> DeepSortTracker:
        """A tracker with the `tracker:` settings and the detector's confidence threshold."""
        return cls(
            max_age_frames=config.max_age_frames,
            n_init=config.n_init,
            max_iou_distance=config.max_iou_distance,
            max_cosine_distance=config.max_cosine_distance,
            gallery_size=config.gallery_size,
            low_score_threshold=config.low_score_threshold,
            confidence_threshold=confidence_threshold,
        )

    def update(self, detections: Detections, embeddings: npt.ArrayLike | None = None) -> Detections:
        """Advance one frame; returns a new `Detections` with `tracker_id` filled in."""
        features = self._check_embeddings(detections, embeddings)
        self.frame_index += 1
        for track in self.tracks:
            track.predict(self.kalman)

        conf = detections.confidence
        high = [int(i) for i in np.flatnonzero(conf >= self.confidence_threshold)]
        low: list[int] = []
        if self.low_score_threshold is not None:
            is_low = (conf >= self.low_score_threshold) & (conf < self.confidence_threshold)
            low = [int(i) for i in np.flatnonzero(is_low)]

        xyah = xyxy_to_xyah(detections.xyxy).reshape(-1, 4)
        first = self._first_pass(detections, xyah, features, high)
        second = self._second_pass(detections, first.unmatched_tracks, low)

        for t, d in first.matches + second.matches:
            feature = None if features is None else features[d]
            self.tracks[t].update(
                self.kalman,
                xyah[d],
                detections.xyxy[d],
                int(detections.class_id[d]),
                self.frame_index,
                feature,
            )
        for t in second.unmatched_tracks:
            self.tracks[t].mark_missed()

        tracker_id = np.full(len(detections), -1, dtype=np.int64)
        for t, d in first.matches + second.matches:
            if self.tracks[t].is_confirmed:
                tracker_id[d] = self.tracks[t].track_id
        for d in first.unmatched_detections:
            self._start_track(detections, xyah, features, d)
            if self.tracks[-1].is_confirmed:
                tracker_id[d] = self.tracks[-1].track_id
        self.tracks = [t for t in self.tracks if not t.is_deleted]
        return detections.with_tracker_ids(tracker_id)

    def _check_embeddings(
        self, detections: Detections, embeddings: npt.ArrayLike | None
    ) -> FloatArray | None:
        if embeddings is None:
            return None
        features = np.asarray(embeddings, dtype=np.float64)
        if features.ndim != 2 or features.shape[0] != len(detections):
            raise ValueError(
                f"embeddings must have shape ({len(detections)}, d), got {features.shape}"
            )
        if not np.all(np.isfinite(features)):
            raise ValueError("embeddings must be finite (no NaN or inf)")
        return features

    def _first_pass(
        self,
        detections: Detections,
        xyah: FloatArray,
        features: FloatArray | None,
        high: list[int],
    ) -> Assignment:
        """Appearance cascade for confirmed tracks, then IoU for the rest."""
        confirmed = [i for i, t in enumerate(self.tracks) if t.is_confirmed]
        unconfirmed = [i for i, t in enumerate(self.tracks) if not t.is_confirmed]
        if features is not None:
            feats = features

            def appearance(track_idx: Sequence[int], det_idx: Sequence[int]) -> FloatArray:
                cost = cosine_cost([self.tracks[t].gallery() for t in track_idx], feats[det_idx])
                states = [(self.tracks[t].mean, self.tracks[t].covariance) for t in track_idx]
                return gate_cost_matrix(self.kalman, cost, states, xyah[det_idx])

            cascade = matching_cascade(
                appearance,
                self.max_cosine_distance,
                self.max_age_frames,
                [t.time_since_update for t in self.tracks],
                confirmed,
                high,
            )
            # As in DeepSORT, IoU only rescues tracks lost for a single frame.
            iou_tracks = unconfirmed + [
                t for t in cascade.unmatched_tracks if self.tracks[t].time_since_update == 1
            ]
            left_over = [t for t in cascade.unmatched_tracks if t not in iou_tracks]
            matches, remaining = cascade.matches, cascade.unmatched_detections
        else:
            iou_tracks, left_over, matches, remaining = unconfirmed + confirmed, [], [], high
        iou = self._iou_match(detections, iou_tracks, remaining, self.max_iou_distance)
        return Assignment(
            matches + iou.matches, left_over + iou.unmatched_tracks, iou.unmatched_detections
        )

    def _second_pass(
        self, detections: Detections, unmatched_tracks: list[int], low: list[int]
    ) -> Assignment:
        """ByteTrack: low-score detections may extend confirmed tracks left unmatched."""
        candidates = [t for t in unmatched_tracks if self.tracks[t].is_confirmed]
        others = [t for t in unmatched_tracks if not self.tracks[t].is_confirmed]
        result = self._iou_match(detections, candidates, low, self.second_pass_max_iou_distance)
        return Assignment(result.matches, others + result.unmatched_tracks, [])

    def _iou_match(
        self, detections: Detections, tracks: list[int], dets: list[int], max_distance: float
    ) -> Assignment:
        if not tracks or not dets:
            return Assignment([], tracks, dets)
        track_boxes = np.stack([self.tracks[t].to_xyxy() for t in tracks])
        cost = iou_cost(track_boxes, detections.xyxy[dets])
        return linear_assignment(cost, max_distance, tracks, dets)

    def _start_track(
        self, detections: Detections, xyah: FloatArray, features: FloatArray | None, d: int
    ) -> None:
        mean, covariance = self.kalman.initiate(xyah[d])
        self.tracks.append(
            Track(
                track_id=self._next_id,
                mean=mean,
                covariance=covariance,
                class_id=int(detections.class_id[d]),
                frame_index=self.frame_index,
                xyxy=detections.xyxy[d],
                n_init=self.n_init,
                max_age=self.max_age_frames,
                gallery_size=self.gallery_size,
                history_size=self.history_size,
                feature=None if features is None else features[d],
            )
        )
        self._next_id += 1
