"""Fusion: a late cloud answer folded into the tracks as they were at its frame.

A cloud answer refers to a frame already in the past. Its boxes are matched (IoU, Hungarian)
against the boxes the tracks had *at that frame* (`Track.history`), then:

- only boxes of the classes the edge keeps count (`classes`: the edge detector's class filter;
  the cloud model answers every class it knows, and a cloud "boat" or "fire hydrant" must not
  confirm, relabel, seed or vouch for tracks of a camera that drops those classes), and of
  those only confident ones (`min_cloud_score`), one per object whatever its class;
- a matched track whose box agrees with the cloud's (`confirm_iou`) is *confirmed*: it is
  reported for `hold_frames` even where the edge misses it (at the cloud's score there), its
  own detections keep the edge's score unless `vouch_frames` lifts them to the cloud's,
  and with `relabel` takes the cloud's class as a heavy vote (`cloud_vote_weight`); with
  `cloud_sighting` it counts as seen at the answer's frame (not aged out while only the cloud
  sees it); a tentative one is confirmed; the current state can be nudged by the cloud's box
  offset (`box_correction_gain`); and for `fit_frames` the track's own edge boxes are
  corrected by `fit_gain` of how the cloud's box differed from the edge's at that frame
  (`CloudEvidence.fit`: a systematic error, like a half-hidden person boxed with a neighbour,
  persists from frame to frame);
- a track the cloud looked at and returned no box for at all (not even a weak one of another
  class, nor one covering `hidden_coverage` of it: a half-hidden object is boxed with the one
  in front) is *rejected* when the edge never scored it well (`reject_below_edge_score`): it is no
  longer reported, and its recent alerts are retracted, until the cloud sees it again; a
  tentative one is removed; with `reject_duplicates` so is a weak track the cloud saw only
  through a box that another track, containing it, matched (a second edge box on one object);
- a confident cloud box that no track explains can become a new confirmed track (an object the
  edge missed), started at that frame and predicted forward to the present by the Kalman filter;
  where the edge keeps missing it, the tracker moves it by optical flow (`follow_flow`, see
  `edge_agent.tracking.flow`).

The corrective steps (class votes, box fits, rejections, removals) need the cloud to be
*trusted* on this camera (`CloudTrust`): of the tracks the edge is sure of (best score >=
`trust_edge_score`) that the cloud looked at, it must have returned a box for at least
`min_agreement` (the lower end of a 90 % confidence interval of that share), over at least
`trust_min_checks` of them. New tracks need trust too, or a camera still undecided (fewer checks
than that): on a scene of small far objects the edge is sure of too few to ever decide, and the
cloud's boxes are what it has. A cloud model that misses what the edge plainly sees on a camera
(another viewpoint, light or object mix than it was trained on) cannot be right when it
disagrees there; the edge then only takes its confirmations. Measured on the generated scenes
(`bench.hybrid.hybrid_tradeoff`): an earlier cloud model returned a box for 94-98 % of such tracks
on four scenes and 74 % on the one where its mAP50 was 0.19 below the edge's (caught at the then
default of 0.75); the current one for 61 % and 77 % on the two scenes of small far objects,
where it is far better than the edge and the edge's sure tracks include its false positives,
so the default is now 0.5 (`FusionConfig.min_agreement`).

In region mode the cloud only looked inside its regions: tracks and boxes outside them are left
alone. Answers older than the horizon, or than the tracks keep their boxes
(`DeepSortTracker.history_size` analysed frames: past it no track can be matched and every box
would look new), are dropped (`FusionResult.dropped_late`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from detection.slicing import box_overlap, coverage
from edge_agent.config.escalation import FusionConfig
from edge_agent.escalation.roi import iou
from edge_agent.tracking.cloud_evidence import CLOUD_VOTE_WEIGHT, CloudTerms, CloudTrack
from edge_agent.tracking.fused_tracker import FusedTracker
from edge_agent.tracking.kalman import xyxy_to_xyah
from edge_agent.tracking.matching import (
    INFEASIBLE_COST,
    Assignment,
    iou_cost,
    linear_assignment,
)
from edge_agent.tracking.track import TrackState

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class FusionSettings:
    """How much a cloud answer is trusted, and for how long it is useful."""

    horizon_frames: int = 25
    min_cloud_score: float = 0.5
    duplicate_iou: float = 0.7
    hold_frames: int = 12
    hold_half_life_frames: float = 0.0  # a held box's score halves over these frames (0: never)
    followed_aging: float = 1.0  # what a frame optical flow followed counts of those (0..1)
    min_held_score: float = 0.0  # a held box scoring less is not reported
    held_score_scale: float = 1.0  # share of its held score a held box is reported at
    fit_gain: float = 0.0  # share of the cloud's box fit applied to the track's edge boxes
    fit_frames: int = 0  # frames that fit lasts
    vouch_frames: int = 0  # frames a confirmation lifts the score (0: never, -1: for life)
    min_iou: float = 0.3
    hidden_coverage: float = 0.5  # a cloud box covering this share of a track's saw it (0: off)
    covered_iou: float = 0.5
    box_correction_gain: float = 0.5
    new_track_min_score: float = 0.5
    remove_tentative: bool = True
    relabel: bool = False
    cloud_vote_weight: int = CLOUD_VOTE_WEIGHT
    cloud_sighting: bool = False
    follow_flow: bool = False
    reject_duplicates: bool = False
    history_tolerance_frames: int = 1
    confirm_iou: float = 0.5
    reject_below_edge_score: float = 0.7
    min_agreement: float = 0.85
    trust_min_checks: int = 10
    trust_edge_score: float = 0.6
    # class ids the edge keeps (its detector's class filter); cloud boxes of others are dropped
    # before anything else (None: every class counts)
    classes: frozenset[int] | None = None

    @property
    def vouch(self) -> int:
        """Frames a confirmation lifts a matched track's score: 0 never, -1 for life."""
        return self.vouch_frames

    def terms(self, held: bool = True) -> CloudTerms:
        """What a confirmation gives a track (`CloudEvidence.confirmed`); `held` False: no hold
        (an untrusted cloud only vouches)."""
        return CloudTerms(
            hold_frames=self.hold_frames if held else 0,
            vouch_frames=self.vouch_frames,
            half_life_frames=self.hold_half_life_frames,
            followed_aging=self.followed_aging,
            min_held_score=self.min_held_score,
            held_scale=self.held_score_scale,
            vote_weight=self.cloud_vote_weight,
        )

    def edge_classes(self, cloud: Detections) -> Detections:
        """`cloud` without the boxes of classes the edge does not keep (see `classes`)."""
        if self.classes is None or not len(cloud):
            return cloud
        return cloud[np.isin(cloud.class_id, sorted(self.classes))]

    @classmethod
    def from_config(
        cls, config: FusionConfig, fps: float, classes: Iterable[int] | None = None
    ) -> FusionSettings:
        """Settings of `escalation.fusion` for a camera analysed at `fps` frames/s whose
        detector keeps `classes` (class ids; None: every class)."""
        return cls(
            classes=None if classes is None else frozenset(int(c) for c in classes),
            horizon_frames=max(1, round(config.horizon_ms / 1000.0 * fps)),
            min_cloud_score=config.min_cloud_score,
            hold_frames=round(config.hold_ms / 1000.0 * fps),
            hold_half_life_frames=(
                0.0
                if config.hold_half_life_ms is None
                else max(config.hold_half_life_ms / 1000.0 * fps, 1e-3)
            ),
            followed_aging=config.followed_aging,
            min_held_score=config.min_held_score,
            held_score_scale=config.held_score_scale,
            fit_gain=config.fit_gain,
            fit_frames=round(config.fit_ms / 1000.0 * fps),
            vouch_frames=-1 if config.vouch_ms is None else round(config.vouch_ms / 1000.0 * fps),
            min_iou=config.min_iou,
            hidden_coverage=config.hidden_coverage,
            box_correction_gain=config.box_correction_gain,
            new_track_min_score=config.new_track_min_score,
            remove_tentative=config.remove_tentative,
            relabel=config.relabel,
            cloud_vote_weight=config.cloud_vote_weight,
            cloud_sighting=config.cloud_sighting,
            follow_flow=config.follow_flow,
            reject_duplicates=config.reject_duplicates,
            confirm_iou=config.confirm_iou,
            reject_below_edge_score=config.reject_below_edge_score,
            min_agreement=config.min_agreement,
            trust_min_checks=config.trust_min_checks,
        )


