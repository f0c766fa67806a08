"""`DeepSortTracker`: the per-camera tracker loop (predict, match, update, birth, death),
without the cloud in it (`edge_agent.tracking.fused_tracker` adds that)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Self

import numpy as np
import numpy.typing as npt

from detection.class_groups import GroupKeys
from detection.detections import Detections
from edge_agent.config.tracker import TrackerConfig
from edge_agent.tracking.kalman import CHI2INV95, FloatArray, KalmanFilter, xyxy_to_xyah
from edge_agent.tracking.matching import (
    INFEASIBLE_COST,
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


def _check_range(
    name: str, value: float, low: float, high: float, *, high_open: bool = False
) -> None:
    ok = math.isfinite(value) and low <= value and (value < high if high_open else value <= high)
    if not ok:
        bracket = ")" if high_open else "]"
        raise ValueError(f"{name} must be in [{low}, {high}{bracket}, got {value}")


class DeepSortTracker:
    """DeepSORT with a ByteTrack-style second pass for low-score detections: detections in,
    tracks out. `update` runs named steps a subclass may extend, and hooks (`_make_track`,
    `_followable`, `_reported`, `_extra_rows`) through which `FusedTracker`
    (`edge_agent.tracking.fused_tracker`) adds what the cloud said, as BoT-SORT extends
    ByteTrack in ultralytics.

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
        class_keys: GroupKeys | None = None,
        recover_iou: float = 0.0,
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
        _check_range("recover_iou", recover_iou, 0.0, 1.0)
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
        # a lost track may take a detection overlapping its last measured box this much (0: off)
        self.recover_iou = float(recover_iou)
        # which detections may continue which tracks by class (None: any class, any track)
        self.class_keys = class_keys
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
    def from_config(
        cls,
        config: TrackerConfig,
        confidence_threshold: float,
        class_keys: GroupKeys | None = None,
    ) -> Self:
        """A tracker with the `tracker:` settings, the detector's confidence threshold and
        its class groups (`class_keys`, from `detector.class_groups`; None or
        `tracker.class_gate` off: a detection of any class may continue any track)."""
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
            class_keys=class_keys if config.class_gate else None,
            recover_iou=config.recover_iou,
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
        `follow` moves the tracks `_followable` picks that no detection matched by what their
        box's content did since the previous frame (`_follow`; none in this class).
        `frame_size` (width, height) goes to `_extra_rows`.

        The steps, each a method a subclass may extend: `_predict`, `_split_by_score`,
        `_settle_certain` (and embed the rest), `_first_pass` (appearance, then IoU),
        `_recover` (last measured boxes), `_second_pass` (low scores), `_update_matched`,
        `_mark_missed`, `_follow`, `_report` (per match `_reported`), `_start_new`, `_age_out`,
        `_extra_rows`.
        """
        if embeddings is not None and embed is not None:
            raise ValueError("pass embeddings or embed, not both")
        features = self._check_embeddings(detections, embeddings)
        self.frame_index += 1
        steps = min(max(1, int(steps)), self.max_age_frames)
        self._buffer = min(self.skip_iou_buffer * (steps - 1), self.skip_iou_buffer_max)
        before = {
            t.track_id: t.reported_box() for t in self.tracks if follow and self._followable(t)
        }
        self._predict(steps)

        high, low = self._split_by_score(detections.confidence)
        xyah = xyxy_to_xyah(detections.xyxy).reshape(-1, 4)
        embedded = np.ones(len(detections), dtype=bool)
        settled: list[tuple[int, int]] = []
        if embed is not None:
            settled, features = self._settle_certain(detections, xyah, high, embed, embedded)
        taken = {d for _, d in settled}
        open_high = [d for d in high if d not in taken]
        first = self._first_pass(detections, xyah, features, open_high, {t for t, _ in settled})
        first = self._recover(detections, first)
        second = self._second_pass(detections, first.unmatched_tracks, low)
        matches = settled + first.matches + second.matches

        confirmed_before = {id(track) for track in self.tracks if track.is_confirmed}
        self._update_matched(detections, xyah, features, embedded, matches)
        self._mark_missed(second.unmatched_tracks, confirmed_before)
        if follow is not None:
            missed = [self.tracks[t] for t in second.unmatched_tracks]
            self._follow([t for t in missed if t.track_id in before], before, follow)

        tracked = self._report(detections, matches)
        for d in first.unmatched_detections:
            if may_start is not None and not may_start[d]:
                continue
            track = self._start_new(detections, xyah, features if embedded[d] else None, d, steps)
            if track is not None and track.is_confirmed:
                tracked.tracker_id[d] = track.track_id
        self._age_out()
        matched = {int(t) for t in tracked.tracker_id if t >= 0}
        return Detections.concatenate([tracked, self._extra_rows(matched, frame_size)])

    # ---- the steps of `update` -------------------------------------------------------------

    def _predict(self, steps: int) -> None:
        """Move every track `steps` camera frame intervals ahead on its motion model."""
        for track in self.tracks:
            track.predict(self.kalman, steps)

    def _split_by_score(self, confidence: npt.NDArray[np.float32]) -> tuple[list[int], list[int]]:
        """Detection indices scoring at least `confidence_threshold` (they match first and may
        start tracks), and those from `low_score_threshold` up to it (second pass only)."""
        high = [int(i) for i in np.flatnonzero(confidence >= self.confidence_threshold)]
        low: list[int] = []
        if self.low_score_threshold is not None:
            above = confidence >= self.low_score_threshold
            low = [int(i) for i in np.flatnonzero(above & (confidence < self.confidence_threshold))]
        return high, low

    def _settle_certain(
        self,
        detections: Detections,
        xyah: FloatArray,
        high: list[int],
        embed: EmbedFunction,
        embedded: npt.NDArray[np.bool_],
    ) -> tuple[list[tuple[int, int]], FloatArray | None]:
        """The `certain_pairs`, and features from `embed` for the other high detections and
        those whose track is due a fresh one; sets `embedded` to the detections that got one."""
        settled = self.certain_pairs(detections, xyah, high)
        fresh = {d for t, d in settled if not self._feature_due(self.tracks[t])}
        wanted = [d for d in high if d not in fresh]
        features = self._check_embeddings(detections, embed(wanted), wanted)
        embedded[:] = False
        embedded[wanted] = features is not None
        return settled, features

    def _update_matched(
        self,
        detections: Detections,
        xyah: FloatArray,
        features: FloatArray | None,
        embedded: npt.NDArray[np.bool_],
        matches: list[tuple[int, int]],
    ) -> None:
        """Correct each matched track with its detection (and feature, where embedded)."""
        for t, d in matches:
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

    def _mark_missed(self, unmatched_tracks: list[int], confirmed_before: set[int]) -> None:
        """Age the unmatched tracks (tentative ones die), and backdate the origin of the tracks
        this frame confirmed (`confirmed_before`: `id()` of those confirmed before it)."""
        for t in unmatched_tracks:
            self.tracks[t].mark_missed(self.frame_index)
        for track in self.tracks:
            if track.is_confirmed and id(track) not in confirmed_before:
                self._backdate_origin(track)

    def _report(self, detections: Detections, matches: list[tuple[int, int]]) -> Detections:
        """This frame's detections with the id and class vote of the track each matched where
        `_reported` reports it; `tracker_id` -1 elsewhere."""
        tracker_id = np.full(len(detections), -1, dtype=np.int64)
        class_id = detections.class_id.copy()
        confidence = detections.confidence.copy()
        xyxy = detections.xyxy.copy()
        for t, d in matches:
            track = self.tracks[t]
            reported = self._reported(track, xyxy[d], float(confidence[d]))
            if reported is not None:
                xyxy[d], confidence[d] = reported
                tracker_id[d] = track.track_id
                class_id[d] = track.class_id
        return Detections(xyxy, confidence, class_id, tracker_id)

    def _start_new(
        self,
        detections: Detections,
        xyah: FloatArray,
        features: FloatArray | None,
        d: int,
        steps: int,
    ) -> Track | None:
        """Start a track from unmatched detection `d` if it scores `new_track_min_score`."""
        if detections.confidence[d] < self.new_track_min_score:
            return None
        feature = None if features is None else features[d]
        track = self._new_track(
            xyah[d], detections.xyxy[d], int(detections.class_id[d]), self.frame_index, feature
        )
        if feature is not None:
            self._feature_frame[track.track_id] = self.frame_index
        track.birth_steps = steps
        return track

    def _age_out(self) -> None:
        """Drop the deleted tracks (missed too long, or deleted from outside)."""
        for track in self.tracks:
            if track.is_deleted:
                self._feature_frame.pop(track.track_id, None)
        self.tracks = [t for t in self.tracks if not t.is_deleted]

    # ---- hooks for subclasses (`FusedTracker`) -----------------------------------------------

    def _new_track(
        self,
        xyah: npt.ArrayLike,
        xyxy: npt.ArrayLike,
        class_id: int,
        frame_index: int,
        feature: npt.ArrayLike | None = None,
    ) -> Track:
        """Create a track with the next id for a box seen at `frame_index`, and keep it."""
        mean, covariance = self.kalman.initiate(np.asarray(xyah, dtype=np.float64).reshape(4))
        track = self._make_track(
            track_id=self._next_id,
            mean=mean,
            covariance=covariance,
            class_id=class_id,
            frame_index=frame_index,
            xyxy=xyxy,
            n_init=self.n_init,
            max_age=self.max_age_frames,
            gallery_size=self.gallery_size,
            history_size=self.history_size,
            feature=feature,
        )
        self._next_id += 1
        self.tracks.append(track)
        return track

    def _make_track(self, **kwargs: Any) -> Track:
        """The `Track` (or subclass) this tracker keeps, from `Track`'s arguments."""
        return Track(**kwargs)

    def _followable(self, track: Track) -> bool:
        """Whether `update`'s `follow` moves `track` when no detection matched it (never here)."""
        return False

    def _reported(
        self, track: Track, xyxy: FloatArray, confidence: float
    ) -> tuple[FloatArray, float] | None:
        """The box and score a detection matched to `track` is reported with; None: it is
        reported untracked. Here: as detected, once the track is confirmed."""
        return (xyxy, confidence) if track.is_confirmed else None

    def _extra_rows(self, matched: set[int], frame_size: tuple[int, int] | None) -> Detections:
        """Rows after the detections' own, for tracks reported without a detection
        (`matched`: the ids the detections carry). None here."""
        return Detections.empty()

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

    def _follow(
        self, tracks: list[Track], before: dict[int, FloatArray], follow: FollowFunction
    ) -> None:
        """Move the missed followable `tracks` by the flow of their previous boxes (`before`,
        by track id): a Kalman correction to the moved box, which also teaches a
        track started without a detection its velocity. Not a hit: the track still ages."""
        tracks = [t for t in tracks if not t.is_deleted]
        if not tracks:
            return
        boxes = [before[t.track_id] for t in tracks]
        shifts = follow([(float(b[0]), float(b[1]), float(b[2]), float(b[3])) for b in boxes])
        for track, box, shift in zip(tracks, boxes, shifts, strict=True):
            if shift is not None:
                dx, dy = shift
                track.follow(self.kalman, box + np.array([dx, dy, dx, dy]), self.frame_index)

    def spawn_track(self, xyxy: npt.ArrayLike, class_id: int, frame_index: int) -> Track:
        """Start a track for a box seen at past frame `frame_index` (a cloud answer) and predict
        it forward to the current frame; returns it (tentative: the caller decides)."""
        box = np.asarray(xyxy, dtype=np.float64).reshape(4)
        track = self._new_track(xyxy_to_xyah(box).reshape(4), box, int(class_id), frame_index)
        for _ in range(max(0, self.frame_index - frame_index)):
            track.predict(self.kalman)
        track.time_since_update = 0  # just seen (by the cloud), so not aged out at once
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
        same = self._same_kind(list(range(len(self.tracks))), detections, high)
        overlap = (iou_cost(boxes, detections.xyxy[high]) <= self.max_iou_distance) & same
        candidate = overlap | (self._gate_mask(xyah[high]) & same)
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
        """Appearance cascade for confirmed tracks, then IoU for the confirmed ones it left,
        then IoU for the tentative ones together with the confirmed ones that `_matches_late`
        on the detections still open (tracks already settled by `certain_pairs` take no part).

        Confirmed tracks match before the tentative ones (ByteTrack's order): a box the
        detector put around two people walking together starts a tentative track between
        them, and in one IoU assignment with the confirmed tracks it took the next frame's box
        of one of them (it overlapped more than that person's own track, which had just
        moved). Two hits confirmed it: a second track on one person, whose one step from the
        pair's box to that person's fired a zone exit nobody made (`scripts/demo` on a loaded
        2-core box, traced frame by frame). A subclass's coasting tracks may wait for the
        joint step (`FusedTracker`: a cloud-held track the edge keeps missing; letting it go
        first cost the hybrid's vtest person F1 0.850 -> 0.830, `bench.hybrid.real_hybrid`)."""
        open_tracks = [i for i in range(len(self.tracks)) if i not in settled_tracks]
        confirmed = [i for i in open_tracks if self.tracks[i].is_confirmed]
        unconfirmed = [i for i in open_tracks if not self.tracks[i].is_confirmed]
        if features is not None:
            feats = features

            def appearance(track_idx: Sequence[int], det_idx: Sequence[int]) -> FloatArray:
                cost = cosine_cost([self.tracks[t].gallery() for t in track_idx], feats[det_idx])
                states = [(self.tracks[t].mean, self.tracks[t].covariance) for t in track_idx]
                gated = gate_cost_matrix(self.kalman, cost, states, xyah[det_idx])
                same = self._same_kind(list(track_idx), detections, list(det_idx))
                return np.where(same, gated, INFEASIBLE_COST)

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
            # alone lost tracks after short occlusions and cost IDF1 (see
            # bench.edge.tracking_quality).
            iou_confirmed = list(cascade.unmatched_tracks)
            matches, remaining = cascade.matches, cascade.unmatched_detections
        else:
            iou_confirmed, matches, remaining = confirmed, [], high
        late = [t for t in iou_confirmed if self._matches_late(self.tracks[t])]
        first = [t for t in iou_confirmed if t not in late]
        kept = self._iou_match(detections, first, remaining, self.max_iou_distance)
        young = self._iou_match(
            detections, unconfirmed + late, kept.unmatched_detections, self.max_iou_distance
        )
        return Assignment(
            matches + kept.matches + young.matches,
            kept.unmatched_tracks + young.unmatched_tracks,
            young.unmatched_detections,
        )

    def _matches_late(self, track: Track) -> bool:
        """Whether a confirmed track waits for the IoU step of the tentative ones instead of
        going before them (none here; a subclass's coasting tracks may)."""
        return False

    def _recover(self, detections: Detections, first: Assignment) -> Assignment:
        """OC-SORT's observation-centric recovery (Cao et al., CVPR 2023): the confirmed tracks
        the first pass left may take the detections it left by IoU (>= `recover_iou`) with the
        box each track was last *measured* at, not the one its motion model predicts.

        A person who stops or turns after a few frames of walking is predicted on past their
        box; the first pass then leaves both, and a second track is born on them, one to report
        only after `n_init` hits, to escalate and to alert on again. Measured with
        `bench.hybrid.real_hybrid` (the `recovery` rows, against the hand-verified truth) and on
        the generated scenes (little change there: their objects keep a straight line)."""
        tracks = [t for t in first.unmatched_tracks if self.tracks[t].is_confirmed]
        dets = first.unmatched_detections
        if self.recover_iou <= 0.0 or not tracks or not dets:
            return first
        last = np.stack([self.tracks[t].history[-1][1] for t in tracks])
        cost = iou_cost(last, detections.xyxy[dets].astype(np.float64))
        cost = np.where(self._same_kind(tracks, detections, dets), cost, INFEASIBLE_COST)
        found = linear_assignment(cost, 1.0 - self.recover_iou, tracks, dets)
        taken = {t for t, _ in found.matches}
        return Assignment(
            first.matches + found.matches,
            [t for t in first.unmatched_tracks if t not in taken],
            found.unmatched_detections,
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
        cost = np.where(self._same_kind(tracks, detections, dets), cost, INFEASIBLE_COST)
        return linear_assignment(cost, max_distance, tracks, dets)

    def _same_kind(
        self, tracks: list[int], detections: Detections, dets: list[int]
    ) -> npt.NDArray[np.bool_]:
        """`(tracks, dets)`: whether the detection's class may continue the track's (its own
        class, or one of its group in `class_keys`; everything where there are none)."""
        if self.class_keys is None:
            return np.ones((len(tracks), len(dets)), dtype=bool)
        return self.class_keys.same_kind(
            [self.tracks[t].class_id for t in tracks], detections.class_id[dets]
        )
