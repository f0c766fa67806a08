"""Fusion: a late cloud answer folded into the tracks as they were at its frame.

A cloud answer refers to a frame already in the past. Its boxes are matched (IoU, Hungarian)
against the boxes the tracks had *at that frame* (`Track.history`), then:

- a matched track takes the cloud's class (cloud votes outrank edge votes), a tentative one is
  confirmed, and the current state is nudged by the offset between the cloud box and the track's
  box at that frame;
- a tentative track the cloud looked at and did not see is removed (an edge false positive);
- a confident cloud box that no track explains becomes a new confirmed track (an object the edge
  missed), started at that frame and predicted forward to the present by the Kalman filter;
  the edge's low-score detections (the tracker's second pass) then keep it alive.

In region mode the cloud only looked inside its regions: tracks and boxes outside them are left
alone. Answers older than the horizon are dropped (`FusionResult.dropped_late`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from edge_agent.tracking.kalman import xyxy_to_xyah
from edge_agent.tracking.matching import iou_cost, linear_assignment
from edge_agent.tracking.track import Track, TrackState
from edge_agent.tracking.tracker import DeepSortTracker

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class FusionSettings:
    """How much a cloud answer is trusted, and for how long it is useful."""

    horizon_frames: int = 25
    min_iou: float = 0.3
    box_correction_gain: float = 0.5
    new_track_min_score: float = 0.5
    remove_tentative: bool = True
    history_tolerance_frames: int = 1


@dataclass(frozen=True)
class FusionResult:
    """What one answer changed."""

    matched: int = 0
    reclassified: int = 0
    confirmed: int = 0
    removed: int = 0
    created: int = 0
    dropped_late: bool = False


def _inside(point: tuple[float, float], regions: Sequence[Box]) -> bool:
    x, y = point
    return any(x1 <= x <= x2 and y1 <= y <= y2 for x1, y1, x2, y2 in regions)


def _centre(xyxy: npt.NDArray[np.float64]) -> tuple[float, float]:
    return (float(xyxy[0] + xyxy[2]) / 2.0, float(xyxy[1] + xyxy[3]) / 2.0)


def fuse_answer(
    tracker: DeepSortTracker,
    frame_index: int,
    cloud: Detections,
    *,
    regions: Sequence[Box] = (),
    settings: FusionSettings | None = None,
) -> FusionResult:
    """Fold the cloud's detections of tracker frame `frame_index` into `tracker` (in place).

    `cloud` boxes are in source pixels; `regions` (source pixels) limits what the cloud looked
    at, empty for a whole frame. Returns what changed.
    """
    s = settings if settings is not None else FusionSettings()
    lag = tracker.frame_index - frame_index
    if lag < 0 or lag > s.horizon_frames:
        return FusionResult(dropped_late=True)
    looked = [t for t in tracker.tracks if not t.is_deleted]
    then: list[tuple[Track, npt.NDArray[np.float64]]] = []
    for track in looked:
        box = track.box_at(frame_index, s.history_tolerance_frames)
        if box is not None and (not regions or _inside(_centre(box), regions)):
            then.append((track, box))
    keep = np.ones(len(cloud), dtype=bool)
    if regions:
        keep = np.array([_inside(_centre(b), regions) for b in cloud.xyxy], dtype=bool)
    rows = [int(i) for i in np.flatnonzero(keep)]

    matches: list[tuple[int, int]] = []
    unmatched_tracks = list(range(len(then)))
    unmatched_cloud = rows
    if then and rows:
        cost = iou_cost(np.stack([box for _, box in then]), cloud.xyxy[rows])
        assignment = linear_assignment(
            cost, 1.0 - s.min_iou, list(range(len(then))), list(range(len(rows)))
        )
        matches = [(t, rows[c]) for t, c in assignment.matches]
        unmatched_tracks = assignment.unmatched_tracks
        unmatched_cloud = [rows[c] for c in assignment.unmatched_detections]

    reclassified = confirmed = 0
    for t, c in matches:
        track, box_then = then[t]
        before = track.class_id
        track.cloud_vote(int(cloud.class_id[c]))
        reclassified += int(track.class_id != before)
        if track.is_tentative:
            track.confirm()
            confirmed += 1
        offset = xyxy_to_xyah(cloud.xyxy[c]) - xyxy_to_xyah(box_then)
        track.mean[:4] = track.mean[:4] + s.box_correction_gain * offset

    removed = 0
    if s.remove_tentative:
        for t in unmatched_tracks:
            track = then[t][0]
            if track.is_tentative:
                track.delete()
                removed += 1
    tracker.tracks = [t for t in tracker.tracks if not t.is_deleted]

    created = 0
    present = [t.to_xyxy() for t in tracker.tracks]
    for c in unmatched_cloud:
        if float(cloud.confidence[c]) < s.new_track_min_score:
            continue
        if present:
            overlap = 1.0 - iou_cost(np.stack(present), cloud.xyxy[c : c + 1])
            if float(overlap.max()) >= s.min_iou:
                continue  # a track already covers it now (it moved since that frame)
        track = tracker.spawn_track(cloud.xyxy[c], int(cloud.class_id[c]), frame_index)
        track.state = TrackState.CONFIRMED
        track.cloud_vote(int(cloud.class_id[c]))
        present.append(track.to_xyxy())
        created += 1
    return FusionResult(len(matches), reclassified, confirmed, removed, created)