TRUST_Z = 1.28
"""Normal quantile of `CloudTrust.agreement_lower_bound` (one-sided 90 %). Measured
(bench.hybrid.hybrid_tradeoff): judged on the plain agreement, the cloud earned trust on `events:2`
at 3 frames/s from a lucky start and cost 7.6 mAP50 points there; on the lower bound it did not."""


@dataclass
class CloudTrust:
    """How often the cloud returned a box for the tracks the edge is sure of, on one camera.

    `checked` counts confirmed tracks with a best edge score >= `trust_edge_score` inside what
    the cloud looked at; `seen` those of them the cloud returned any box for (IoU >= `min_iou`,
    any class and score, or covering `hidden_coverage` of the track's box).
    """

    checked: int = 0
    seen: int = 0

    @property
    def agreement(self) -> float | None:
        """`seen / checked`, None before anything was checked."""
        return self.seen / self.checked if self.checked else None

    def trusted(self, settings: FusionSettings) -> bool:
        """Whether the cloud may correct the edge: enough checks, and surely enough of them
        seen."""
        if settings.min_agreement <= 0.0:
            return True
        return (
            self.checked >= settings.trust_min_checks
            and self.agreement_lower_bound() >= settings.min_agreement
        )

    def agreement_lower_bound(self, z: float = TRUST_Z) -> float:
        """The Wilson score lower bound of the agreement (`z` 1.28: one-sided 90 %), so that
        a few lucky checks do not earn trust; 0 before any check."""
        n = self.checked
        if n == 0:
            return 0.0
        p = self.seen / n
        centre = p + z * z / (2 * n)
        margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return (centre - margin) / (1 + z * z / n)


