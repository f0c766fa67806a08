"""Sliced inference (the SAHI idea): a whole-frame pass plus native-scale tiles, merged.

A model input of 416 px shrinks a 768x576 frame by 0.54, and people far from the camera shrink
below what the model can find. `SlicedDetector` runs each whole frame once, letterboxed to the
model input as usual, and also cuts it into overlapping tiles of exactly the model input size
that run at native resolution (scale 1, no resize). Tiles exist only along the axes where the
frame is larger than a tile; the first and last tiles are flush with the frame edges and the
others spread evenly between them, so no tile is padded where the frame goes on and every
overlap is at least the configured one.

All images of a batch (whole frames and their tiles) go to the wrapped detector in one `detect`
call, which runs them in as few runtime calls as the runtime's batch limit allows. Tile boxes are
moved back to frame pixels, then merged per frame:

1. a tile box touching a tile border that is not a frame border is *cut*: the object goes on
   beyond the tile. It is dropped when a whole (uncut) box of its class, from another tile or the
   whole-frame pass, covers at least `cut_covered_ios_ratio` of it;
2. what is left is merged per class, by greedy non-max merging (the best box grows to the
   union of the boxes it absorbs; the default) or NMS (keep the best box), with IoS
   (intersection over the smaller box; the default) or IoU as the overlap. On vtest frames with
   verified persons (`bench/cloud/cloud_slicing.py`) merging by IoS kept the same persons as by IoU
   with fewer false boxes (duplicates and pieces); greedy merging lost fewer persons than NMS.

Images run with `scale_up=False` (region crops, already at native scale) are never sliced.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt
from pydantic import Field

from configkit.base import StrictModel
from detection.detections import Detections
from detection.errors import DetectionError
from detection.letterbox import scale_up_flags

logger = logging.getLogger(__name__)

MergeMethod = Literal["nms", "nmm"]
OverlapMetric = Literal["iou", "ios"]
FloatArray = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]
Image = npt.NDArray[np.uint8]


class SlicingConfig(StrictModel):
    """Sliced inference: tiles at native resolution on top of the whole-frame pass."""

    enabled: bool = Field(
        default=False, description="Run whole frames as native-scale tiles too (off: one pass)."
    )
    tile_overlap_ratio: float = Field(
        default=0.2,
        ge=0.0,
        le=0.75,
        description="Least overlap of neighbouring tiles, as a fraction of the tile side.",
    )
    full_frame_pass: bool = Field(
        default=True,
        description="Also run the whole frame letterboxed (finds objects larger than a tile).",
    )
    merge_method: MergeMethod = Field(
        default="nmm",
        description=(
            "How overlapping boxes of one class are merged: `nms` keeps the most confident box, "
            "`nmm` (greedy non-max merging) grows it to the union of the boxes it absorbs."
        ),
    )
    merge_metric: OverlapMetric = Field(
        default="ios",
        description="Overlap used by the merge: `iou`, or `ios` (intersection over smaller box).",
    )
    merge_threshold_ratio: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Boxes of one class overlapping above this (merge_metric, 0..1) are merged.",
    )
    drop_cut_boxes: bool = Field(
        default=True,
        description="Drop tile boxes cut by an inner tile border that a whole box covers.",
    )
    cut_margin_px: int = Field(
        default=2,
        ge=0,
        le=64,
        description="A tile box within this many pixels of an inner tile border counts as cut.",
    )
    cut_covered_ios_ratio: float = Field(
        default=0.6,
        ge=0.0,
        le=1.0,
        description=(
            "A cut box is dropped when a whole box of its class covers at least this fraction "
            "of its area (0..1); 1.0 drops only cut boxes lying entirely inside a whole one."
        ),
    )
    max_tiles_per_frame: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Frames needing more tiles than this run whole-frame only (logged).",
    )
    max_detections_per_frame: int = Field(
        default=300, ge=1, le=10_000, description="Most detections kept per frame after merging."
    )


class TileableDetector(Protocol):
    """What `SlicedDetector` wraps: a `detection.Detector` (its input size and `detect`)."""

    @property
    def input_shape(self) -> tuple[int, int]:
        """Model input (height, width): the tile size."""
        ...

    def detect(
        self, images: Sequence[Image], *, scale_up: bool | Sequence[bool] = True
    ) -> list[Detections]:
        """One `Detections` per image, boxes in that image's pixels."""
        ...


