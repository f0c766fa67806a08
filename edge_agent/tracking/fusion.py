"""Fusion: a late cloud answer folded into the tracks as they were at its frame.

A cloud answer refers to a frame already in the past. Its boxes are matched (IoU, Hungarian)
against the boxes the tracks had *at that frame* (`Track.history`), then:

- only confident cloud boxes count (`min_cloud_score`), one per object whatever its class;
- a matched track takes the cloud's class (cloud votes outrank edge votes), a tentative one is
  confirmed, the current state is nudged by the offset between the cloud box and the track's
  box at that frame, and the track is reported for `hold_frames` even where the edge misses it;
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
from edge_agent.config.escalation import FusionConfig
from edge_agent.tracking.kalman import xyxy_to_xyah
from edge_agent.tracking.matching import iou_cost, linear_assignment
from edge_agent.tracking.track import Track, TrackState
from edge_agent.tracking.tracker import DeepSortTracker

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class FusionSettings:
    """How much a cloud answer is trusted, and for how long it is useful."""

    horizon_frames: int = 25
    min_cloud_score: float = 0.5
    duplicate_iou: float = 0.7
    hold_frames: int = 12
    min_iou: float = 0.3
    covered_iou: float = 0.5
    box_correction_gain: float = 0.5
    new_track_min_score: float = 0.5
    remove_tentative: bool = True
    history_tolerance_frames: int = 1

    @classmethod
    def from_config(cls, config: FusionConfig, fps: float) -> FusionSettings:
        """Settings of `escalation.fusion` for a camera analysed at `fps` frames/s."""
        return cls(
            horizon_frames=max(1, round(config.horizon_ms / 1000.0 * fps)),
            min_cloud_score=config.min_cloud_score,
            hold_frames=round(config.hold_ms / 1000.0 * fps),
            min_iou=config.min_iou,
            box_correction_gain=config.box_correction_gain,
            new_track_min_score=config.new_track_min_score,
            remove_tentative=config.remove_tentative,
        )


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


def _trusted_rows(cloud: Detections, regions: Sequence[Box], s: FusionSettings) -> list[int]:
    """Cloud boxes worth acting on: confident, inside what was looked at, one per object.

    The cloud's NMS is per class, so one object can come back as "car 0.25" and "truck 0.59";
    only the best box of such a cluster is kept, whatever its class.
    """
    keep = cloud.confidence >= s.min_cloud_score
    if regions:
        keep &= np.array([_inside(_centre(b), regions) for b in cloud.xyxy], dtype=bool)
    candidates = [int(i) for i in np.flatnonzero(keep)]
    candidates.sort(key=lambda i: -float(cloud.confidence[i]))
    chosen: list[int] = []
    for i in candidates:
        if chosen:
            overlap = 1.0 - iou_cost(cloud.xyxy[chosen], cloud.xyxy[i : i + 1])
            if float(overlap.max()) >= s.duplicate_iou:
                continue
        chosen.append(i)
    return sorted(chosen)


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
    rows = _trusted_rows(cloud, regions, s)

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
        track.cloud_vote(int(cloud.class_id[c]), float(cloud.confidence[c]), s.hold_frames)
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
        if float(cloud.confidence[c]) < max(s.new_track_min_score, s.min_cloud_score):
            continue
        if present:
            overlap = 1.0 - iou_cost(np.stack(present), cloud.xyxy[c : c + 1])
            if float(overlap.max()) >= s.covered_iou:
                continue  # a track already covers it now (it moved since that frame)
        track = tracker.spawn_track(cloud.xyxy[c], int(cloud.class_id[c]), frame_index)
        track.state = TrackState.CONFIRMED
        track.cloud_vote(int(cloud.class_id[c]), float(cloud.confidence[c]), s.hold_frames)
        present.append(track.to_xyxy())
        created += 1
    return FusionResult(len(matches), reclassified, confirmed, removed, created)
