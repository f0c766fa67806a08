"""One DeepSORT track: Kalman state, life cycle, class vote, appearance gallery, history."""

from __future__ import annotations

import enum
import math
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from edge_agent.tracking.kalman import FloatArray, KalmanFilter, xyah_to_xyxy, xyxy_to_xyah

CLOUD_VOTE_WEIGHT = 5
"""Edge frames one cloud answer is worth in a track's class vote. Measured on the generated
scenes (bench.hybrid_tradeoff): letting any cloud vote outrank all edge votes cost up to 6 mAP50
points where the cloud model confuses classes; 5 settles a young track at once without letting a
few cloud answers overturn a long, consistent edge history."""


@dataclass(frozen=True)
class CloudTerms:
    """How a cloud confirmation counts for a track (fusion's settings, in frames):
    `hold_frames` reported without an edge detection, its score halving every
    `half_life_frames` the edge misses it (0: never; a frame optical flow followed it counts
    `followed_aging` of a frame) and the box dropped below `min_held_score`, reported at
    `held_scale` of that score (it ranks below fresh detections); `vouch_frames`
    lifting the track's own detections to the cloud's score (0 never, -1 for life);
    `vote_weight` edge frames one cloud class vote is worth."""

    hold_frames: int = 0
    vouch_frames: int = -1
    half_life_frames: float = 0.0
    followed_aging: float = 1.0
    min_held_score: float = 0.0
    held_scale: float = 1.0
    vote_weight: int = CLOUD_VOTE_WEIGHT


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
        self._cloud_votes: Counter[int] = Counter()
        self.cloud_hold = 0  # frames this track is still reported without an edge detection
        self.cloud_score = 0.0  # score of the last cloud box that confirmed it
        self.cloud_vouch = 0  # frames that score still lifts the track's confidence (-1: ever)
        self.cloud_half_life = 0.0  # frames over which a held box's score halves (0: it stays)
        self.cloud_followed_aging = 1.0  # what a followed frame counts of that (0..1)
        self.cloud_held_floor = 0.0  # a held box scoring less is not reported
        self.cloud_held_scale = 1.0  # share of the held score a held box is reported at
        self.cloud_rejected = False  # the cloud looked and saw nothing there: not reported
        self.cloud_vote_weight = CLOUD_VOTE_WEIGHT  # edge frames one cloud vote is worth
        # the cloud's box against the edge's at an answer (see cloud_fit), and its frames left
        self.fit: FloatArray | None = None
        self.fit_frames = 0
        self.followed_box: FloatArray | None = None  # where optical flow put it this frame
        self.followed_frames = 0  # of the frames since the last sighting, those flow followed
        self.best_score = 0.0  # the best edge detection score matched to it so far
        self.last_score = 0.0  # the score of the edge detection matched to it last
        self.features: deque[FloatArray] = deque(maxlen=gallery_size)
        self.history: deque[tuple[int, FloatArray]] = deque(maxlen=history_size)
        self._record(frame_index, xyxy, feature)
        # where the track was born (tentative): rules see a track only once it is confirmed,
        # and one confirmed across a zone edge or a line still entered or crossed it
        x1, y1, x2, y2 = (float(v) for v in self.history[0][1])
        self.origin: tuple[float, float, float, float] = (x1, y1, x2, y2)
        self.birth_steps = 1  # camera frame intervals from the analysed frame before its birth

    @property
    def class_id(self) -> int:
        """The class with most votes, a cloud answer counting `cloud_vote_weight` edge frames
        (`CLOUD_VOTE_WEIGHT` unless a vote said otherwise); ties go to the class seen first."""
        votes = self._class_votes.copy()
        for class_id, count in self._cloud_votes.items():
            votes[class_id] += self.cloud_vote_weight * count
        return votes.most_common(1)[0][0]

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
    def cloud_only(self) -> bool:
        """Known only from the cloud: no edge detection was ever matched to it (a track fusion
        started from a cloud box)."""
        return self.best_score <= 0.0

    @property
    def is_held(self) -> bool:
        """Reported on the cloud's word where the edge misses it (see `cloud_confirmed`)."""
        return self.is_confirmed and self.cloud_hold > 0 and not self.cloud_rejected

    def cloud_vote(
        self, class_id: int, score: float = 1.0, terms: CloudTerms | None = None
    ) -> None:
        """Record the cloud model's class for this object (a vote worth `terms.vote_weight`
        edge frames, see `class_id`) and vouch for it (see `cloud_confirmed`)."""
        terms = terms or CloudTerms()
        self._cloud_votes[class_id] += 1
        self.cloud_vote_weight = max(1, int(terms.vote_weight))
        self.cloud_confirmed(score, terms)

    def cloud_confirmed(self, score: float, terms: CloudTerms | None = None) -> None:
        """The cloud saw this object with `score`: the track is reported with at least that
        confidence for `terms.vouch_frames` frames (-1: from now on), for `terms.hold_frames`
        frames even where the edge misses it (at a score halving every
        `terms.half_life_frames` the edge has not seen it, 0: at `score` throughout; and only
        while that score is at least `terms.min_held_score`; reported at `terms.held_scale` of
        it), and a rejection is lifted."""
        terms = terms or CloudTerms()
        self.cloud_score = float(score)
        self.cloud_vouch = int(terms.vouch_frames)
        self.cloud_hold = max(self.cloud_hold, int(terms.hold_frames))
        self.cloud_half_life = max(float(terms.half_life_frames), 0.0)
        self.cloud_followed_aging = min(max(float(terms.followed_aging), 0.0), 1.0)
        self.cloud_held_floor = float(terms.min_held_score)
        self.cloud_held_scale = min(max(float(terms.held_scale), 0.0), 1.0)
        self.cloud_rejected = False

    @property
    def held_score(self) -> float:
        """The score of a held box now: the cloud's, halved every `cloud_half_life` frames the
        edge has missed the track (a box coasting on its prediction drifts off the object, so
        it ranks below fresh detections the longer it coasts). A frame optical flow followed
        the object counts `cloud_followed_aging` of a frame: the box moved with what it shows."""
        if self.cloud_half_life <= 0.0:
            return self.cloud_score
        followed = self.followed_frames  # never more than time_since_update (see follow)
        blind = self.time_since_update - (1.0 - self.cloud_followed_aging) * followed
        return self.cloud_score * math.pow(0.5, blind / self.cloud_half_life)

    @property
    def vouched_score(self) -> float:
        """The cloud's score while it still vouches for this track, else 0."""
        return self.cloud_score if self.cloud_vouch != 0 else 0.0

    def seen_by_cloud(self, frames_ago: int) -> None:
        """The cloud saw this object `frames_ago` frames ago (the answer's frame): the track
        counts as seen then, so it is not aged out while only the cloud sees it."""
        self.time_since_update = min(self.time_since_update, max(0, int(frames_ago)))
        self.followed_frames = min(self.followed_frames, self.time_since_update)

    def cloud_fit(
        self, cloud_xyxy: npt.ArrayLike, edge_xyxy: npt.ArrayLike, frames: int, gain: float = 1.0
    ) -> None:
        """The cloud boxed this object as `cloud_xyxy` where the edge had `edge_xyxy` (at the
        answer's frame): for `frames` frames, the track's edge boxes are corrected by `gain` of
        that difference (`fitted`), relative to their size, as the edge's error on one object
        (a neighbour inside its box, a hidden part left out) changes slowly."""
        cloud = np.asarray(cloud_xyxy, dtype=np.float64).reshape(4)
        edge = np.asarray(edge_xyxy, dtype=np.float64).reshape(4)
        cx, cy, cw, ch = _centre_size(cloud)
        ex, ey, ew, eh = _centre_size(edge)
        offset = [(cx - ex) / ew, (cy - ey) / eh, math.log(cw / ew), math.log(ch / eh)]
        self.fit = np.array(offset) * float(gain)
        self.fit_frames = int(frames)

    def fitted(self, xyxy: npt.ArrayLike) -> FloatArray:
        """An edge box of this object, corrected by the cloud's fit while it lasts."""
        box = np.asarray(xyxy, dtype=np.float64).reshape(4)
        if self.fit is None or self.fit_frames <= 0:
            return box
        x, y, w, h = _centre_size(box)
        dx, dy, log_w, log_h = self.fit
        x, y = x + dx * w, y + dy * h
        w, h = w * math.exp(log_w), h * math.exp(log_h)
        return np.array([x - w / 2.0, y - h / 2.0, x + w / 2.0, y + h / 2.0])

    def age_cloud_evidence(self) -> None:
        """One frame passed: the cloud's vouching, hold and box fit run down."""
        if self.fit_frames > 0:
            self.fit_frames -= 1
        if self.cloud_vouch > 0:
            self.cloud_vouch -= 1
        if self.cloud_hold > 0:
            self.cloud_hold -= 1

    def cloud_reject(self) -> None:
        """The cloud looked where this track was and saw nothing: stop reporting it (the
        track lives on, so a later cloud confirmation brings it back under the same id)."""
        self.cloud_rejected = True
        self.cloud_hold = 0

    def confirm(self) -> None:
        """Confirm a tentative track at once (the cloud saw the object too)."""
        if self.is_tentative:
            self.state = TrackState.CONFIRMED

    def delete(self) -> None:
        """Drop the track at the tracker's next update (the cloud saw nothing there)."""
        self.state = TrackState.DELETED

    def box_at(self, frame_index: int, tolerance_frames: int = 0) -> FloatArray | None:
        """The measured box nearest to `frame_index` in the history, within the tolerance."""
        best: tuple[int, FloatArray] | None = None
        for index, xyxy in self.history:
            gap = abs(index - frame_index)
            if gap <= tolerance_frames and (best is None or gap < best[0]):
                best = (gap, xyxy)
        return None if best is None else best[1]

    def mark_missed(self) -> None:
        """Call on a frame without a match: tentative tracks die at once, others after
        `max_age` missed frames in a row."""
        if self.is_tentative or self.time_since_update >= self.max_age:
            self.state = TrackState.DELETED

    def _record(self, frame_index: int, xyxy: npt.ArrayLike, feature: npt.ArrayLike | None) -> None:
        self.history.append((frame_index, np.asarray(xyxy, dtype=np.float64).reshape(4).copy()))
        if feature is not None:
            self.features.append(np.asarray(feature, dtype=np.float64).reshape(-1).copy())


def _centre_size(xyxy: FloatArray) -> tuple[float, float, float, float]:
    """(centre x, centre y, width, height) of a box, its sides at least a pixel."""
    x1, y1, x2, y2 = (float(v) for v in xyxy)
    return (x1 + x2) / 2.0, (y1 + y2) / 2.0, max(x2 - x1, 1.0), max(y2 - y1, 1.0)