@dataclass(frozen=True, slots=True)
class CloudHint:
    """A cloud box that no track explains, at the answer's frame: maybe an object the edge
    missed, where it may look closer (`pipeline.focus`)."""

    box: Box
    score: float
    class_id: int


@dataclass(frozen=True)
class FusionResult:
    """What one answer changed."""

    matched: int = 0
    reclassified: int = 0
    confirmed: int = 0
    removed: int = 0
    created: int = 0
    dropped_late: bool = False
    rejected: tuple[int, ...] = ()  # ids of the tracks the cloud rejected
    trusted: bool = True  # whether the corrective steps were allowed
    unexplained: tuple[CloudHint, ...] = ()  # the cloud's boxes no track explains
    # ids of the tracks the cloud returned a box for (matched, or covered as half hidden):
    # settled for the escalation policy's verification memory until they change
    verified: tuple[int, ...] = ()


@dataclass
class FusionTally:
    """Running totals of what fused answers did (one camera's, or one benchmark run's)."""

    answers: int = 0
    late: int = 0
    matched: int = 0
    reclassified: int = 0
    confirmed: int = 0
    removed: int = 0
    rejected: int = 0
    created: int = 0

    def add(self, result: FusionResult) -> None:
        """Count one answer's `FusionResult`."""
        self.answers += 1
        self.late += int(result.dropped_late)
        self.matched += result.matched
        self.reclassified += result.reclassified
        self.confirmed += result.confirmed
        self.removed += result.removed
        self.rejected += len(result.rejected)
        self.created += result.created

    def changes(self) -> dict[str, int]:
        """The totals the `fusion_changes_total` metric exports, by its `change` label."""
        return {
            "reclassified": self.reclassified,
            "removed": self.removed,
            "rejected": self.rejected,
            "created": self.created,
            "late": self.late,
        }


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
        if not _overlapping(cloud.xyxy[i : i + 1], cloud.xyxy[chosen], s.duplicate_iou)[0]:
            chosen.append(i)
    return sorted(chosen)


def _seen(
    boxes: npt.NDArray[np.float64], cloud: Detections, s: FusionSettings
) -> npt.NDArray[np.bool_]:
    """Per track box: whether the cloud returned any box there, whatever its class or score
    (IoU >= `min_iou`), or one covering at least `hidden_coverage` of it (an object half hidden
    behind another is boxed with it, not on its own)."""
    seen = _overlapping(boxes, cloud.xyxy, s.min_iou)
    if s.hidden_coverage > 0.0 and len(boxes) and len(cloud):
        covered = coverage(boxes.astype(np.float32), cloud.xyxy.astype(np.float32))
        seen |= covered.max(axis=1) >= s.hidden_coverage
    return seen