@dataclass(frozen=True)
class Tile:
    """A window of a frame: top-left `(x0, y0)`, size, and which of its sides lie inside the frame.

    A side inside the frame (`inner_*`) cuts the objects it crosses; a side on the frame border
    does not.
    """

    x0: int
    y0: int
    width: int
    height: int
    inner_left: bool
    inner_top: bool
    inner_right: bool
    inner_bottom: bool

    @property
    def xyxy(self) -> tuple[int, int, int, int]:
        """The window in frame pixels."""
        return self.x0, self.y0, self.x0 + self.width, self.y0 + self.height

    def crop(self, image: Image) -> Image:
        """The tile's pixels of `image` (a view)."""
        x1, y1, x2, y2 = self.xyxy
        return image[y1:y2, x1:x2]


def axis_starts(length: int, tile: int, overlap_ratio: float) -> list[int]:
    """Tile starts along one axis of `length` px: `[0]` when one tile covers it.

    The fewest tiles whose neighbours overlap by at least `overlap_ratio * tile`; the first
    starts at 0, the last ends at `length` and the rest are spread evenly between them.
    """
    if length <= 0 or tile <= 0:
        raise DetectionError(f"length and tile must be positive, got {length}, {tile}")
    if not 0.0 <= overlap_ratio < 1.0:
        raise DetectionError(f"overlap_ratio must be in [0, 1), got {overlap_ratio}")
    if length <= tile:
        return [0]
    stride = max(1, tile - round(tile * overlap_ratio))
    count = -(-(length - tile) // stride) + 1
    span = length - tile
    return [round(i * span / (count - 1)) for i in range(count)]


def plan_tiles(
    frame_shape: tuple[int, int], tile_shape: tuple[int, int], overlap_ratio: float
) -> list[Tile]:
    """Tiles of a `frame_shape` (h, w) frame; none when the frame fits in one `tile_shape` (h, w).

    Along an axis where the frame is no larger than a tile, tiles span the whole frame (and are
    smaller than the model input there); tiles never extend past the frame.
    """
    frame_h, frame_w = frame_shape
    tile_h, tile_w = tile_shape
    if frame_h <= tile_h and frame_w <= tile_w:
        return []
    ys = axis_starts(frame_h, tile_h, overlap_ratio)
    xs = axis_starts(frame_w, tile_w, overlap_ratio)
    height, width = min(frame_h, tile_h), min(frame_w, tile_w)
    return [
        Tile(
            x0=x,
            y0=y,
            width=width,
            height=height,
            inner_left=x > 0,
            inner_top=y > 0,
            inner_right=x + width < frame_w,
            inner_bottom=y + height < frame_h,
        )
        for y in ys
        for x in xs
    ]


def cut_by_tile(xyxy: FloatArray, tile: Tile, margin_px: float) -> BoolArray:
    """Which boxes (tile pixels) touch an inner border of `tile`, within `margin_px`."""
    boxes = np.asarray(xyxy, dtype=np.float32).reshape(-1, 4)
    cut = np.zeros(boxes.shape[0], dtype=np.bool_)
    if tile.inner_left:
        cut |= boxes[:, 0] <= margin_px
    if tile.inner_top:
        cut |= boxes[:, 1] <= margin_px
    if tile.inner_right:
        cut |= boxes[:, 2] >= tile.width - margin_px
    if tile.inner_bottom:
        cut |= boxes[:, 3] >= tile.height - margin_px
    return cut


def tile_to_frame(found: Detections, tile: Tile, frame_shape: tuple[int, int]) -> Detections:
    """Boxes found in a tile, moved to frame pixels and clipped to the frame."""
    if len(found) == 0:
        return found
    xyxy = found.xyxy + np.array([tile.x0, tile.y0, tile.x0, tile.y0], dtype=np.float32)
    frame_h, frame_w = frame_shape
    xyxy[:, [0, 2]] = xyxy[:, [0, 2]].clip(0, frame_w)
    xyxy[:, [1, 3]] = xyxy[:, [1, 3]].clip(0, frame_h)
    return Detections(xyxy=xyxy, confidence=found.confidence, class_id=found.class_id)


def box_overlap(a: FloatArray, b: FloatArray, metric: OverlapMetric) -> FloatArray:
    """Pairwise overlap `(n, m)` of xyxy boxes: IoU, or IoS (intersection over the smaller)."""
    a = np.asarray(a, dtype=np.float32).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float32).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area_a = np.prod(a[:, 2:] - a[:, :2], axis=1)[:, None]
    area_b = np.prod(b[:, 2:] - b[:, :2], axis=1)[None, :]
    if metric == "iou":
        denominator = area_a + area_b - inter
    elif metric == "ios":
        denominator = np.minimum(area_a, area_b)
    else:
        raise DetectionError(f"unknown overlap metric {metric!r}")
    out = np.where(denominator > 0, inter / np.maximum(denominator, 1e-12), 0.0)
    return np.asarray(out, dtype=np.float32)


