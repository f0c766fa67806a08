"""What the cloud said about one track, apart from the tracker core.

Fusion (`edge_agent.tracking.fusion`) drives a `CloudEvidence` per track: the cloud's class
votes, its confirmation (a score that vouches for the track's detections and holds the track
where the edge misses it), a rejection, and a box fit. `CloudTrack` is the tracker's `Track`
with that evidence attached (its class vote counts the cloud's answers); `FusedTracker`
(`edge_agent.tracking.fused_tracker`) creates such tracks and reports them by it. The core
tracker (`DeepSortTracker`, `Track`) knows nothing of the cloud.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_agent.tracking.kalman import FloatArray
from edge_agent.tracking.track import Track

CLOUD_VOTE_WEIGHT = 5
"""Edge frames one cloud answer is worth in a track's class vote. Measured on the generated
scenes (bench.hybrid.hybrid_tradeoff): letting any cloud vote outrank all edge votes cost up to 6
mAP50 points where the cloud model confuses classes; 5 settles a young track at once without letting
a few cloud answers overturn a long, consistent edge history."""


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


class CloudEvidence:
    """The cloud's answers about one track: class votes, confirmation, rejection, box fit.

    `hold` counts the frames the track is still reported without an edge detection, `score`
    is that of the last cloud box that confirmed it, `vouch` the frames that score still lifts
    the track's own detections (-1: ever); `rejected`: the cloud looked and saw nothing there.
    """

    def __init__(self) -> None:
        self.votes: Counter[int] = Counter()
        self.vote_weight = CLOUD_VOTE_WEIGHT
        self.hold = 0
        self.score = 0.0
        self.vouch = 0
        self.half_life = 0.0  # frames over which a held box's score halves (0: it stays)
        self.followed_aging = 1.0  # what a frame optical flow followed counts of that (0..1)
        self.held_floor = 0.0  # a held box scoring less is not reported
        self.held_scale = 1.0  # share of the held score a held box is reported at
        self.rejected = False
        # the cloud's box against the edge's at an answer (see `fit`), and its frames left
        self.fit_offset: FloatArray | None = None
        self.fit_frames = 0

    def class_vote(self, edge_votes: Counter[int]) -> int:
        """The class with most votes, a cloud answer counting `vote_weight` edge frames;
        ties go to the class the edge saw first, then the cloud's first."""
        votes = edge_votes.copy()
        for class_id, count in self.votes.items():
            votes[class_id] += self.vote_weight * count
        return votes.most_common(1)[0][0]

    def vote(self, class_id: int, score: float = 1.0, terms: CloudTerms | None = None) -> None:
        """Record the cloud model's class for this object (a vote worth `terms.vote_weight`
        edge frames) and vouch for it (see `confirmed`)."""
        terms = terms or CloudTerms()
        self.votes[class_id] += 1
        self.vote_weight = max(1, int(terms.vote_weight))
        self.confirmed(score, terms)

    def confirmed(self, score: float, terms: CloudTerms | None = None) -> None:
        """The cloud saw this object with `score`: the track is reported with at least that
        confidence for `terms.vouch_frames` frames (-1: from now on), for `terms.hold_frames`
        frames even where the edge misses it (at a score halving every
        `terms.half_life_frames` the edge has not seen it, 0: at `score` throughout; and only
        while that score is at least `terms.min_held_score`; reported at `terms.held_scale` of
        it), and a rejection is lifted."""
        terms = terms or CloudTerms()
        self.score = float(score)
        self.vouch = int(terms.vouch_frames)
        self.hold = max(self.hold, int(terms.hold_frames))
        self.half_life = max(float(terms.half_life_frames), 0.0)
        self.followed_aging = min(max(float(terms.followed_aging), 0.0), 1.0)
        self.held_floor = float(terms.min_held_score)
        self.held_scale = min(max(float(terms.held_scale), 0.0), 1.0)
        self.rejected = False

    def reject(self) -> None:
        """The cloud looked where this track was and saw nothing: stop reporting it (the
        track lives on, so a later confirmation brings it back under the same id)."""
        self.rejected = True
        self.hold = 0

    def held_score(self, blind_frames: int, followed_frames: int) -> float:
        """The score of a held box after `blind_frames` without an edge detection, optical
        flow having followed the object on `followed_frames` of them: the cloud's, halved every
        `half_life` frames (a box coasting on its prediction drifts off the object, so it ranks
        below fresh detections the longer it coasts); a followed frame counts `followed_aging`
        of a frame, the box moved with what it shows."""
        if self.half_life <= 0.0:
            return self.score
        blind = blind_frames - (1.0 - self.followed_aging) * followed_frames
        return self.score * math.pow(0.5, blind / self.half_life)

    @property
    def vouched_score(self) -> float:
        """The cloud's score while it still vouches for the track, else 0."""
        return self.score if self.vouch != 0 else 0.0

    def fit(
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
        self.fit_offset = np.array(offset) * float(gain)
        self.fit_frames = int(frames)

    def fitted(self, xyxy: npt.ArrayLike) -> FloatArray:
        """An edge box of this object, corrected by the cloud's fit while it lasts."""
        box = np.asarray(xyxy, dtype=np.float64).reshape(4)
        if self.fit_offset is None or self.fit_frames <= 0:
            return box
        x, y, w, h = _centre_size(box)
        dx, dy, log_w, log_h = self.fit_offset
        x, y = x + dx * w, y + dy * h
        w, h = w * math.exp(log_w), h * math.exp(log_h)
        return np.array([x - w / 2.0, y - h / 2.0, x + w / 2.0, y + h / 2.0])

    def age(self) -> None:
        """One frame passed: the vouching, hold and box fit run down."""
        if self.fit_frames > 0:
            self.fit_frames -= 1
        if self.vouch > 0:
            self.vouch -= 1
        if self.hold > 0:
            self.hold -= 1


class CloudTrack(Track):
    """A `Track` with the cloud's evidence about it (`cloud`), as `FusedTracker` makes them:
    its class vote counts the cloud's answers, and it can be held on the cloud's word."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cloud = CloudEvidence()

    @property
    def class_id(self) -> int:
        """The class with most votes, a cloud answer counting `cloud.vote_weight` edge frames
        (see `CloudEvidence.class_vote`)."""
        return self.cloud.class_vote(self.class_votes)

    @property
    def cloud_only(self) -> bool:
        """Known only from the cloud: no edge detection was ever matched to it (a track fusion
        started from a cloud box)."""
        return not self.detected

    @property
    def is_held(self) -> bool:
        """Reported on the cloud's word where the edge misses it (see
        `CloudEvidence.confirmed`)."""
        return self.is_confirmed and self.cloud.hold > 0 and not self.cloud.rejected

    @property
    def held_score(self) -> float:
        """The score of a held box now (`CloudEvidence.held_score` over the frames since the
        edge last matched it)."""
        # followed_frames is never more than time_since_update (see Track.follow)
        return self.cloud.held_score(self.time_since_update, self.followed_frames)


def _centre_size(xyxy: FloatArray) -> tuple[float, float, float, float]:
    """(centre x, centre y, width, height) of a box, its sides at least a pixel."""
    x1, y1, x2, y2 = (float(v) for v in xyxy)
    return (x1 + x2) / 2.0, (y1 + y2) / 2.0, max(x2 - x1, 1.0), max(y2 - y1, 1.0)
