"""Vectorised NMS against a slow obvious reference and torchvision's batched_nms on random cases."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from detection import DetectionError, batched_nms, box_iou, nms


def _reference_nms(
    boxes: npt.NDArray[np.float64],
    scores: npt.NDArray[np.float64],
    classes: npt.NDArray[np.int64],
    iou_threshold: float,
) -> list[int]:
    """The textbook loop: walk boxes by score, keep one unless a kept box of its class overlaps."""

    def iou(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> float:
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        inter = w * h
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
        return inter / union if union > 0 else 0.0

    kept: list[int] = []
    for i in sorted(range(len(scores)), key=lambda k: (-scores[k], k)):
        if all(classes[j] != classes[i] or iou(boxes[i], boxes[j]) <= iou_threshold for j in kept):
            kept.append(i)
    return kept


def _random_case(
    seed: int, n: int, n_classes: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 600, (n, 2))
    wh = rng.uniform(5, 120, (n, 2))
    boxes = np.concatenate([xy, xy + wh], axis=1)
    # distinct scores: ties make the order (and so the result) implementation-defined
    scores = rng.permutation(n).astype(np.float64) / n + 1e-3
    return boxes, scores, rng.integers(0, n_classes, n)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("iou_threshold", [0.3, 0.45, 0.7])
def test_batched_nms_matches_the_reference(seed: int, iou_threshold: float) -> None:
    boxes, scores, classes = _random_case(seed, n=150, n_classes=4)
    got = batched_nms(boxes, scores, classes, iou_threshold).tolist()
    assert got == _reference_nms(boxes, scores, classes, iou_threshold)


@pytest.mark.parametrize("seed", range(10))
def test_batched_nms_matches_torchvision(seed: int) -> None:
    torch = pytest.importorskip("torch")
    ops = pytest.importorskip("torchvision.ops")
    boxes, scores, classes = _random_case(seed, n=300, n_classes=5)
    expected = ops.batched_nms(
        torch.from_numpy(boxes).float(),
        torch.from_numpy(scores).float(),
        torch.from_numpy(classes),
        0.5,
    )
    assert batched_nms(boxes, scores, classes, 0.5).tolist() == expected.tolist()


def test_boxes_of_different_classes_never_suppress_each_other() -> None:
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10]], dtype=np.float32)
    scores = np.array([0.9, 0.8, 0.7], dtype=np.float32)
    assert batched_nms(boxes, scores, np.array([0, 1, 0]), 0.5).tolist() == [0, 1]
    assert nms(boxes, scores, 0.5).tolist() == [0]


def test_large_coordinates_keep_precision_across_classes() -> None:
    boxes = np.array([[4000, 4000, 4010, 4010], [4000.5, 4000, 4010.5, 4010]], dtype=np.float32)
    kept = batched_nms(boxes, np.array([0.9, 0.8]), np.array([7, 7]), 0.5)
    assert kept.tolist() == [0]


def test_empty_input_and_argument_errors() -> None:
    empty = np.empty((0, 4), np.float32)
    assert batched_nms(empty, np.empty(0), np.empty(0, np.int64), 0.5).tolist() == []
    assert nms(empty, np.empty(0), 0.5).tolist() == []
    with pytest.raises(DetectionError, match="iou_threshold must be in"):
        nms(empty, np.empty(0), 1.5)
    with pytest.raises(DetectionError, match="2 boxes but 1 scores"):
        nms(np.zeros((2, 4)), np.zeros(1), 0.5)


def test_box_iou_known_values() -> None:
    a = np.array([[0, 0, 10, 10]], dtype=np.float32)
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30], [0, 0, 0, 0]], np.float32)
    np.testing.assert_allclose(box_iou(a, b), [[1.0, 1 / 3, 0.0, 0.0]], rtol=1e-6)