def coverage(a: FloatArray, b: FloatArray) -> FloatArray:
    """`(n, m)`: the fraction of each box of `a` that lies inside each box of `b`."""
    a = np.asarray(a, dtype=np.float32).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float32).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area_a = np.prod(a[:, 2:] - a[:, :2], axis=1)[:, None]
    out = np.where(area_a > 0, inter / np.maximum(area_a, 1e-12), 0.0)
    return np.asarray(out, dtype=np.float32)


def drop_covered_cut_boxes(found: Detections, cut: BoolArray, min_coverage: float) -> Detections:
    """Drop cut boxes that a whole box of the same class covers by at least `min_coverage`.

    A cut box with no such whole box (an object cut in every tile that saw it, and missed by the
    whole-frame pass) stays, for the merge to handle.
    """
    cut = np.asarray(cut, dtype=np.bool_).reshape(-1)
    if cut.shape[0] != len(found):
        raise DetectionError(f"{cut.shape[0]} cut flags for {len(found)} boxes")
    if not cut.any() or cut.all():
        return found
    cut_index = np.flatnonzero(cut)
    whole_index = np.flatnonzero(~cut)
    covered = coverage(found.xyxy[cut_index], found.xyxy[whole_index]) >= min_coverage
    covered &= found.class_id[cut_index][:, None] == found.class_id[whole_index][None, :]
    keep = np.ones(len(found), dtype=np.bool_)
    keep[cut_index[covered.any(axis=1)]] = False
    return found[keep]


def _merge_one_class(
    xyxy: FloatArray,
    confidence: FloatArray,
    method: MergeMethod,
    metric: OverlapMetric,
    threshold: float,
) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """Merged boxes of one class and, for each, the index of the box it grew from."""
    order = np.argsort(-confidence, kind="stable")
    overlap = box_overlap(xyxy, xyxy, metric)
    taken = np.zeros(len(order), dtype=np.bool_)
    boxes: list[FloatArray] = []
    kept: list[int] = []
    for i in order:
        if taken[i]:
            continue
        absorbed = ~taken & (overlap[i] > threshold)
        absorbed[i] = True
        taken |= absorbed
        kept.append(int(i))
        if method == "nmm":
            group = xyxy[absorbed]
            boxes.append(np.concatenate([group[:, :2].min(axis=0), group[:, 2:].max(axis=0)]))
        else:
            boxes.append(xyxy[i])
    return np.asarray(boxes, dtype=np.float32).reshape(-1, 4), np.asarray(kept, dtype=np.int64)


def nms_kept(found: Detections, metric: OverlapMetric, threshold: float) -> npt.NDArray[np.int64]:
    """Indices (ascending) of the boxes a greedy per-class NMS keeps: most confident first, a
    box overlapping a kept one of its class above `threshold` (`metric`) is suppressed."""
    keep: list[int] = []
    for class_id in np.unique(found.class_id):
        members = np.flatnonzero(found.class_id == class_id)
        _, kept = _merge_one_class(
            found.xyxy[members], found.confidence[members], "nms", metric, threshold
        )
        keep.extend(int(i) for i in members[kept])
    return np.asarray(sorted(keep), dtype=np.int64)


def merge_detections(
    found: Detections, method: MergeMethod, metric: OverlapMetric, threshold: float
) -> Detections:
    """Greedy per-class merge, most confident first: boxes overlapping a kept box above
    `threshold` are suppressed (`nms`) or absorbed into it, the kept box growing to their union
    (`nmm`); a kept box keeps its own confidence. Sorted by confidence, highest first."""
    if method not in ("nms", "nmm"):
        raise DetectionError(f"unknown merge method {method!r}")
    if not 0.0 <= threshold <= 1.0:
        raise DetectionError(f"threshold must be in [0, 1], got {threshold}")
    if len(found) == 0:
        return found
    parts: list[Detections] = []
    for class_id in np.unique(found.class_id):
        members = np.flatnonzero(found.class_id == class_id)
        xyxy, kept = _merge_one_class(
            found.xyxy[members], found.confidence[members], method, metric, threshold
        )
        parts.append(
            Detections(
                xyxy=xyxy,
                confidence=found.confidence[members][kept],
                class_id=found.class_id[members][kept],
            )
        )
    merged = Detections.concatenate(parts)
    return merged[np.argsort(-merged.confidence, kind="stable")]


