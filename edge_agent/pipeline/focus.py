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
from typing import Protocol

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
from edge_agent.tracking.fusion import CloudHint
from edge_agent.tracking.track import Track

FloatArray = npt.NDArray[np.float32]
CUT_MARGIN_PX = SlicingConfig().cut_margin_px  # a crop's cut boxes, as sliced inference's


@dataclass(frozen=True)
class FocusPlan:
    """The crops to look at on one frame and the boxes of the tracks they follow."""

    tiles: list[Tile]
    followed: FloatArray  # (n, 4) xyxy, frame pixels: the followed tracks' last boxes


def plan_focus(
    tracks: Sequence[Track],
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

    A track the whole frame still sees gets no crop: following those too mixed crop and frame
    boxes of one object and split it into two tracks (bench.hybrid_tradeoff: IDF1 on `quiet`
    0.76 instead of 0.87).
    """
    width, height = frame_size
    candidates: list[tuple[float, FloatArray, bool]] = []  # (score, box, a followed track)
    for track in tracks:
        if not track.is_confirmed or track.cloud_rejected or track.cloud_score <= 0.0:
            continue
        if track.time_since_update == 0 and track.last_score >= seen_score:
            continue
        box = track.to_xyxy().astype(np.float32)
        w, h = float(box[2] - box[0]), float(box[3] - box[1])
        if not np.all(np.isfinite(box)) or w <= 0 or h <= 0:
            continue
        if max(w, h) <= config.max_object_px:
            candidates.append((track.cloud_score, box, True))
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
    tracks: Sequence[Track], hints: Sequence[CloudHint], max_object_px: int
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


class BatchDetector(Protocol):
    """What runs the edge model on a batch of images (`detection.detector.Detector`)."""

    def detect(self, images: Sequence[npt.NDArray[np.uint8]]) -> list[Detections]:
        """One `Detections` per image, boxes in that image's pixels."""
        ...


def detect_crops(
    detector: BatchDetector, planned: Sequence[tuple[str, npt.NDArray[np.uint8], Tile]]
) -> dict[str, list[tuple[Tile, Detections]]]:
    """Run `detector` once on every planned crop `(camera, frame image, tile)`; the crops'
    boxes (crop pixels) per camera, in plan order."""
    if not planned:
        return {}
    found = detector.detect([np.ascontiguousarray(tile.crop(image)) for _, image, tile in planned])
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
) -> FocusedDetections:
    """The whole frame's detections with what its focus crops (boxes in crop pixels) add.

    Only what the whole frame missed is added: a crop's box that a whole-frame box (any class,
    any score) covers by half is dropped, so an object seen in both never becomes two boxes (on
    the generated scenes, letting both into the merge cost 4 IDF1 points on `quiet`), and so is a
    box the crop's inner border cuts (a part of an object). Boxes of overlapping crops are merged
    (NMS per class). A crop's box that overlaps a followed track (IoU >= `FOLLOW_IOU`) may only
    continue a track: starting one from it split followed objects in two; a box away from them
    counts from `new_object_min_score` (upscaled crops see clutter) and may start one.
    """
    added: list[Detections] = []
    for tile, boxes in found:
        boxes = boxes[~cut_by_tile(boxes.xyxy, tile, CUT_MARGIN_PX)]
        added.append(tile_to_frame(boxes, tile, frame_shape))
    extra = Detections.concatenate(added) if added else Detections.empty()
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


FOLLOW_IOU = 0.1
EXPLAINED_IOS = 0.5
