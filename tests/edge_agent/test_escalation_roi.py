"""The vectorised box geometry the policy and the verification memory run on every frame."""

from __future__ import annotations

import numpy as np

from edge_agent.escalation.roi import (
    box_area,
    box_areas,
    box_of,
    iou,
    max_iou_with_another,
    pairwise_iou,
)


def _boxes(rng: np.random.Generator, n: int) -> np.ndarray:
    corners = rng.uniform(0.0, 100.0, size=(n, 4))
    return corners.astype(np.float64)  # unsorted corners: some boxes are empty (x2 < x1)


def test_pairwise_iou_and_areas_agree_with_the_scalar_ones_empty_boxes_included() -> None:
    rng = np.random.default_rng(7)
    a, b = _boxes(rng, 40), _boxes(rng, 30)
    a[:10, 2:] = a[:10, :2] + rng.uniform(1.0, 30.0, size=(10, 2))  # some proper boxes
    b[:10, 2:] = b[:10, :2] + rng.uniform(1.0, 30.0, size=(10, 2))
    matrix = pairwise_iou(a, b)
    assert matrix.shape == (40, 30) and matrix.dtype == np.float64
    expected = np.array([[iou(box_of(x), box_of(y)) for y in b] for x in a])
    np.testing.assert_allclose(matrix, expected, rtol=0.0, atol=1e-12)
    np.testing.assert_array_equal(box_areas(a), [box_area(box_of(x)) for x in a])
    assert (matrix[10:, :][a[10:, 2] < a[10:, 0]] == 0.0).all()  # an empty box overlaps nothing


def test_max_iou_with_another_leaves_each_box_itself_out() -> None:
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [20, 20, 30, 30]], dtype=np.float64)
    assert max_iou_with_another(boxes).tolist() == [1.0, 1.0, 0.0]
    assert max_iou_with_another(boxes[:1]).tolist() == [0.0]
    assert max_iou_with_another(np.zeros((0, 4))).shape == (0,)