def _overlapping(
    boxes: npt.NDArray[np.floating[Any]], others: npt.NDArray[np.floating[Any]], min_iou: float
) -> npt.NDArray[np.bool_]:
    """Per box (xyxy rows): whether any of `others` overlaps it with IoU >= `min_iou`."""
    if not len(boxes) or not len(others):
        return np.zeros(len(boxes), dtype=bool)
    overlap = 1.0 - iou_cost(boxes, others)
    return np.asarray(overlap.max(axis=1) >= min_iou, dtype=bool)


def fuse_answer(
    tracker: FusedTracker,
    frame_index: int,
    cloud: Detections,
    *,
    regions: Sequence[Box] = (),
    settings: FusionSettings | None = None,
    trust: CloudTrust | None = None,
) -> FusionResult:
    """Fold the cloud's detections of tracker frame `frame_index` into `tracker` (in place).

    `cloud` boxes are in source pixels; `regions` (source pixels) limits what the cloud looked
    at, empty for a whole frame. `trust` is the camera's running `CloudTrust`, updated here;
    None trusts every answer. Returns what changed.
    """
    s = settings if settings is not None else FusionSettings()
    lag = tracker.frame_index - frame_index
    # past the tracks' history the answer cannot be matched against them as they were: every
    # box in it would look new and start a second track on an object already tracked
    if lag < 0 or lag > s.horizon_frames or lag >= tracker.history_size:
        return FusionResult(dropped_late=True)
    cloud = s.edge_classes(cloud)
    then: list[tuple[CloudTrack, npt.NDArray[np.float64]]] = []
    for track in tracker.cloud_tracks:
        box = None if track.is_deleted else track.box_at(frame_index, s.history_tolerance_frames)
        if box is not None and (not regions or _inside(_centre(box), regions)):
            then.append((track, box))
    boxes_then = np.stack([box for _, box in then]) if then else np.zeros((0, 4))
    seen = _seen(boxes_then, cloud, s)
    trusted = _observe_trust(trust, then, seen, s)
    rows = _trusted_rows(cloud, regions, s)

    matches: list[tuple[int, int]] = []
    unmatched_tracks = list(range(len(then)))
    unmatched_cloud = rows
    cost = np.zeros((len(then), len(rows)))
    if then and rows:
        cost = iou_cost(boxes_then, cloud.xyxy[rows])
        assignment = _match(tracker, then, cloud.class_id[rows], cost, 1.0 - s.min_iou)
        matches = list(assignment.matches)  # (index into then, index into rows)
        unmatched_tracks = assignment.unmatched_tracks
        unmatched_cloud = [rows[c] for c in assignment.unmatched_detections]

    reclassified = confirmed = 0
    for t, r in matches:
        track, box_then = then[t]
        c = rows[r]
        if track.is_tentative:
            track.confirm()
            confirmed += 1
        if 1.0 - float(cost[t, r]) >= s.confirm_iou:
            score = float(cloud.confidence[c])
            if trusted and s.cloud_sighting:
                track.seen_at(lag)
            if trusted and s.relabel:
                before = track.class_id
                track.cloud.vote(int(cloud.class_id[c]), score, s.terms())
                reclassified += int(track.class_id != before)
            else:
                track.cloud.confirmed(score, s.terms(held=trusted))
        if trusted and s.fit_gain > 0.0 and s.fit_frames > 0:
            track.cloud.fit(cloud.xyxy[c], box_then, s.fit_frames, s.fit_gain)
        offset = xyxy_to_xyah(cloud.xyxy[c]) - xyxy_to_xyah(box_then)
        track.mean[:4] = track.mean[:4] + s.box_correction_gain * offset

    unseen = [t for t in unmatched_tracks if not seen[t]]
    if s.reject_duplicates and matches:
        unseen += _duplicates(boxes_then, cloud, rows, matches, unmatched_tracks, s)
    removed, rejected = _reject_unseen([then[t][0] for t in unseen if trusted], s)
    tracker.tracks = [t for t in tracker.tracks if not t.is_deleted]
    undecided = trust is not None and trust.checked < s.trust_min_checks
    matched_ids = {then[t][0].track_id for t, _ in matches}
    created = (
        _create_tracks(
            tracker,
            frame_index,
            cloud,
            unmatched_cloud,
            s,
            _where_then(
                [t for t in tracker.cloud_tracks if t.track_id not in matched_ids], frame_index, s
            ),
        )
        if trusted or undecided
        else 0
    )
    return FusionResult(
        len(matches),
        reclassified,
        confirmed,
        removed,
        created,
        False,
        rejected,
        trusted,
        _unexplained(tracker, cloud, boxes_then, regions),
        tuple(track.track_id for (track, _), saw in zip(then, seen, strict=True) if saw),
    )


