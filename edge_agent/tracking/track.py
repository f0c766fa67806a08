"""One DeepSORT track: Kalman state, life cycle, class vote, appearance gallery, history.

Nothing here knows of the cloud: fusion keeps its evidence apart
(`edge_agent.tracking.cloud_evidence`)."""

from __future__ import annotations

import enum
from collections import Counter, deque

import numpy as np
import numpy.typing as npt

from edge_agent.tracking.kalman import FloatArray, KalmanFilter, xyah_to_xyxy, xyxy_to_xyah


class TrackState(enum.Enum):
    """Life cycle: new tracks are tentative until `n_init` hits in a row, then confirmed."""

    TENTATIVE = "tentative"
    CONFIRMED = "confirmed"
    DELETED = "deleted"


class Track:
    """A single tracked object.

    `age` counts frames since creation, `hits` the matched frames, `time_since_update` the
    frames since the last match. `history` keeps the last `(frame_index, xyxy)` measurements,
    `origin` the box of the detection the track was born from.
    """

    def __init__(
        self,
        track_id: int,
        mean: FloatArray,
        covariance: FloatArray,
        class_id: int,
        frame_index: int,
        xyxy: npt.ArrayLike,
        n_init: int,
        max_age: int,
        gallery_size: int,
        history_size: int,
        feature: npt.ArrayLike | None = None,
    ) -> None:
        self.track_id = track_id
        self.mean = mean
        self.covariance = covariance
        self.n_init = n_init
        self.max_age = max_age
        self.hits = 1
        self.age = 1
        self.time_since_update = 0
        self.state = TrackState.CONFIRMED if n_init <= 1 else TrackState.TENTATIVE
        self._class_votes: Counter[int] = Counter({class_id: 1})
        self.followed_box: FloatArray | None = None  # where optical flow put it this frame
        self.followed_frames = 0  # of the frames since the last sighting, those flow followed
        self.best_score = 0.0  # the best edge detection score matched to it so far
        self.last_score = 0.0  # the score of the edge detection matched to it last
        self.features: deque[FloatArray] = deque(maxlen=gallery_size)
        self.history: deque[tuple[int, FloatArray]] = deque(maxlen=history_size)
        # where the motion model had it on the frames no detection matched (`mark_missed`)
        self.coasted: deque[tuple[int, FloatArray]] = deque(maxlen=history_size)
        self._record(frame_index, xyxy, feature)
        # where the track was born (tentative): rules see a track only once it is confirmed,
        # and one confirmed across a zone edge or a line still entered or crossed it
        x1, y1, x2, y2 = (float(v) for v in self.history[0][1])
        self.origin: tuple[float, float, float, float] = (x1, y1, x2, y2)
        self.birth_steps = 1  # camera frame intervals from the analysed frame before its birth

    @property
    def class_id(self) -> int:
        """The class with most votes (one per matched detection); ties go to the class seen
        first."""
        return self._class_votes.most_common(1)[0][0]

    @property
    def class_votes(self) -> Counter[int]:
        """Matched detections per class (the birth's included); read only."""
        return self._class_votes

    @property
    def is_tentative(self) -> bool:
        """Not yet confirmed."""
        return self.state is TrackState.TENTATIVE

    @property
    def is_confirmed(self) -> bool:
        """Matched `n_init` times in a row at some point and not deleted since."""
        return self.state is TrackState.CONFIRMED

    @property
    def is_deleted(self) -> bool:
        """To be dropped by the tracker."""
        return self.state is TrackState.DELETED

    def to_xyxy(self) -> FloatArray:
        """The current (predicted or corrected) box in xyxy."""
        return xyah_to_xyxy(self.mean[:4])

    def gallery(self) -> FloatArray:
        """The stored appearance features `(k, d)`; `(0, 0)` when there are none."""
        if not self.features:
            return np.empty((0, 0), dtype=np.float64)
        return np.stack(list(self.features))

    def predict(self, kalman: KalmanFilter, steps: int = 1) -> None:
        """Advance the state to the next analysed frame, `steps` frame intervals of the camera
        later (more than one when frames in between were not analysed); `age` and
        `time_since_update` count analysed frames."""
        for _ in range(max(1, steps)):
            self.mean, self.covariance = kalman.predict(self.mean, self.covariance)
        self.followed_box = None  # a new frame: flow has to find it again
        self.age += 1
        self.time_since_update += 1

    def update(
        self,
        kalman: KalmanFilter,
        xyah: npt.ArrayLike,
        xyxy: npt.ArrayLike,
        class_id: int,
        frame_index: int,
        feature: npt.ArrayLike | None = None,
        score: float = 0.0,
    ) -> None:
        """Correct with a matched detection (edge `score`); confirms the track after `n_init`
        hits."""
        self.best_score = max(self.best_score, float(score))
        self.last_score = float(score)
        self.mean, self.covariance = kalman.update(self.mean, self.covariance, xyah)
        self.hits += 1
        self.time_since_update = 0
        self.followed_frames = 0
        self._class_votes[class_id] += 1
        self._record(frame_index, xyxy, feature)
        if self.is_tentative and self.hits >= self.n_init:
            self.state = TrackState.CONFIRMED

    def follow(self, kalman: KalmanFilter, xyxy: npt.ArrayLike, frame_index: int) -> None:
        """The object was followed (optical flow, not a detection) to `xyxy` on `frame_index`:
        it is reported there (`reported_box`: the Kalman posterior would lag behind a moving
        object, and the next frame's flow starts from it), the Kalman state is corrected
        towards it (learning the velocity) and the history records it (a later cloud answer
        about this frame finds the track there); hits, age and class votes are untouched."""
        box = np.asarray(xyxy, dtype=np.float64).reshape(4)
        if not np.all(np.isfinite(box)) or box[2] <= box[0] or box[3] <= box[1]:
            return
        self.mean, self.covariance = kalman.update(self.mean, self.covariance, xyxy_to_xyah(box))
        self.followed_box = box
        self.followed_frames = min(self.followed_frames + 1, self.time_since_update)
        self._record(frame_index, box, None)

    def reported_box(self) -> FloatArray:
        """Where the track is reported without a detection: the box optical flow followed it
        to on this frame, else the Kalman state (`to_xyxy`)."""
        return self.followed_box if self.followed_box is not None else self.to_xyxy()

    @property
    def detected(self) -> bool:
        """A detection was matched to it at some point (a track started from a box another
        source gave, like a cloud answer, may have none)."""
        return self.best_score > 0.0

    def seen_at(self, frames_ago: int) -> None:
        """Another source (a cloud answer) saw this object `frames_ago` frames ago: the track
        counts as seen then, so it is not aged out while only that source sees it."""
        self.time_since_update = min(self.time_since_update, max(0, int(frames_ago)))
        self.followed_frames = min(self.followed_frames, self.time_since_update)

    def confirm(self) -> None:
        """Confirm a tentative track at once (another source saw the object too)."""
        if self.is_tentative:
            self.state = TrackState.CONFIRMED

    def delete(self) -> None:
        """Drop the track at the tracker's next update (another source saw nothing there)."""
        self.state = TrackState.DELETED

    def box_at(self, frame_index: int, tolerance_frames: int = 0) -> FloatArray | None:
        """The measured box nearest to `frame_index` in the history, within the tolerance."""
        best: tuple[int, FloatArray] | None = None
        for index, xyxy in self.history:
            gap = abs(index - frame_index)
            if gap <= tolerance_frames and (best is None or gap < best[0]):
                best = (gap, xyxy)
        return None if best is None else best[1]

    def box_then(self, frame_index: int, tolerance_frames: int = 0) -> FloatArray | None:
        """The best estimate of where the track was on `frame_index`: the box measured on it;
        else, measured before and after it, the box interpolated between the nearest two; else
        the box its motion model had on that frame (`coasted`: no detection matched it there,
        none since); else the nearest measured box within `tolerance_frames` (`box_at`)."""
        before = after = None
        for index, xyxy in self.history:
            if index == frame_index:
                return xyxy
            if index < frame_index and (before is None or index > before[0]):
                before = (index, xyxy)
            if index > frame_index and (after is None or index < after[0]):
                after = (index, xyxy)
        if before is not None and after is not None:
            share = (frame_index - before[0]) / (after[0] - before[0])
            return np.asarray(before[1] + share * (after[1] - before[1]), dtype=np.float64)
        coasted = next((xyxy for index, xyxy in self.coasted if index == frame_index), None)
        return coasted if coasted is not None else self.box_at(frame_index, tolerance_frames)

    def mark_missed(self, frame_index: int | None = None) -> None:
        """Call on a frame without a match: tentative tracks die at once, others after
        `max_age` missed frames in a row. With `frame_index`, a track that lives on keeps its
        predicted box for that frame (`box_then`)."""
        if self.is_tentative or self.time_since_update >= self.max_age:
            self.state = TrackState.DELETED
        elif frame_index is not None:
            self.coasted.append((frame_index, self.to_xyxy().copy()))

    def _record(self, frame_index: int, xyxy: npt.ArrayLike, feature: npt.ArrayLike | None) -> None:
        self.history.append((frame_index, np.asarray(xyxy, dtype=np.float64).reshape(4).copy()))
        if feature is not None:
            self.features.append(np.asarray(feature, dtype=np.float64).reshape(-1).copy())
