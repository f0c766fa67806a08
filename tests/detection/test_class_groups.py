"""Class groups: merging one object's twin boxes and which classes continue which tracks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from detection.class_groups import COCO_GROUPS, GroupKeys, group_ids, group_nms
from detection.config import DetectorConfig
from detection.runtimes.config import OnnxRuntimeConfig

NAMES = ["person", "bicycle", "car", "motorcycle", "bus", "truck"]


def test_group_ids_map_names_and_drop_groups_with_one_known_class() -> None:
    assert group_ids(COCO_GROUPS, NAMES) == ((1, 3), (2, 4, 5))
    assert group_ids(COCO_GROUPS, ["person", "car", "truck", "forklift"]) == ((1, 2),)
    assert group_ids(COCO_GROUPS, ["person", "car"]) == ()
    assert group_ids(COCO_GROUPS, []) == ()


VAN = [100.0, 100.0, 200.0, 160.0]
VAN_TWIN = [102.0, 101.0, 201.0, 161.0]  # IoU about 0.95
RIDER = [130.0, 40.0, 170.0, 150.0]
BIKE = [128.0, 80.0, 172.0, 152.0]


@pytest.mark.parametrize(
    ("boxes", "scores", "classes", "iou", "kept"),
    [
        ([VAN, VAN_TWIN], [0.8, 0.6], [2, 5], 0.8, [0]),  # car + truck on one van
        ([VAN, VAN_TWIN], [0.6, 0.8], [2, 5], 0.8, [1]),  # the more confident stays
        ([VAN, VAN_TWIN], [0.8, 0.6], [2, 5], 0.97, [0, 1]),  # below the group IoU
        ([VAN, VAN_TWIN], [0.8, 0.6], [2, 2], 0.8, [0, 1]),  # one class: per-class NMS's
        ([RIDER, BIKE], [0.9, 0.8], [0, 1], 0.0, [0, 1]),  # person and bicycle: no group
        ([VAN, VAN_TWIN, BIKE], [0.8, 0.6, 0.7], [2, 4, 1], 0.8, [0, 2]),
        ([], [], [], 0.8, []),
    ],
    ids=["twin", "twin-order", "below-iou", "same-class", "rider", "mixed", "empty"],
)
def test_group_nms(
    boxes: list[list[float]], scores: list[float], classes: list[int], iou: float, kept: list[int]
) -> None:
    got = group_nms(
        np.asarray(boxes, np.float32).reshape(-1, 4),
        np.asarray(scores, np.float32),
        np.asarray(classes, np.int64),
        group_ids(COCO_GROUPS, NAMES),
        iou,
    )
    assert got.tolist() == kept


def test_a_suppressed_box_suppresses_nothing() -> None:
    """Greedy like NMS: a car twin dropped by a truck does not drop a bus the truck spares."""
    far = [0.0, 0.0, 10.0, 10.0]
    got = group_nms(
        np.asarray([VAN, VAN_TWIN, far], np.float32),
        np.asarray([0.9, 0.8, 0.7], np.float32),
        np.asarray([5, 2, 4], np.int64),
        ((2, 4, 5),),
        0.8,
    )
    assert got.tolist() == [0, 2]


def test_group_keys_gate_by_group_and_class() -> None:
    keys = GroupKeys.from_names(COCO_GROUPS, NAMES)
    same = keys.same_kind([0, 2, 1], [0, 1, 2, 3, 5])
    assert same.tolist() == [
        [True, False, False, False, False],  # a person: only a person
        [False, False, True, False, True],  # a car: car, bus, truck
        [False, True, False, True, False],  # a bicycle: bicycle, motorcycle
    ]
    assert keys.same_kind([0], [1]).shape == (1, 1)
    open_gate = GroupKeys.from_names(COCO_GROUPS, NAMES, gate=False)
    assert open_gate.same_kind([0, 2], [1, 5]).all()
    assert GroupKeys().same_kind([7], [7, 8]).tolist() == [[True, False]]  # no groups: own class


def test_a_class_in_two_groups_is_refused() -> None:
    with pytest.raises(ValueError, match="class id 2 is in more than one class group"):
        GroupKeys([(2, 5), (2, 4)])
    with pytest.raises(ValidationError, match="class 'car' is in more than one class group"):
        DetectorConfig(
            runtime=OnnxRuntimeConfig(model_path=Path("unused.onnx")),
            class_groups=[["car", "truck"], ["car", "bus"]],
        )


def test_the_default_groups_are_cocos() -> None:
    config = DetectorConfig(runtime=OnnxRuntimeConfig(model_path=Path("unused.onnx")))
    assert [tuple(g) for g in config.class_groups] == list(COCO_GROUPS)
    assert config.class_group_iou == 0.8
