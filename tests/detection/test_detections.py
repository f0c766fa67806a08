"""The Detections batch type: conversion, validation with clear messages, selection."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from detection import Detections, InvalidDetectionsError


def _dets(n: int = 3) -> Detections:
    xyxy = np.array([[i, i, i + 10, i + 20] for i in range(n)], dtype=np.float64)
    return Detections(xyxy=xyxy, confidence=np.linspace(0.9, 0.5, n), class_id=np.arange(n))


def test_arrays_are_converted_and_tracker_ids_default_to_minus_one() -> None:
    dets = _dets()
    assert dets.xyxy.dtype == np.float32
    assert dets.confidence.dtype == np.float32
    assert dets.class_id.dtype == np.int64
    assert dets.tracker_id.tolist() == [-1, -1, -1]
    assert len(dets) == 3


def test_empty_has_well_shaped_arrays() -> None:
    empty = Detections.empty()
    assert len(empty) == 0
    assert empty.xyxy.shape == (0, 4)
    assert Detections(xyxy=[], confidence=[], class_id=[]).xyxy.shape == (0, 4)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"xyxy": np.zeros((2, 3))}, r"xyxy must have shape \(n, 4\), got \(2, 3\)"),
        ({"confidence": np.zeros(3)}, r"confidence must have shape \(2,\), got \(3,\)"),
        ({"class_id": np.zeros(1)}, r"class_id must have shape \(2,\), got \(1,\)"),
        ({"tracker_id": np.zeros(5)}, r"tracker_id must have shape \(2,\), got \(5,\)"),
        ({"class_id": np.array([0.5, 1.0])}, "whole numbers"),
        ({"class_id": np.array([-1, 0])}, "class_id must be >= 0"),
        ({"confidence": np.array([np.nan, 0.5])}, "finite"),
        ({"xyxy": np.array([[0, 0, 1, 1], [5, 0, 1, 1]])}, "x2 >= x1"),
        ({"xyxy": np.array([[0, 0, 1, np.inf], [0, 0, 1, 1]])}, "finite"),
    ],
)
def test_invalid_arrays_raise_with_expected_vs_actual(kwargs: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {
        "xyxy": np.array([[0, 0, 1, 1], [1, 1, 2, 2]]),
        "confidence": np.array([0.5, 0.6]),
        "class_id": np.array([0, 1]),
    }
    base.update(kwargs)
    with pytest.raises(InvalidDetectionsError, match=message):
        Detections(**base)


def test_selection_by_mask_index_and_slice_returns_detections() -> None:
    dets = _dets(4)
    assert dets[dets.confidence > 0.7].class_id.tolist() == [0, 1]
    assert dets[2].class_id.tolist() == [2]
    assert len(dets[1:3]) == 2
    assert dets[np.array([3, 0])].class_id.tolist() == [3, 0]


def test_with_tracker_ids_does_not_mutate_the_original() -> None:
    dets = _dets(2)
    tracked = dets.with_tracker_ids([7, 8])
    assert tracked.tracker_id.tolist() == [7, 8]
    assert dets.tracker_id.tolist() == [-1, -1]


def test_concatenate_and_area() -> None:
    joined = Detections.concatenate([_dets(2), _dets(1), Detections.empty()])
    assert len(joined) == 3
    assert joined.area.tolist() == [200.0, 200.0, 200.0]
    assert len(Detections.concatenate([])) == 0


def test_iteration_yields_plain_values() -> None:
    box, conf, cls, track = next(iter(_dets(1)))
    assert box.tolist() == [0, 0, 10, 20]
    assert isinstance(conf, float) and cls == 0 and track == -1
