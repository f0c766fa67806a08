"""Per-track verification memory: what the cloud already confirmed is not a reason to ask again.

A busy scene has many people in the edge's uncertain score band and many overlapping boxes, so
every frame scored hard (764 of 764 on the real demo clip) while the cloud agreed with 99 % of
the edge's sure tracks: the budget went on re-sending what the cloud had just confirmed. The
memory records, per camera, each track a cloud answer returned a box for (fusion's
`FusionResult.verified`) and the state it was in then: class, edge score, box area, its highest
overlap with another track. Until that state changes (class doubt, a score drop, a size jump,
someone walking in front of it) or the verification grows old, the track is *settled*: its
uncertain score and its crowding do not make a frame hard (`FrameSignals.from_frame`). Tracks
never verified, new and tentative tracks and small objects keep their signals.

A track only the cloud has seen (the edge never detected it: too small, too faint, or the
cloud's mistake) is held on the cloud's word and kept by asking again. Once an answer returned a
box for it, it is settled while it stays there (`cloud_only_still_iou`): on the busy real demo
clip the cloud took a sign post for a person, and asking about it every third frame made a
quarter of the escalations, each answer the same.

A track started on top of a settled track the edge still sees waits a frame before it is a
signal (`second_box_waits`, applied by the policy): most are a second box on one person.

Pure: frame indices come in from the caller (the camera's tracker frame index), no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from edge_agent.config.escalation import VerificationMemoryConfig
from edge_agent.escalation.roi import box_areas, box_of, iou, max_iou_with_another

Box = tuple[float, float, float, float]
PENDING_KEPT = 256  # escalated frames awaiting an answer (as the pipeline's ESCALATED_KEPT)
BOXES_KEPT = 512  # verified untracked boxes kept (the newest)
WHOLE_FRAME: Box = (-math.inf, -math.inf, math.inf, math.inf)


class VerifiableTrack(Protocol):
    """What the memory reads from a tracker's track (`edge_agent.tracking.track.Track`)."""

    @property
    def track_id(self) -> int:
        """The track's id (the `tracker_id` of its detections)."""
        ...

    @property
    def class_id(self) -> int:
        """The track's class (its class vote)."""
        ...

    @property
    def last_score(self) -> float:
        """The score of the edge detection matched to it last."""
        ...

    @property
    def time_since_update(self) -> int:
        """Frames since the last matched detection."""
        ...

    @property
    def detected(self) -> bool:
        """An edge detection was matched to it at some point (false: only the cloud saw it)."""
        ...

    def to_xyxy(self) -> npt.NDArray[Any]:
        """The current box."""
        ...


@dataclass(frozen=True, slots=True)
class _Asked:
    frame_index: int  # the tracker frame it was sent at
    boxes: tuple[Box, ...]  # the untracked edge boxes on it
    tracks: frozenset[int]  # the confirmed tracks on it


@dataclass(frozen=True, slots=True)
class VerifiedState:
    """A track as it was when the cloud last returned a box for it."""

    frame_index: int
    class_id: int
    score: float
    area: float
    overlap: float
    box: Box = (0.0, 0.0, 0.0, 0.0)


