"""`FusedTracker`: the core tracker reporting its tracks by what the cloud said of them.

Fusion (`edge_agent.tracking.fusion`) marks tracks from cloud answers (`CloudEvidence`): a
track the cloud confirmed is reported with at least the cloud's score, and for a while without
an edge detection (rows after the detections' own, `_extra_rows`); a track the cloud rejected
is not reported (`tracker_id` -1) until the cloud sees it again; optical flow follows the held
tracks the edge never detected (`_followable`). Without cloud answers it tracks exactly as
`DeepSortTracker` does.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from detection.slicing import coverage
from edge_agent.tracking.cloud_evidence import CloudTrack
from edge_agent.tracking.kalman import FloatArray
from edge_agent.tracking.track import Track
from edge_agent.tracking.tracker import DeepSortTracker

HELD_MIN_INSIDE = 0.5
"""A held box is reported only while this share of it lies inside the frame: an object
predicted out of the picture has left it. Measured (bench.hybrid.hybrid_tradeoff): held boxes of
objects that had left were the hybrid's only false positives with no object near them on the
`events` scenes; dropping them lifted F1 and IDF1 by 0.3 points. At 0.9 it also dropped real
objects at the border (`quiet:3`, `crowded:3` fell below the edge alone)."""


class FusedTracker(DeepSortTracker):
    """`DeepSortTracker` whose tracks carry the cloud's evidence (`CloudTrack`)."""

    @property
    def cloud_tracks(self) -> list[CloudTrack]:
        """The tracks, as the `CloudTrack`s this tracker makes."""
        return [t for t in self.tracks if isinstance(t, CloudTrack)]

    def spawn_track(self, xyxy: npt.ArrayLike, class_id: int, frame_index: int) -> CloudTrack:
        """`DeepSortTracker.spawn_track`, typed as the `CloudTrack` it makes."""
        return cast(CloudTrack, super().spawn_track(xyxy, class_id, frame_index))

    def _make_track(self, **kwargs: Any) -> Track:
        return CloudTrack(**kwargs)

    def _followable(self, track: Track) -> bool:
        """Held on the cloud's word and never detected: flow moves it where the edge cannot."""
        return isinstance(track, CloudTrack) and track.is_held and track.cloud_only

    def _matches_late(self, track: Track) -> bool:
        """A track the cloud holds while the edge misses it coasts on its prediction: it takes
        a box only after the tentative tracks had theirs (see `DeepSortTracker._first_pass`)."""
        return isinstance(track, CloudTrack) and track.is_held and track.time_since_update > 1

    def _reported(
        self, track: Track, xyxy: FloatArray, confidence: float
    ) -> tuple[FloatArray, float] | None:
        """Not while the cloud rejects the track; the box corrected by the cloud's fit, the
        score lifted to the cloud's while it vouches."""
        if not track.is_confirmed:
            return None
        if not isinstance(track, CloudTrack):
            return xyxy, confidence
        cloud = track.cloud
        if cloud.rejected:
            return None
        return cloud.fitted(xyxy), max(confidence, cloud.vouched_score)

    def _extra_rows(self, matched: set[int], frame_size: tuple[int, int] | None) -> Detections:
        """Rows for confirmed tracks the cloud vouched for recently that the edge missed now;
        every track's evidence ages a frame.

        The cloud sees objects the edge cannot (small, far, occluded); for `cloud.hold` frames
        after an answer such a track is reported at its predicted box with the cloud's score
        (`CloudTrack.held_score`: decaying while the edge misses it, where fusion set a
        half-life), while it stays in the frame (`HELD_MIN_INSIDE`). The row's confidence is
        that score times `cloud.held_scale`: nothing detected the object in this frame, so it
        ranks below the edge's fresh detections; the floor (`cloud.held_floor`) applies to the
        held score, the cloud's evidence, not to the rank.
        """
        rows: list[tuple[CloudTrack, float, FloatArray]] = []
        for track in self.cloud_tracks:
            held, score = track.is_held, track.held_score
            track.cloud.age()
            if not held or score < track.cloud.held_floor or track.track_id in matched:
                continue
            box = track.reported_box()
            # Coasting on the Kalman prediction alone can shrink a box to nothing.
            if not (np.all(np.isfinite(box)) and box[2] > box[0] and box[3] > box[1]):
                continue
            if frame_size is not None:
                frame = np.array([0.0, 0.0, *frame_size], dtype=np.float32)
                if coverage(box.astype(np.float32), frame)[0, 0] < HELD_MIN_INSIDE:
                    continue
            rows.append((track, score * track.cloud.held_scale, box))
        if not rows:
            return Detections.empty()
        return Detections(
            np.stack([box for _, _, box in rows]).astype(np.float32),
            np.array([score for _, score, _ in rows], dtype=np.float32),
            np.array([t.class_id for t, _, _ in rows], dtype=np.int64),
            np.array([t.track_id for t, _, _ in rows], dtype=np.int64),
        )
