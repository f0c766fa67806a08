"""Where the edge looks closer: crops around the small objects the cloud vouched for.

The cloud finds objects too small for the edge model at its input scale (a 10 px person in a
640 px frame is 5 px at 320). Once the cloud has vouched for such a track (confirmed it, or
started it from a box the edge missed), the edge follows it itself: `plan_focus` plans a
native-resolution crop around the track's last box, the driver runs the edge detector on the
crops (batched with the frames), and `merge_focus` adds what the crops found and the whole frame
missed before tracking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from detection.slicing import (
    SlicingConfig,
    Tile,
    box_overlap,
    cut_by_tile,
    nms_kept,
    tile_to_frame,
)
from edge_agent.config.escalation import FocusConfig
from edge_agent.pipeline.mosaic import InputSizedDetector, detect_packed
from edge_agent.tracking.cloud_evidence import CloudTrack
from edge_agent.tracking.fusion import CloudHint

FloatArray = npt.NDArray[np.float32]
CUT_MARGIN_PX = SlicingConfig().cut_margin_px  # a crop's cut boxes, as sliced inference's


@dataclass(frozen=True)
class FocusPlan:
    """The crops to look at on one frame and the boxes of the tracks they follow."""

    tiles: list[Tile]
    followed: FloatArray  # (n, 4) xyxy, frame pixels: the followed tracks' last boxes


def plan_focus(
    tracks: Sequence[CloudTrack],
    frame_size: tuple[int, int],
    config: FocusConfig,
    seen_score: float,
    hints: Sequence[CloudHint] = (),
) -> FocusPlan:
    """Crops (frame pixels) around the small confirmed tracks the cloud vouched for that the
    whole frame lost (no detection on the last frame, or only one below `seen_score`, the
    tracker's threshold for starting tracks), and around the small `hints` (cloud boxes no
    track explained) that no track covers yet, the most confident first; a box inside an
    earlier crop needs none of its own. Hints are not followed tracks: what a crop finds there
    is a new object (see `merge_focus`).

    A track the whole frame still sees gets a crop only when it is at most
    `config.refine_max_px`: the crop's box then refines the frame's
    (`merge_focus`) rather than joining it, since both boxes of one object split it into two
    tracks (bench.hybrid.hybrid_tradeoff: IDF1 on `quiet` 0.76 instead of 0.87).
    """
    width, height = frame_size
    candidates: list[tuple[float, FloatArray, bool]] = []  # (score, box, a followed track)
    for track in tracks:
        if not track.is_confirmed or track.cloud.rejected or track.cloud.score <= 0.0:
            continue
        seen = track.time_since_update == 0 and track.last_score >= seen_score
        box = track.to_xyxy().astype(np.float32)
        w, h = float(box[2] - box[0]), float(box[3] - box[1])
        if not np.all(np.isfinite(box)) or w <= 0 or h <= 0:
            continue
        if max(w, h) <= (config.refine_max_px if seen else config.max_object_px):
            candidates.append((track.cloud.score, box, True))
    candidates += _open_hints(tracks, hints, config.max_object_px)
    candidates.sort(key=lambda c: -c[0])
    tiles: list[Tile] = []
    followed: list[FloatArray] = []
    for _, box, is_track in candidates:
        inside = any(_contains(tile, box) for tile in tiles)
        if not inside and len(tiles) >= config.max_crops:
            continue
        if not inside:
            tiles.append(_tile_around(box, config.crop_px, width, height))
        if is_track:
            followed.append(box)
    return FocusPlan(tiles, np.asarray(followed, dtype=np.float32).reshape(-1, 4))


def _open_hints(
    tracks: Sequence[CloudTrack], hints: Sequence[CloudHint], max_object_px: int
) -> list[tuple[float, FloatArray, bool]]:
    """The small hints no live track overlaps (IoU >= `FOLLOW_IOU`): objects still unexplained."""
    small = [
        h
        for h in hints
        if max(h.box[2] - h.box[0], h.box[3] - h.box[1]) <= max_object_px
        and h.box[2] > h.box[0]
        and h.box[3] > h.box[1]
    ]
    if not small:
        return []
    boxes = np.asarray([h.box for h in small], dtype=np.float32)
    live = [t.to_xyxy() for t in tracks if not t.is_deleted]
    covered = np.zeros(len(small), dtype=np.bool_)
    if live:
        present = np.asarray(live, dtype=np.float32)
        covered = box_overlap(boxes, present, "iou").max(axis=1) >= FOLLOW_IOU
    return [(h.score, boxes[i], False) for i, h in enumerate(small) if not covered[i]]


def _contains(tile: Tile, box: FloatArray) -> bool:
    x1, y1, x2, y2 = tile.xyxy
    return bool(box[0] >= x1 and box[1] >= y1 and box[2] <= x2 and box[3] <= y2)


def _tile_around(box: FloatArray, crop_px: int, width: int, height: int) -> Tile:
    """A square crop of at least `crop_px` (twice the box) centred on `box`, inside the frame."""
    side = max(crop_px, int(np.ceil(2.0 * max(box[2] - box[0], box[3] - box[1]))))
    crop_w, crop_h = min(side, width), min(side, height)
    cx, cy = float(box[0] + box[2]) / 2.0, float(box[1] + box[3]) / 2.0
    x0 = int(np.clip(round(cx - crop_w / 2.0), 0, width - crop_w))
    y0 = int(np.clip(round(cy - crop_h / 2.0), 0, height - crop_h))
    return Tile(
        x0,
        y0,
        crop_w,
        crop_h,
        inner_left=x0 > 0,
        inner_top=y0 > 0,
        inner_right=x0 + crop_w < width,
        inner_bottom=y0 + crop_h < height,
    )


def detect_crops(
    detector: InputSizedDetector,
    planned: Sequence[tuple[str, npt.NDArray[np.uint8], Tile]],
    per_side: int = 1,
) -> dict[str, list[tuple[Tile, Detections]]]:
    """Run `detector` on every planned crop `(camera, frame image, tile)`, `per_side` x
    `per_side` crops a run (`edge_agent.pipeline.mosaic`; 1: each crop alone); the crops' boxes
    (crop pixels) per camera, in plan order."""
    if not planned:
        return {}
    crops = [np.ascontiguousarray(tile.crop(image)) for _, image, tile in planned]
    found = detect_packed(detector, crops, per_side)
    out: dict[str, list[tuple[Tile, Detections]]] = {}
    for (camera, _, tile), boxes in zip(planned, found, strict=True):
        out.setdefault(camera, []).append((tile, boxes))
    return out


@dataclass(frozen=True)
class FocusedDetections:
    """A frame's detections with its focus crops' merged in; `may_start` flags the boxes that
    may start a track (the whole frame's, and the crops' new objects)."""

    detections: Detections
    may_start: npt.NDArray[np.bool_]


def merge_focus(
    full: Detections,
    found: Sequence[tuple[Tile, Detections]],
    frame_shape: tuple[int, int],
    followed: FloatArray,
    new_object_min_score: float,
    refine_max_px: int = 0,
) -> FocusedDetections:
    """The whole frame's detections with what its focus crops (boxes in crop pixels) add.

    A whole-frame box at most `refine_max_px` tall and wide inside a crop is refined by the
    crop's box of the same object (`_refined`). Only what the whole frame missed is added: a
    crop's box that a whole-frame box (any class, any score) covers by half is dropped, so an
    object seen in both never becomes two boxes (on the generated scenes, letting both into the
    merge cost 4 IDF1 points on `quiet`), and so is a box the crop's inner border cuts (a part
    of an object). Boxes of overlapping crops are merged
    (NMS per class). A crop's box that overlaps a followed track (IoU >= `FOLLOW_IOU`) may only
    continue a track: starting one from it split followed objects in two; a box away from them
    counts from `new_object_min_score` (upscaled crops see clutter) and may start one.
    """
    added: list[Detections] = []
    for tile, boxes in found:
        boxes = boxes[~cut_by_tile(boxes.xyxy, tile, CUT_MARGIN_PX)]
        added.append(tile_to_frame(boxes, tile, frame_shape))
    extra = Detections.concatenate(added) if added else Detections.empty()
    if refine_max_px > 0 and len(extra) and len(full):
        full = _refined(full, extra, [tile for tile, _ in found], refine_max_px)
    if len(extra) and len(full):
        extra = extra[box_overlap(extra.xyxy, full.xyxy, "ios").max(axis=1) < EXPLAINED_IOS]
    near = np.zeros(len(extra), dtype=np.bool_)
    if len(extra) and len(followed):
        near = box_overlap(extra.xyxy, followed, "iou").max(axis=1) >= FOLLOW_IOU
    new = extra.confidence >= new_object_min_score
    extra, near, new = extra[near | new], near[near | new], new[near | new]
    if len(extra) > 1:
        order = nms_kept(extra, "ios", EXPLAINED_IOS)
        extra, near, new = extra[order], near[order], new[order]
    may_start = np.concatenate([np.ones(len(full), dtype=np.bool_), new & ~near])
    return FocusedDetections(Detections.concatenate([full, extra]), may_start)


def _refined(full: Detections, crops: Detections, tiles: Sequence[Tile], max_px: int) -> Detections:
    """`full` with each small box (at most `max_px` tall and wide) that lies inside a crop
    averaged with the crop box overlapping it most (IoU >= `REFINE_IOU`, each crop box used
    once), weighted by their scores; score and class stay the whole frame's.

    The whole frame sees a small object at a few pixels of the detector's input, so its box is
    often loose (IoU < 0.5 with the object's); the crop sees it scaled up. Measured
    (bench.hybrid.hybrid_tradeoff, 10 held-out scenes): averaging beat taking the crop's box (mAP50
    0.730 vs 0.685 at 48 px: on larger objects the crop's box alone was worse), and 48 px beat
    32, 40, 64 and 96 (see `FocusConfig.refine_max_px`).
    """
    sides = np.maximum(full.xyxy[:, 2] - full.xyxy[:, 0], full.xyxy[:, 3] - full.xyxy[:, 1])
    inside = np.array([any(_contains(t, b) for t in tiles) for b in full.xyxy], dtype=np.bool_)
    rows = np.flatnonzero((sides <= max_px) & inside)
    if not len(rows):
        return full
    overlap = box_overlap(full.xyxy[rows], crops.xyxy, "iou")
    xyxy = full.xyxy.copy()
    used: set[int] = set()
    for r in np.argsort(-overlap.max(axis=1), kind="stable"):
        free = [int(c) for c in np.argsort(-overlap[r], kind="stable") if int(c) not in used]
        if not free or overlap[r, free[0]] < REFINE_IOU:
            continue
        c, row = free[0], int(rows[r])
        used.add(c)
        a, b = float(full.confidence[row]), float(crops.confidence[c])
        xyxy[row] = (a * full.xyxy[row] + b * crops.xyxy[c]) / max(a + b, 1e-9)
    return Detections(xyxy, full.confidence, full.class_id, full.tracker_id)


REFINE_IOU = 0.3
"""A crop box refines a whole-frame box it overlaps this much: loose boxes are what it fixes
(measured: 0.5 instead of 0.3 closed 34 % of the gap instead of 48 %)."""
FOLLOW_IOU = 0.1
EXPLAINED_IOS = 0.5
