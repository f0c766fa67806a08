"""Focus crops packed into mosaics: several crops in one detector input.

Each focus crop run alone is one more detector input, upscaled to the whole input: about the
cost of a frame. A box with time for one more run a frame (`FocusBudget`: the busy real demo
ran 10-23 % of the crops it planned) then looks at one crop. When the runs do not suffice
(`packing`), a mosaic puts up to `per_side` x `per_side` crops side by side in one input at the
model's own size, each scaled to fit its cell (a 160 px crop in a 160x208 cell of a 320x416
input: native scale), so the same run looks at four. Each crop's boxes come back in its own
pixels: a box belongs to the crop its centre is on, clipped to it. A crop alone in its run goes
as it is, upscaled to the whole input.

Pure apart from the detector it is given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import cv2
import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from detection.letterbox import PAD_VALUE

Image = npt.NDArray[np.uint8]


class InputSizedDetector(Protocol):
    """A batch detector that says its model input (`detection.detector.Detector`)."""

    @property
    def input_shape(self) -> tuple[int, int]:
        """The model input, (height, width)."""
        ...

    def detect(self, images: Sequence[Image]) -> list[Detections]:
        """One `Detections` per image, boxes in that image's pixels."""
        ...


@dataclass(frozen=True, slots=True)
class Cell:
    """Where one crop went: mosaic `index`, the top-left of its cell, its scaled size and
    the scale (mosaic pixels per crop pixel)."""

    index: int
    x0: int
    y0: int
    width: int
    height: int
    scale: float


def pack(
    crops: Sequence[Image], input_shape: tuple[int, int], per_side: int
) -> tuple[list[Image], list[Cell]]:
    """The detector inputs holding `crops` in order, at most `per_side**2` an input, and where
    each crop went. A run of several crops is a mosaic of `input_shape` (the fewest cells a
    side that hold them, grey where no crop is); a crop left alone in its run is passed as it
    is, for the detector to scale up to its whole input: the same cost, twice the scale."""
    if per_side < 1:
        raise ValueError(f"per_side must be >= 1, got {per_side}")
    height, width = input_shape
    if height // per_side < 1 or width // per_side < 1:
        raise ValueError(f"an input of {width}x{height} has no room for {per_side} crops a side")
    inputs: list[Image] = []
    cells: list[Cell] = []
    per_run = per_side * per_side
    for start in range(0, len(crops), per_run):
        run = crops[start : start + per_run]
        if len(run) == 1:
            crop = run[0]
            cells.append(Cell(len(inputs), 0, 0, int(crop.shape[1]), int(crop.shape[0]), 1.0))
            inputs.append(crop)
            continue
        side = math.ceil(math.sqrt(len(run)))
        cell_h, cell_w = height // side, width // side
        mosaic = np.full((height, width, 3), PAD_VALUE, dtype=np.uint8)
        for slot, crop in enumerate(run):
            row, col = divmod(slot, side)
            scale = min(cell_w / crop.shape[1], cell_h / crop.shape[0])
            w = min(cell_w, max(1, round(crop.shape[1] * scale)))
            h = min(cell_h, max(1, round(crop.shape[0] * scale)))
            x0, y0 = col * cell_w, row * cell_h
            shrink = cv2.INTER_AREA if scale < 1.0 else cv2.INTER_LINEAR
            mosaic[y0 : y0 + h, x0 : x0 + w] = cv2.resize(crop, (w, h), interpolation=shrink)
            cells.append(Cell(len(inputs), x0, y0, w, h, scale))
        inputs.append(mosaic)
    return inputs, cells


def unpack(found: Sequence[Detections], cells: Sequence[Cell]) -> list[Detections]:
    """Each crop's boxes, in its own pixels, from the mosaics' detections (see the module)."""
    out: list[Detections] = []
    for cell in cells:
        boxes = found[cell.index]
        cx = (boxes.xyxy[:, 0] + boxes.xyxy[:, 2]) / 2.0
        cy = (boxes.xyxy[:, 1] + boxes.xyxy[:, 3]) / 2.0
        x1, y1 = cell.x0, cell.y0
        x2, y2 = cell.x0 + cell.width, cell.y0 + cell.height
        mine = boxes[(cx >= x1) & (cx < x2) & (cy >= y1) & (cy < y2)]
        xyxy = mine.xyxy.astype(np.float64)
        xyxy[:, [0, 2]] = (np.clip(xyxy[:, [0, 2]], x1, x2) - x1) / cell.scale
        xyxy[:, [1, 3]] = (np.clip(xyxy[:, [1, 3]], y1, y2) - y1) / cell.scale
        out.append(Detections(xyxy.astype(np.float32), mine.confidence, mine.class_id))
    return out


def detect_packed(
    detector: InputSizedDetector, crops: Sequence[Image], per_side: int
) -> list[Detections]:
    """`detector` on `crops` packed `per_side` x `per_side` a run; one `Detections` per crop,
    in its own pixels. `per_side` 1: each crop alone (upscaled to the input as a frame is)."""
    if per_side <= 1:
        return detector.detect(crops)
    mosaics, cells = pack(crops, detector.input_shape, per_side)
    return unpack(detector.detect(mosaics), cells)


def packing(crops: int, runs: int | None, max_side: int) -> tuple[int, int]:
    """How to look at `crops` planned crops with `runs` detector runs to spare (None: as many
    as needed): (crops a side of one run, crops looked at). Each crop alone while the runs
    suffice (upscaled to the whole input, twice the scale of a 2x2 mosaic's quarter); packed
    just enough to fit otherwise, at most `max_side` a side."""
    if crops <= 0:
        return 1, 0
    if runs is None or runs >= crops:
        return 1, crops
    side = 1
    while side < max_side and runs * side * side < crops:
        side += 1
    return side, min(crops, max(0, runs) * side * side)


def runs_for(crops: int, per_side: int) -> int:
    """Detector runs that `crops` crops take, `per_side**2` a run."""
    per_run = max(1, per_side) ** 2
    return -(-max(0, crops) // per_run)