class VerificationMemory:
    """One camera's verified tracks (see the module docstring); `fps` turns `max_age_s` into
    tracker frames."""

    def __init__(self, config: VerificationMemoryConfig, fps: float) -> None:
        if not fps > 0.0:
            raise ValueError(f"fps must be > 0, got {fps}")
        self.config = config
        self._max_age_frames = config.max_age_s * fps
        self._pending_frames = config.pending_s * fps
        self._region_frames = config.region_s * fps
        # what answers looked at (a whole frame: WHOLE_FRAME), with the tracker frame fused at
        self._regions: list[tuple[int, Box]] = []
        self._verified: dict[int, VerifiedState] = {}
        # escalated capture frame -> what was on it, until its answer
        self._pending: dict[int, _Asked] = {}
        # untracked boxes the cloud looked at, with the tracker frame its answer was fused at
        self._boxes: list[tuple[int, Box]] = []

    def __len__(self) -> int:
        return len(self._verified)

    def state(self, track_id: int) -> VerifiedState | None:
        """What the memory holds for `track_id` (None: never verified, or forgotten)."""
        return self._verified.get(track_id)

    def record(
        self, tracks: Sequence[VerifiableTrack], verified: Collection[int], frame_index: int
    ) -> None:
        """The cloud returned a box for the tracks `verified` (ids) in an answer fused at
        tracker frame `frame_index`: remember each as it is now."""
        if not verified:
            return
        areas, overlaps = _areas_overlaps(tracks)
        for i, track in enumerate(tracks):
            if track.track_id in verified:
                self._verified[track.track_id] = VerifiedState(
                    frame_index=frame_index,
                    class_id=int(track.class_id),
                    score=float(track.last_score),
                    area=float(areas[i]),
                    overlap=float(overlaps[i]),
                    box=box_of(track.to_xyxy()),
                )

    def sent(
        self,
        frame_id: int,
        untracked: Sequence[Box],
        tracks: Collection[int],
        frame_index: int,
    ) -> None:
        """Capture frame `frame_id` went to the cloud at tracker frame `frame_index` with these
        untracked edge boxes (source pixels) and confirmed tracks (ids) on it: they are asked,
        and settled while the answer is on its way (`pending_s`; asking again would only ask
        the same), then verified by it (`answered`, `record`)."""
        self._pending[frame_id] = _Asked(frame_index, tuple(untracked), frozenset(tracks))
        while len(self._pending) > PENDING_KEPT:
            del self._pending[next(iter(self._pending))]

    def answered(
        self,
        frame_id: int,
        regions: Sequence[Box],
        frame_index: int,
        cloud: Sequence[Box] = (),
    ) -> None:
        """The answer for capture frame `frame_id` (looking at `regions`, empty: the whole
        frame; `cloud`: its boxes) was fused at tracker frame `frame_index`: the untracked boxes
        the edge had on it inside what the cloud looked at are verified (whatever it found
        there: a box the edge cannot track, or one the cloud has nothing for, gets the same
        answer again), and so are the places the cloud returned a box for."""
        asked = self._pending.pop(frame_id, None)
        looked_at = [(frame_index, r) for r in regions] if regions else [(frame_index, WHOLE_FRAME)]
        near = frame_index - self._region_frames
        self._regions = [(f, r) for f, r in self._regions if f >= near] + looked_at
        del self._regions[:-BOXES_KEPT]
        horizon = frame_index - self._max_age_frames
        self._boxes = [(f, b) for f, b in self._boxes if f >= horizon]
        if asked is not None:
            looked = [b for b in asked.boxes if not regions or _centre_inside(b, regions)]
            self._boxes += [(frame_index, b) for b in (*looked, *cloud)]
            del self._boxes[:-BOXES_KEPT]

    def _asked(self, frame_index: int) -> list[_Asked]:
        """Requests still awaiting their answer within `pending_s`."""
        horizon = frame_index - self._pending_frames
        return [a for a in self._pending.values() if a.frame_index >= horizon]

    def settled_boxes(self, frame_index: int) -> tuple[Box, ...]:
        """Untracked boxes the cloud looked at within `max_age_s` of tracker frame
        `frame_index`, or was asked about and has not answered yet: an untracked box
        overlapping one (`box_iou`) is settled."""
        if not self.config.enabled:
            return ()
        horizon = frame_index - self._max_age_frames
        boxes = [b for f, b in self._boxes if f >= horizon]
        return tuple(boxes + [b for a in self._asked(frame_index) for b in a.boxes])

    def verified_regions(self, frame_index: int) -> tuple[Box, ...]:
        """What answers fused within `region_s` of tracker frame `frame_index` looked at
        (`WHOLE_FRAME` for a whole frame): an untracked box there is no longer news to the
        cloud, whether it found something there (then a track or a box of the memory has it)
        or nothing."""
        if not self.config.enabled:
            return ()
        near = frame_index - self._region_frames
        return tuple(r for f, r in self._regions if f >= near)

    def asked(self, frame_index: int) -> frozenset[int]:
        """Ids of the tracks on frames sent and not answered yet (within `pending_s`)."""
        if not self.config.enabled:
            return frozenset()
        return frozenset(i for a in self._asked(frame_index) for i in a.tracks)

    def settled(self, tracks: Sequence[VerifiableTrack], frame_index: int) -> frozenset[int]:
        """Ids of the tracks whose verification still holds at tracker frame `frame_index`, or
        that were asked about and not answered yet; forgets tracks that are gone."""
        if not self._verified and not self._pending:
            return frozenset()
        live = {t.track_id for t in tracks}
        if any(k not in live for k in self._verified):
            self._verified = {k: v for k, v in self._verified.items() if k in live}
        if not self.config.enabled:
            return frozenset()
        areas, overlaps = _areas_overlaps(tracks)
        settled = list(self.asked(frame_index))
        for i, track in enumerate(tracks):
            state = self._verified.get(track.track_id)
            if state is not None and self._holds(
                state, track, float(areas[i]), float(overlaps[i]), frame_index
            ):
                settled.append(track.track_id)
        return frozenset(settled)

    def _holds(
        self,
        state: VerifiedState,
        track: VerifiableTrack,
        area: float,
        overlap: float,
        frame_index: int,
    ) -> bool:
        config = self.config
        if frame_index - state.frame_index > self._max_age_frames:
            return False  # a long time since the cloud looked
        if int(track.class_id) != state.class_id:
            return False  # class doubt
        if not track.detected:  # only the cloud sees it: settled while it stays where it was
            still = config.cloud_only_still_iou
            return still is not None and iou(box_of(track.to_xyxy()), state.box) >= still
        if track.time_since_update > 0:
            return True  # no edge box to compare: a prediction's size and overlap say nothing
        if track.last_score < state.score - config.score_drop:
            return False  # the edge is less sure of it than when the cloud confirmed it
        jump = 1.0 + config.size_change
        if state.area > 0.0 and not state.area / jump <= area <= state.area * jump:
            return False  # nearer, farther, or the box took in a neighbour
        return overlap <= state.overlap + config.overlap_rise  # someone walked in front

    def forget(self) -> None:
        """Drop everything (camera restarted, tracker reset)."""
        self._verified.clear()
        self._pending.clear()
        self._boxes.clear()
        self._regions.clear()


def _centre_inside(box: Box, regions: Sequence[Box]) -> bool:
    x, y = (box[0] + box[2]) / 2.0, (box[1] + box[3]) / 2.0
    return any(x1 <= x <= x2 and y1 <= y <= y2 for x1, y1, x2, y2 in regions)


def _areas_overlaps(
    tracks: Sequence[VerifiableTrack],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per track: its box area and its highest IoU with another track's box."""
    if not tracks:
        return np.zeros(0), np.zeros(0)
    xyxy = np.stack([np.asarray(t.to_xyxy(), dtype=np.float64).reshape(4) for t in tracks])
    return box_areas(xyxy), max_iou_with_another(xyxy)