def merge_frame(
    full: Detections | None,
    tiles: Sequence[tuple[Tile, Detections]],
    frame_shape: tuple[int, int],
    config: SlicingConfig,
) -> Detections:
    """One frame's detections from its whole-frame pass (frame pixels) and its tiles' (tile
    pixels): tile boxes moved to the frame, covered cut boxes dropped, the rest merged."""
    parts: list[Detections] = [] if full is None else [full]
    cut_flags: list[BoolArray] = [] if full is None else [np.zeros(len(full), dtype=np.bool_)]
    for tile, found in tiles:
        parts.append(tile_to_frame(found, tile, frame_shape))
        cut_flags.append(cut_by_tile(found.xyxy, tile, config.cut_margin_px))
    if not parts:
        return Detections.empty()
    candidates = Detections.concatenate(parts)
    if config.drop_cut_boxes:
        cut = np.concatenate(cut_flags)
        candidates = drop_covered_cut_boxes(candidates, cut, config.cut_covered_ios_ratio)
    merged = merge_detections(
        candidates, config.merge_method, config.merge_metric, config.merge_threshold_ratio
    )
    return merged[: config.max_detections_per_frame]


class SlicedDetector:
    """A detector that also runs whole frames as native-scale tiles; same `detect` contract.

    `detect(images, scale_up=...)` returns one `Detections` per image, boxes in its pixels.
    Images with `scale_up` True (whole frames) larger than the model input in either side are
    sliced; images with `scale_up` False (region crops) and frames that fit in one tile run as
    the wrapped detector runs them. Everything goes to the wrapped detector in one call.
    """

    def __init__(self, detector: TileableDetector, config: SlicingConfig) -> None:
        self._detector = detector
        self._config = config
        self._warned_shapes: set[tuple[int, int]] = set()
        logger.info(
            "sliced inference: tiles %s, overlap >= %.0f%%, whole-frame pass %s, merge %s/%s > %s",
            detector.input_shape,
            100 * config.tile_overlap_ratio,
            "on" if config.full_frame_pass else "off",
            config.merge_method,
            config.merge_metric,
            config.merge_threshold_ratio,
        )

    @property
    def input_shape(self) -> tuple[int, int]:
        """Model input (height, width), also the tile size."""
        return self._detector.input_shape

    @property
    def config(self) -> SlicingConfig:
        """The slicing config."""
        return self._config

    @property
    def detector(self) -> TileableDetector:
        """The wrapped detector."""
        return self._detector

    def plan(self, frame_shape: tuple[int, int]) -> list[Tile]:
        """The tiles a whole frame of `frame_shape` (h, w) runs as; empty: not sliced."""
        tiles = plan_tiles(frame_shape, self.input_shape, self._config.tile_overlap_ratio)
        if len(tiles) > self._config.max_tiles_per_frame:
            if frame_shape not in self._warned_shapes:
                self._warned_shapes.add(frame_shape)
                logger.warning(
                    "a %sx%s frame needs %s tiles, above max_tiles_per_frame (%s): "
                    "frames of this size run whole-frame only",
                    frame_shape[1],
                    frame_shape[0],
                    len(tiles),
                    self._config.max_tiles_per_frame,
                )
            return []
        return tiles

    def detect(
        self, images: Sequence[Image], *, scale_up: bool | Sequence[bool] = True
    ) -> list[Detections]:
        """Detections per image in its own pixels; whole frames sliced (see the class doc)."""
        if len(images) == 0:
            return []
        flags = scale_up_flags(scale_up, len(images))
        if not self._config.enabled:
            return self._detector.detect(images, scale_up=flags)
        batch: list[Image] = []
        batch_flags: list[bool] = []
        # per image: index of its whole-frame result (or None) and its tiles' (tile, index)
        layout: list[tuple[int | None, list[tuple[Tile, int]]]] = []
        for image, flag in zip(images, flags, strict=True):
            tiles = self.plan((int(image.shape[0]), int(image.shape[1]))) if flag else []
            full_index: int | None = None
            if not tiles or self._config.full_frame_pass:
                full_index = len(batch)
                batch.append(image)
                batch_flags.append(flag)
            placed: list[tuple[Tile, int]] = []
            for tile in tiles:
                placed.append((tile, len(batch)))
                batch.append(tile.crop(image))
                batch_flags.append(False)  # a tile runs at native scale
            layout.append((full_index, placed))
        found = self._detector.detect(batch, scale_up=batch_flags)
        if len(found) != len(batch):
            raise DetectionError(f"detector returned {len(found)} results for {len(batch)} images")
        results: list[Detections] = []
        for image, (full_index, placed) in zip(images, layout, strict=True):
            full = None if full_index is None else found[full_index]
            if not placed and full is not None:
                results.append(full)
                continue
            frame_shape = (int(image.shape[0]), int(image.shape[1]))
            tile_results = [(tile, found[index]) for tile, index in placed]
            results.append(merge_frame(full, tile_results, frame_shape, self._config))
        return results

    def close(self) -> None:
        """Release the wrapped detector, if it has a `close`."""
        close = getattr(self._detector, "close", None)
        if callable(close):
            close()