def _match(
    tracker: FusedTracker,
    then: Sequence[tuple[CloudTrack, npt.NDArray[np.float64]]],
    cloud_classes: npt.NDArray[np.int64],
    cost: npt.NDArray[np.float64],
    max_cost: float,
) -> Assignment:
    """Cloud boxes to the tracks as they were (indices into `then` and the rows of `cost`):
    first each to a track of its class or class group (`tracker.class_keys`), then what is
    left over whatever the class. A rider's person track takes the cloud's person box and the
    bicycle box stays unmatched (a new track, not a relabel); a track the edge gave the wrong
    class still meets the cloud's box of the right one (a relabel)."""
    tracks, boxes = list(range(len(then))), list(range(cost.shape[1]))
    if tracker.class_keys is None:
        return linear_assignment(cost, max_cost, tracks, boxes)
    same = tracker.class_keys.same_kind([track.class_id for track, _ in then], cloud_classes)
    first = linear_assignment(np.where(same, cost, INFEASIBLE_COST), max_cost, tracks, boxes)
    left_tracks, left_boxes = first.unmatched_tracks, first.unmatched_detections
    rest = linear_assignment(
        cost[np.ix_(left_tracks, left_boxes)], max_cost, left_tracks, left_boxes
    )
    return Assignment(
        first.matches + rest.matches, rest.unmatched_tracks, rest.unmatched_detections
    )


def _unexplained(
    tracker: FusedTracker,
    cloud: Detections,
    boxes_then: npt.NDArray[np.float64],
    regions: Sequence[Box],
) -> tuple[CloudHint, ...]:
    """The cloud's boxes (any score it sent) that no track explains: inside what it looked at,
    overlapping no track's box at the answer's frame (IoU >= `HINT_IOU`) and none now (one
    created from it included); the most confident of overlapping ones."""
    keep = np.ones(len(cloud), dtype=bool)
    if regions:
        keep &= np.array([_inside(_centre(b), regions) for b in cloud.xyxy], dtype=bool)
    keep &= ~_overlapping(cloud.xyxy, boxes_then, HINT_IOU)
    if tracker.tracks and keep.any():
        present = np.stack([t.to_xyxy() for t in tracker.tracks])
        keep &= ~_overlapping(cloud.xyxy, present, HINT_IOU)
    out: list[CloudHint] = []
    for c in sorted(np.flatnonzero(keep).tolist(), key=lambda i: -float(cloud.confidence[i])):
        x1, y1, x2, y2 = (float(v) for v in cloud.xyxy[c])
        box = (x1, y1, x2, y2)
        if any(iou(box, h.box) >= HINT_IOU for h in out):
            continue
        out.append(CloudHint(box, float(cloud.confidence[c]), int(cloud.class_id[c])))
    return tuple(out)


HINT_IOU = 0.1
"""A cloud box overlapping a track this much is that track's business, not a hint."""


def _observe_trust(
    trust: CloudTrust | None,
    then: Sequence[tuple[CloudTrack, npt.NDArray[np.float64]]],
    seen: npt.NDArray[np.bool_],
    s: FusionSettings,
) -> bool:
    """Count this answer's checks into `trust`; whether the cloud is trusted now."""
    if trust is None:
        return True
    for (track, _), was_seen in zip(then, seen, strict=True):
        if track.is_confirmed and track.best_score >= s.trust_edge_score:
            trust.checked += 1
            trust.seen += int(was_seen)
    return trust.trusted(s)


def _duplicates(
    boxes_then: npt.NDArray[np.float64],
    cloud: Detections,
    rows: Sequence[int],
    matches: Sequence[tuple[int, int]],
    unmatched_tracks: Sequence[int],
    s: FusionSettings,
) -> list[int]:
    """The unmatched tracks (indices into `boxes_then`) that the cloud "saw" only through
    boxes it matched to other tracks: a second box the edge put on one object (a truck split
    in two, a person boxed twice). The cloud returned one box there, and another track has it."""
    if not unmatched_tracks:
        return []
    taken = {rows[r]: t for t, r in matches}
    overlap = 1.0 - iou_cost(boxes_then[list(unmatched_tracks)], cloud.xyxy)
    out = []
    for t, row in zip(unmatched_tracks, overlap, strict=True):
        near = {int(c) for c in np.flatnonzero(row >= s.min_iou)}
        if not near or not near <= set(taken):
            continue  # unseen (rejected as such), or a cloud box of its own
        owners = boxes_then[[taken[c] for c in near]].astype(np.float32)
        if box_overlap(boxes_then[t].astype(np.float32), owners, "ios").max() >= DUPLICATE_INSIDE:
            out.append(t)
    return out


