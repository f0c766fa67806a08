"""The cloud-variant bench's merge steps (`bench.models.cloud_truth`): flip back, one box per
object."""

from __future__ import annotations

import numpy as np

from bench.models.cloud_truth import _flipped, merged
from detection.detections import Detections


def _det(rows: list[list[float]]) -> Detections:
    a = np.asarray(rows, dtype=np.float32).reshape(-1, 6)
    return Detections(a[:, :4], a[:, 4], a[:, 5].astype(np.int64))


def test_a_mirrored_box_maps_back_to_the_frame() -> None:
    (box,) = _flipped(_det([[10, 5, 30, 50, 0.9, 0]]), width=100).xyxy
    assert box.tolist() == [70, 5, 90, 50]


def test_the_two_passes_merge_to_one_box_per_object_keeping_the_more_confident() -> None:
    plain = _det([[10, 10, 30, 60, 0.6, 0], [50, 10, 70, 60, 0.5, 0]])
    mirror = _det([[11, 10, 31, 61, 0.8, 0], [10, 10, 30, 60, 0.7, 2]])
    out = merged([plain, mirror])
    assert len(out) == 3  # the same person twice -> once; other person; a car on the person
    person = out[(out.class_id == 0) & (out.xyxy[:, 0] < 40)]
    assert len(person) == 1 and float(person.confidence[0]) == np.float32(0.8)
