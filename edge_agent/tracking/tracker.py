"""`DeepSortTracker`: the per-camera tracker loop (predict, match, update, birth, death)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from detection.slicing import coverage
from edge_agent.config.tracker import TrackerConfig
from edge_agent.tracking.kalman import CHI2INV95, FloatArray, KalmanFilter, xyxy_to_xyah
from edge_agent.tracking.matching import (
    Assignment,
    buffered,
    cosine_cost,
    gate_cost_matrix,
    iou_cost,
    linear_assignment,
    matching_cascade,
)
from edge_agent.tracking.track import Track

#: `embed(detection_indices) -> features (len(indices), d)`, or None for no appearance.
EmbedFunction = Callable[[list[int]], npt.ArrayLike | None]
#: `follow(boxes) -> per box (dx, dy) or None`: how far each box's content moved since the
#: previous frame (`edge_agent.tracking.flow.box_shifts` on the two frames).
FollowFunction = Callable[
    [list[tuple[float, float, float, float]]], list[tuple[float, float] | None]
]


HELD_MIN_INSIDE = 0.5
"""A held box is reported only while this share of it lies inside the frame: an object
predicted out of the picture has left it. Measured (bench.hybrid_tradeoff): held boxes of
objects that had left were the hybrid's only false positives with no object near them on the
`events` scenes; dropping them lifted F1 and IDF1 by 0.3 points. At 0.9 it also dropped real
objects at the border (`quiet:3`, `crowded:3` fell below the edge alone)."""


def _check_range(
    name: str, value: float, low: float, high: float, *, high_open: bool = False
) -> None:
    ok = math.isfinite(value) and low <= value and (value < high if high_open else value <= high)
    if not ok:
        bracket = ")" if high_open else "]"
        raise ValueError(f"{name} must be in [{low}, {high}{bracket}, got {value}")


class DeepSortTracker:
    """DeepSORT with a ByteTrack-style second pass for low-score detections.

    Fusion (`edge_agent.tracking.fusion`) marks tracks from cloud answers: a track the cloud
    confirmed is reported with at least the cloud's score, and for a while without an edge
    detection (extra rows after the detections' own; see `_cloud_held`); a track the cloud
    rejected is not reported (`tracker_id` -1) until the cloud sees it again.

    Each `update` takes one frame's detections (and optionally their appearance embeddings,
    one row per detection) and returns a new `Detections`, same rows and order, with
    `tracker_id` set where a detection is matched to a confirmed track and -1 elsewhere.
    Detections scoring below `confidence_threshold` only extend existing confirmed tracks
    (when `low_score_threshold` is set) and never start one.

    Instead of embeddings, `update` may take an `embed` callback and ask it only for the
    detections whose match depends on appearance (see `certain_pairs`); a track matched
    without one still gets a fresh feature every `feature_refresh_frames` frames.
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
        feature_refresh_frames: int = 10,
        isolation_margin: float = 0.5,
        new_track_min_score: float | None = None,
        skip_iou_buffer: float = 0.0,
        skip_iou_buffer_max: float = 3.0,
        skip_backdate_origin: bool = False,
    ) -> None:
        _check_range("max_age_frames", max_age_frames, 1, 10_000)
        _check_range("n_init", n_init, 1, 100)
        _check_range("max_iou_distance", max_iou_distance, 0.0, 1.0)
        _check_range("max_cosine_distance", max_cosine_distance, 0.0, 2.0)
        _check_range("gallery_size", gallery_size, 1, 10_000)
        _check_range("confidence_threshold", confidence_threshold, 0.0, 1.0)
        _check_range("second_pass_max_iou_distance", second_pass_max_iou_distance, 0.0, 1.0)
        _check_range("history_size", history_size, 1, 100_000)
        _check_range("feature_refresh_frames", feature_refresh_frames, 1, 10_000)
        _check_range("isolation_margin", isolation_margin, 0.0, 10.0)
        _check_range("skip_iou_buffer", skip_iou_buffer, 0.0, 2.0)
        _check_range("skip_iou_buffer_max", skip_iou_buffer_max, 0.0, 10.0)
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
        self.feature_refresh_frames = int(feature_refresh_frames)
        self.isolation_margin = float(isolation_margin)
        self.skip_iou_buffer = float(skip_iou_buffer)
        self.skip_iou_buffer_max = float(skip_iou_buffer_max)
        self._buffer = 0.0  # this frame's IoU buffer (`skip_iou_buffer` x skipped intervals)
        self.backdate_origins = bool(skip_backdate_origin)
        if new_track_min_score is None:
            new_track_min_score = self.confidence_threshold
        _check_range("new_track_min_score", new_track_min_score, 0.0, 1.0)
        # a detection must score this much to start a track (it continues one from
        # `confidence_threshold`, or from `low_score_threshold` in the second pass)
        self.new_track_min_score = max(self.confidence_threshold, float(new_track_min_score))
        self.kalman = KalmanFilter()
        self.tracks: list[Track] = []
        self.frame_index = -1
        self._next_id = 1
        self._feature_frame: dict[int, int] = {}  # track id -> frame of its newest feature

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
            feature_refresh_frames=config.embed_refresh_frames,
            isolation_margin=config.embed_isolation_margin,
            new_track_min_score=config.new_track_min_score,
            skip_iou_buffer=config.skip_iou_buffer,
            skip_iou_buffer_max=config.skip_iou_buffer_max,
            skip_backdate_origin=config.skip_backdate_origin,
        )

    def update(
        self,
        detections: Detections,
        embeddings: npt.ArrayLike | None = None,
        *,
        embed: EmbedFunction | None = None,
        may_start: npt.NDArray[np.bool_] | None = None,
        steps: int = 1,
        follow: FollowFunction | None = None,
        frame_size: tuple[int, int] | None = None,
    ) -> Detections:
        """Advance one frame; returns a new `Detections` with `tracker_id` filled in.

        Appearance comes either as `embeddings` (one row per detection) or from `embed`,
        called at most once with the indices of the detections that need a feature.
        `may_start` (one flag per detection) marks those that may start a track when no track
        takes them; the others can only continue one (default: all may).
        `steps`: frame intervals of the camera since the last update (the motion model moves
        the tracks that far; more than 1 when frames were skipped), capped at `max_age_frames`.
        `follow` moves the cloud-held tracks no detection matched by what their box's content
        did since the previous frame (`_follow_held`); without it they coast on the Kalman
        prediction. `frame_size` (width, height): held boxes mostly outside it (an object that
        left) are not reported.
        """
        if embeddings is not None and embed is not None:
            raise ValueError("pass embeddings or embed, not both")
        features = self._check_embeddings(detections, embeddings)
        self.frame_index += 1
        steps = min(max(1, int(steps)), self.max_age_frames)
        self._buffer = min(self.skip_iou_buffer * (steps - 1), self.skip_iou_buffer_max)
        held_before = {
            track.track_id: track.reported_box()
            for track in self.tracks
            if follow and track.is_held and track.cloud_only
        }
        for track in self.tracks:
            track.predict(self.kalman, steps)

        conf = detections.confidence
        high = [int(i) for i in np.flatnonzero(conf >= self.confidence_threshold)]
        low: list[int] = []
        if self.low_score_threshold is not None:
            is_low = (conf >= self.low_score_threshold) & (conf < self.confidence_threshold)
            low = [int(i) for i in np.flatnonzero(is_low)]

        xyah = xyxy_to_xyah(detections.xyxy).reshape(-1, 4)
        settled: list[tuple[int, int]] = []
        embedded = np.ones(len(detections), dtype=bool)
        if embed is not None:
            settled = self.certain_pairs(detections, xyah, high)
            fresh = {d for t, d in settled if not self._feature_due(self.tracks[t])}
            wanted = [d for d in high if d not in fresh]
            features = self._check_embeddings(detections, embed(wanted), wanted)
            embedded[:] = False
            embedded[wanted] = features is not None
        taken = {d for _, d in settled}
        first = self._first_pass(
            detections,
            xyah,
            features,
            [d for d in high if d not in taken],
            {t for t, _ in settled},
        )
        second = self._second_pass(detections, first.unmatched_tracks, low)

        confirmed_before = {id(track) for track in self.tracks if track.is_confirmed}
        for t, d in settled + first.matches + second.matches:
            feature = None if features is None or not embedded[d] else features[d]
            self.tracks[t].update(
                self.kalman,
                xyah[d],
                detections.xyxy[d],
                int(detections.class_id[d]),
                self.frame_index,
                feature,
                float(detections.confidence[d]),
            )
            if feature is not None:
                self._feature_frame[self.tracks[t].track_id] = self.frame_index
        for t in second.unmatched_tracks:
            self.tracks[t].mark_missed()
        for track in self.tracks:
            if track.is_confirmed and id(track) not in confirmed_before:
                self._backdate_origin(track)
        if follow is not None:
            missed = [self.tracks[t] for t in second.unmatched_tracks]
            held = [t for t in missed if t.track_id in held_before]
            self._follow_held(held, held_before, follow)

        tracker_id = np.full(len(detections), -1, dtype=np.int64)
        class_id = detections.class_id.copy()
        confidence = detections.confidence.copy()
        xyxy = detections.xyxy.copy()
        for t, d in settled + first.matches + second.matches:
            track = self.tracks[t]
            if track.is_confirmed and not track.cloud_rejected:
                xyxy[d] = track.fitted(xyxy[d])
                tracker_id[d] = track.track_id
                class_id[d] = track.class_id  # the track's vote, cloud answers included
                confidence[d] = max(float(confidence[d]), track.vouched_score)  # cloud-vouched
        for d in first.unmatched_detections:
            if may_start is not None and not may_start[d]:
                continue
            if conf[d] < self.new_track_min_score:
                continue
            self._start_track(detections, xyah, features if embedded[d] else None, d)
            self.tracks[-1].birth_steps = steps
            if self.tracks[-1].is_confirmed:
                tracker_id[d] = self.tracks[-1].track_id
        for track in self.tracks:
            if track.is_deleted:
                self._feature_frame.pop(track.track_id, None)
        self.tracks = [t for t in self.tracks if not t.is_deleted]
        matched = {int(t) for t in tracker_id if t >= 0}
        tracked = Detections(xyxy, confidence, class_id, tracker_id)
        return Detections.concatenate([tracked, self._cloud_held(matched, frame_size)])

    def _backdate_origin(self, track: Track) -> None:
        """A track born `birth_steps` camera intervals after the analysed frame before it was
        first seen somewhere in between: move its origin back along its velocity (known now it
        is confirmed) by those intervals, less one, so the rules judge where it came from, not
        where a slow box first caught it. One interval apart (the camera's full rate) nothing
        moves."""
        back = min(track.birth_steps, self.max_age_frames) - 1
        if back <= 0 or not self.backdate_origins:
            return
        vx, vy = float(track.mean[4]), float(track.mean[5])
        if not (math.isfinite(vx) and math.isfinite(vy)):
            return
        x1, y1, x2, y2 = track.origin
        dx, dy = vx * back, vy * back
        track.origin = (x1 - dx, y1 - dy, x2 - dx, y2 - dy)

    def _follow_held(
        self, tracks: list[Track], before: dict[int, FloatArray], follow: FollowFunction
    ) -> None:
        """Move the missed cloud-held `tracks` by the flow of their previous boxes (`before`,
        by track id): a Kalman correction to the moved box, which also teaches a
        track started from a cloud box its velocity. Not an edge hit: the track still ages."""
        tracks = [t for t in tracks if not t.is_deleted]
        if not tracks:
            return
        boxes = [before[t.track_id] for t in tracks]
        shifts = follow([(float(b[0]), float(b[1]), float(b[2]), float(b[3])) for b in boxes])
        for track, box, shift in zip(tracks, boxes, shifts, strict=True):
            if shift is not None:
                dx, dy = shift
                track.follow(self.kalman, box + np.array([dx, dy, dx, dy]), self.frame_index)

    def _cloud_held(self, matched: set[int], frame_size: tuple[int, int] | None) -> Detections:
        """Rows for confirmed tracks the cloud vouched for recently that the edge missed now.

        The cloud sees objects the edge cannot (small, far, occluded); for `cloud_hold` frames
        after an answer such a track is reported at its predicted box with the cloud's score
        (`Track.held_score`: decaying while the edge misses it, where fusion set a half-life),
        while it stays in the frame (`HELD_MIN_INSIDE`). The row's confidence is that score
        times `Track.cloud_held_scale`: nothing detected the object in this frame, so it ranks
        below the edge's fresh detections; the floor (`cloud_held_floor`) applies to the held
        score, the cloud's evidence, not to the rank.
        """
        rows: list[tuple[Track, float, FloatArray]] = []
        for track in self.tracks:
            held, score = track.is_held, track.held_score
            track.age_cloud_evidence()
            if not held or score < track.cloud_held_floor or track.track_id in matched:
                continue
            box = track.reported_box()
            # Coasting on the Kalman prediction alone can shrink a box to nothing.
            if not (np.all(np.isfinite(box)) and box[2] > box[0] and box[3] > box[1]):
                continue
            if frame_size is not None:
                frame = np.array([0.0, 0.0, *frame_size], dtype=np.float32)
                if coverage(box.astype(np.float32), frame)[0, 0] < HELD_MIN_INSIDE:
                    continue
            rows.append((track, score * track.cloud_held_scale, box))
        if not rows:
            return Detections.empty()
        return Detections(
            np.stack([box for _, _, box in rows]).astype(np.float32),
            np.array([score for _, score, _ in rows], dtype=np.float32),
            np.array([t.class_id for t, _, _ in rows], dtype=np.int64),
            np.array([t.track_id for t, _, _ in rows], dtype=np.int64),
        )

    def spawn_track(self, xyxy: npt.ArrayLike, class_id: int, frame_index: int) -> Track:
        """Start a track for a box seen at past frame `frame_index` (a cloud answer) and predict
        it forward to the current frame; returns it (tentative: the caller decides)."""
        box = np.asarray(xyxy, dtype=np.float64).reshape(4)
        mean, covariance = self.kalman.initiate(xyxy_to_xyah(box).reshape(4))
        track = Track(
            track_id=self._next_id,
            mean=mean,
            covariance=covariance,
            class_id=int(class_id),
            frame_index=frame_index,
            xyxy=box,
            n_init=self.n_init,
            max_age=self.max_age_frames,
            gallery_size=self.gallery_size,
            history_size=self.history_size,
        )
        for _ in range(max(0, self.frame_index - frame_index)):
            track.predict(self.kalman)
        track.time_since_update = 0  # just seen (by the cloud), so not aged out at once
        self._next_id += 1
        self.tracks.append(track)
        return track

    def certain_pairs(
        self, detections: Detections, xyah: FloatArray, high: list[int]
    ) -> list[tuple[int, int]]:
        """(track, detection) pairs that match whatever their appearance, as list indices.

        A pair is certain when the IoU step would take it (the track was matched on the
        previous frame and the boxes overlap enough) and neither side has any other
        candidate: no other detection in the track's Kalman gate or IoU range, no other
        track gating or overlapping the detection. Matching is then independent of
        features: the cascade takes the pair or leaves both to the IoU step, which does.
        Pairs with a neighbour within `isolation_margin` are left out too, so tracks about
        to meet keep fresh features. Call after the tracks' predict step.
        """
        if not self.tracks or not high:
            return []
        boxes = np.stack([t.to_xyxy() for t in self.tracks])
        overlap = iou_cost(boxes, detections.xyxy[high]) <= self.max_iou_distance
        candidate = overlap | self._gate_mask(xyah[high])
        alone = (candidate.sum(axis=1) == 1)[:, None] & (candidate.sum(axis=0) == 1)[None, :]
        recent = np.array([t.time_since_update == 1 for t in self.tracks])[:, None]
        apart = ~self._crowded(boxes, detections.xyxy[high])
        rows, cols = np.nonzero(alone & overlap & recent & apart)
        return [(int(r), high[int(c)]) for r, c in zip(rows, cols, strict=True)]

    def _crowded(
        self, track_boxes: FloatArray, detection_boxes: npt.ArrayLike
    ) -> npt.NDArray[np.bool_]:
        """`(tracks, detections)`: the track's box grown by `isolation_margin` of its size on
        each side touches another track's box, or the detection's grown box another detection."""
        margin = self.isolation_margin

        def grow(b: FloatArray) -> FloatArray:
            size = b[:, 2:] - b[:, :2]
            return np.concatenate([b[:, :2] - margin * size, b[:, 2:] + margin * size], axis=1)

        def touching(a: FloatArray, b: FloatArray) -> npt.NDArray[np.bool_]:
            lt = np.maximum(a[:, None, :2], b[None, :, :2])
            rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
            hit = np.all(rb > lt, axis=2)
            np.fill_diagonal(hit, False)
            return np.asarray(hit.any(axis=1), dtype=bool)

        dets = np.asarray(detection_boxes, dtype=np.float64).reshape(-1, 4)
        return (
            touching(grow(track_boxes), track_boxes)[:, None] | touching(grow(dets), dets)[None, :]
        )

    def _gate_mask(self, xyah: FloatArray) -> npt.NDArray[np.bool_]:
        """`(tracks, detections)`: inside the Kalman gate of a confirmed track (the cascade's)."""
        mask = np.zeros((len(self.tracks), xyah.shape[0]), dtype=bool)
        confirmed = [i for i, t in enumerate(self.tracks) if t.is_confirmed]
        if not confirmed:
            return mask
        states = [(self.tracks[i].mean, self.tracks[i].covariance) for i in confirmed]
        projected = [self.kalman.project(mean, covariance) for mean, covariance in states]
        means = np.stack([m for m, _ in projected])  # (c, 4)
        chol = np.linalg.cholesky(np.stack([c for _, c in projected]))  # (c, 4, 4)
        diff = xyah[None, :, :] - means[:, None, :]  # (c, d, 4)
        solved = np.linalg.solve(chol, diff.transpose(0, 2, 1))  # (c, 4, d)
        mask[confirmed] = np.sum(solved * solved, axis=1) <= CHI2INV95[4]
        return mask

    def _feature_due(self, track: Track) -> bool:
        last = self._feature_frame.get(track.track_id)
        return last is None or self.frame_index - last >= self.feature_refresh_frames

    def _check_embeddings(
        self,
        detections: Detections,
        embeddings: npt.ArrayLike | None,
        rows: list[int] | None = None,
    ) -> FloatArray | None:
        """Embeddings as float64 `(len(detections), d)`; `rows`: the detections they are for
        (the others get zero rows, never read)."""
        if embeddings is None:
            return None
        features = np.asarray(embeddings, dtype=np.float64)
        expected = len(detections) if rows is None else len(rows)
        if features.ndim != 2 or features.shape[0] != expected:
            raise ValueError(f"embeddings must have shape ({expected}, d), got {features.shape}")
        if not np.all(np.isfinite(features)):
            raise ValueError("embeddings must be finite (no NaN or inf)")
        if rows is None:
            return features
        full = np.zeros((len(detections), features.shape[1]), dtype=np.float64)
        full[rows] = features
        return full

    def _first_pass(
        self,
        detections: Detections,
        xyah: FloatArray,
        features: FloatArray | None,
        high: list[int],
        settled_tracks: set[int],
    ) -> Assignment:
        """Appearance cascade for confirmed tracks, then IoU for the rest (tracks already
        settled by `certain_pairs` take no part)."""
        open_tracks = [i for i in range(len(self.tracks)) if i not in settled_tracks]
        confirmed = [i for i in open_tracks if self.tracks[i].is_confirmed]
        unconfirmed = [i for i in open_tracks if not self.tracks[i].is_confirmed]
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
            # Unlike the original DeepSORT (only tracks lost for one frame), IoU may rescue any
            # track the appearance cascade left: measured on the generated scenes, appearance
            # alone lost tracks after short occlusions and cost IDF1 (see bench.tracking_quality).
            iou_tracks = unconfirmed + list(cascade.unmatched_tracks)
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
        detection_boxes = detections.xyxy[dets].astype(np.float64)
        if self._buffer > 0.0:
            # C-BIoU (Yang et al., WACV 2023): frames apart, an object may have moved past its
            # own width; grown boxes still overlap while the Hungarian match keeps the nearest.
            track_boxes = buffered(track_boxes, self._buffer)
            detection_boxes = buffered(detection_boxes, self._buffer)
        cost = iou_cost(track_boxes, detection_boxes)
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
        if features is not None:
            self._feature_frame[self._next_id] = self.frame_index
        self._next_id += 1