DUPLICATE_INSIDE = 0.9
"""A track is a duplicate of the one holding the cloud's box when this share of the smaller of
their boxes lies in both. Measured (bench.hybrid.hybrid_tradeoff): 0.7 also removed real objects
standing close together (events:2 0.879 -> 0.852); 0.9 kept them."""


def _reject_unseen(unseen: Sequence[CloudTrack], s: FusionSettings) -> tuple[int, tuple[int, ...]]:
    """Remove the tentative tracks the cloud saw nothing of, reject weak confirmed ones;
    returns (removed, ids of the newly rejected)."""
    removed = 0
    rejected: list[int] = []
    for track in unseen:
        if track.is_tentative and s.remove_tentative:
            track.delete()
            removed += 1
        elif (
            track.is_confirmed
            and not track.cloud.rejected
            and track.best_score < s.reject_below_edge_score
        ):
            track.cloud.reject()
            rejected.append(track.track_id)
    return removed, tuple(rejected)


def _where_then(
    tracks: Sequence[CloudTrack], frame_index: int, s: FusionSettings
) -> list[tuple[npt.NDArray[np.float64], int]]:
    """(box, class id) of `tracks` on `frame_index`, as best known (`Track.box_then`)."""
    out = []
    for track in tracks:
        box = None if track.is_deleted else track.box_then(frame_index, s.history_tolerance_frames)
        if box is not None:
            out.append((box, track.class_id))
    return out


def _create_tracks(
    tracker: FusedTracker,
    frame_index: int,
    cloud: Detections,
    unmatched: Sequence[int],
    s: FusionSettings,
    unmatched_then: Sequence[tuple[npt.NDArray[np.float64], int]] = (),
) -> int:
    """Start confirmed tracks for the confident cloud boxes no track explains; how many.

    `unmatched_then`: (box, class id) of the tracks no cloud box matched, where they were on
    the answer's frame as best known (`Track.box_then`: interpolated between the edge's boxes
    around it, or where the motion model had a track the edge missed). The match itself goes
    on the boxes the edge measured (the cloud is not judged on an estimate), but a cloud box
    overlapping one of these (IoU >= `min_iou`, its kind) is that track's object, not a new
    one. Traced on `scripts/demo` on a loaded box: a car the edge lost for a few frames, and
    a person the edge missed on the answer's frame (its nearest box, a frame off, 20 px
    behind), each got a second, confirmed track."""
    created = 0
    present = [(t.to_xyxy(), t.class_id) for t in tracker.tracks]
    if s.new_track_min_score >= 1.0:  # off (a cloud answering exactly 1.0 starts nothing)
        return 0
    keys = tracker.class_keys

    def kin_of(boxes: Sequence[tuple[npt.NDArray[np.float64], int]], c: int) -> list[Any]:
        same = [keys is None or keys.key(k) == keys.key(cloud.class_id[c]) for _, k in boxes]
        return [box for (box, _), kin in zip(boxes, same, strict=True) if kin]

    for c in unmatched:
        if float(cloud.confidence[c]) < max(s.new_track_min_score, s.min_cloud_score):
            continue
        # a track of its kind already covers it now (it moved since that frame); a rider's
        # person box is not covered by the bicycle's track
        kin = kin_of(present, c)
        if kin and _overlapping(cloud.xyxy[c : c + 1], np.stack(kin), s.covered_iou)[0]:
            continue
        was_there = kin_of(unmatched_then, c)
        if was_there and _overlapping(cloud.xyxy[c : c + 1], np.stack(was_there), s.min_iou)[0]:
            continue
        track = tracker.spawn_track(cloud.xyxy[c], int(cloud.class_id[c]), frame_index)
        track.state = TrackState.CONFIRMED
        track.cloud.vote(int(cloud.class_id[c]), float(cloud.confidence[c]), s.terms())
        present.append((track.to_xyxy(), track.class_id))
        created += 1
    return created
