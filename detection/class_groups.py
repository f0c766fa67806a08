"""Class groups: classes a detector confuses on one object, treated as one kind where it matters.

A detector calls one van a car in one frame and a truck in the next, or both in one frame (its
NMS is per class, so two boxes survive on one object). A person riding a bicycle, by contrast,
is two objects of two kinds with nearly the same box. So:

- the detector suppresses a box that overlaps a more confident box *of its group* above
  `class_group_iou` (`group_nms`): the van's twin goes, the cyclist's bicycle stays;
- the tracker lets a detection continue a track of its own class or group only
  (`GroupKeys`): a van's track survives its car/truck flicker, a person's track is never
  continued by the bicycle under them.

Measured on the hand-verified real footage (`bench.hybrid.real_hybrid`, see
docs/benchmarks.md): with any class continuing any track, bikes' edge person F1 was 0.580 (person
and bicycle tracks swapped boxes); without the group pass in NMS, vtest's two parked vehicles
carried 39 false twins (vehicle F1 0.792).

Groups are named by class names; names a model does not have are ignored, so the COCO default
costs nothing on a model with other classes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from detection.nms import box_iou

COCO_GROUPS: tuple[tuple[str, ...], ...] = (("bicycle", "motorcycle"), ("car", "bus", "truck"))
"""Two-wheelers and road vehicles: the COCO classes a detector swaps on one object."""


def group_ids(
    groups: Iterable[Sequence[str]], class_names: Sequence[str]
) -> tuple[tuple[int, ...], ...]:
    """Each group's class ids in `class_names` (names not there ignored), dropping groups left
    with fewer than two classes (nothing to merge)."""
    ids = {name: i for i, name in reversed(list(enumerate(class_names)))}
    out = []
    for group in groups:
        members = tuple(sorted({ids[name] for name in group if name in ids}))
        if len(members) >= 2:
            out.append(members)
    return tuple(out)


class GroupKeys:
    """Which class ids count as one kind: `key(a) == key(b)` when `a` and `b` are the same class
    or in one group. With `gate` off every class is one kind (any detection may continue any
    track, the tracker's behaviour before groups)."""

    def __init__(self, groups: Iterable[Sequence[int]] = (), *, gate: bool = True) -> None:
        self.gate = bool(gate)
        self._of: dict[int, int] = {}
        for index, group in enumerate(groups):
            for class_id in group:
                if int(class_id) in self._of:
                    raise ValueError(f"class id {class_id} is in more than one class group")
                self._of[int(class_id)] = -(index + 1)  # groups below 0, lone classes their id

    @classmethod
    def from_names(
        cls, groups: Iterable[Sequence[str]], class_names: Sequence[str], *, gate: bool = True
    ) -> GroupKeys:
        """Keys for groups given by class names (see `group_ids`)."""
        return cls(group_ids(groups, class_names), gate=gate)

    def key(self, class_id: int) -> int:
        """The kind of `class_id` (0 for every class with the gate off)."""
        if not self.gate:
            return 0
        return self._of.get(int(class_id), int(class_id))

    def same_kind(
        self, a: Sequence[int] | npt.NDArray[Any], b: Sequence[int] | npt.NDArray[Any]
    ) -> npt.NDArray[np.bool_]:
        """`(len(a), len(b))`: whether each pair of class ids is of one kind."""
        ka = np.asarray([self.key(int(c)) for c in a], dtype=np.int64)
        kb = np.asarray([self.key(int(c)) for c in b], dtype=np.int64)
        return np.asarray(ka[:, None] == kb[None, :], dtype=bool)

    def as_mapping(self) -> Mapping[int, int]:
        """Grouped class id -> its group's key (for logs and tests)."""
        return dict(self._of)


def group_nms(
    xyxy: npt.NDArray[np.floating[Any]],
    scores: npt.NDArray[np.floating[Any]],
    class_ids: npt.NDArray[np.integer[Any]],
    groups: Sequence[Sequence[int]],
    iou_threshold: float,
) -> npt.NDArray[np.int64]:
    """Indices (ascending) of the boxes kept when, within each group, a box overlapping a more
    confident box of another class of the group above `iou_threshold` is dropped. Run after
    per-class NMS; boxes of one class are left to that (their own, lower threshold)."""
    boxes = np.asarray(xyxy, dtype=np.float32).reshape(-1, 4)
    conf = np.asarray(scores, dtype=np.float32).reshape(-1)
    classes = np.asarray(class_ids, dtype=np.int64).reshape(-1)
    keep = np.ones(len(boxes), dtype=bool)
    for group in groups:
        members = np.flatnonzero(np.isin(classes, np.asarray(group, dtype=np.int64)))
        if len(members) < 2:
            continue
        order = members[np.argsort(-conf[members], kind="stable")]
        overlap = box_iou(boxes[order], boxes[order])
        for rank, i in enumerate(order):
            if not keep[i]:
                continue
            later = order[rank + 1 :]
            twins = (overlap[rank, rank + 1 :] > iou_threshold) & (classes[later] != classes[i])
            keep[later[twins]] = False
    return np.flatnonzero(keep).astype(np.int64)
