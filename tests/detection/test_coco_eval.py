"""COCO-style metrics: hand-computed cases, and agreement with pycocotools on random cases."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from detection.coco_eval import GroundTruth, MetricsError, MetricsResult, compute_metrics
from detection.detections import Detections


def gt(
    boxes: list[list[float]], classes: list[int], ignore: list[bool] | None = None
) -> GroundTruth:
    return GroundTruth(
        xyxy=np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
        class_id=np.asarray(classes, dtype=np.int64),
        ignore=np.asarray(ignore if ignore is not None else [False] * len(classes), dtype=bool),
    )


def dt(boxes: list[list[float]], scores: list[float], classes: list[int]) -> Detections:
    return Detections(
        xyxy=np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
        confidence=np.asarray(scores, dtype=np.float32),
        class_id=np.asarray(classes, dtype=np.int64),
    )


BOX = [0.0, 0.0, 100.0, 100.0]
FAR = [300.0, 300.0, 400.0, 400.0]
# IoU with BOX, shifted down by s: 100x(100-s) overlap over 100x(100+s) union; kept off the
# thresholds (0.6 is not exact in binary) except 0.5, which is
SHIFT_20 = [0.0, 20.0, 100.0, 120.0]  # IoU 80/120 = 0.667: hits at 0.50..0.65
SHIFT_10 = [0.0, 10.0, 100.0, 110.0]  # IoU 90/110 = 0.818: hits at 0.50..0.80
HALF = [0.0, 0.0, 100.0, 50.0]  # IoU 0.5 exactly: a hit at 0.50 only


# (id, ground truth per image, predictions per image, expected map50_95, map50, recall@0.25)
CASES: list[tuple[str, list[GroundTruth], list[Detections], float, float, float]] = [
    ("perfect", [gt([BOX], [0])], [dt([BOX], [0.9], [0])], 1.0, 1.0, 1.0),
    ("miss", [gt([BOX], [0])], [dt([FAR], [0.9], [0])], 0.0, 0.0, 0.0),
    ("no-predictions", [gt([BOX], [0])], [Detections.empty()], 0.0, 0.0, 0.0),
    ("iou-0.67", [gt([BOX], [0])], [dt([SHIFT_20], [0.9], [0])], 0.4, 1.0, 1.0),
    ("iou-0.82", [gt([BOX], [0])], [dt([SHIFT_10], [0.9], [0])], 0.7, 1.0, 1.0),
    ("iou-exactly-0.5", [gt([BOX], [0])], [dt([HALF], [0.9], [0])], 0.1, 1.0, 1.0),
    # a false positive ranked above the hit: precision 1/2 at recall 1 -> AP 0.5
    ("fp-first", [gt([BOX], [0])], [dt([FAR, BOX], [0.9, 0.8], [0, 0])], 0.5, 0.5, 1.0),
    # the false positive ranked below the hit does not lower AP
    ("fp-last", [gt([BOX], [0])], [dt([BOX, FAR], [0.9, 0.8], [0, 0])], 1.0, 1.0, 1.0),
    # a duplicate of a matched box is a false positive
    ("duplicate", [gt([BOX], [0])], [dt([BOX, BOX], [0.9, 0.8], [0, 0])], 1.0, 1.0, 1.0),
    # two GT, one found: recall 1/2; AP = mean of precision 1 at recall 0..0.5 = 51/101
    ("half-found", [gt([BOX, FAR], [0, 0])], [dt([BOX], [0.9], [0])], 51 / 101, 51 / 101, 0.5),
    # wrong class: a miss for class 0; class 1 has no GT and is left out of the mean
    ("wrong-class", [gt([BOX], [0])], [dt([BOX], [0.9], [1])], 0.0, 0.0, 0.0),
    # two classes: one perfect, one missed -> mean 0.5
    (
        "two-classes",
        [gt([BOX, FAR], [0, 1])],
        [dt([BOX, BOX], [0.9, 0.9], [0, 1])],
        0.5,
        0.5,
        0.5,
    ),
    # an ignored GT: a prediction on it is neither TP nor FP, the other GT is found
    (
        "ignored-gt",
        [gt([BOX, FAR], [0, 0], [False, True])],
        [dt([FAR, BOX], [0.9, 0.8], [0, 0])],
        1.0,
        1.0,
        1.0,
    ),
    # a hit below the score threshold counts for AP but not for recall@0.25
    ("low-score", [gt([BOX], [0])], [dt([BOX], [0.1], [0])], 1.0, 1.0, 0.0),
    # ranked across images: FP (image 1), then TP (image 2) of 2 GT -> precision 0, 1/2 at
    # recall 0, 1/2: interpolated precision 1/2 at the 51 recall points 0..0.5, 0 beyond
    (
        "two-images",
        [gt([BOX], [0]), gt([BOX], [0])],
        [dt([FAR], [0.9], [0]), dt([BOX], [0.8], [0])],
        0.5 * 51 / 101,
        0.5 * 51 / 101,
        0.5,
    ),
]


@pytest.mark.parametrize(
    ("ground_truth", "predictions", "map50_95", "map50", "recall"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_hand_computed_cases(
    ground_truth: list[GroundTruth],
    predictions: list[Detections],
    map50_95: float,
    map50: float,
    recall: float,
) -> None:
    result = compute_metrics(ground_truth, predictions)
    assert result.map50_95 == pytest.approx(map50_95, abs=1e-9)
    assert result.map50 == pytest.approx(map50, abs=1e-9)
    assert result.overall.recall == pytest.approx(recall, abs=1e-9)


def test_small_objects_and_area_parameter() -> None:
    small, large = [0.0, 0.0, 20.0, 20.0], [100.0, 100.0, 300.0, 300.0]
    ground_truth = [gt([small, large], [0, 0])]
    predictions = [dt([large], [0.9], [0])]  # only the large box is found
    result = compute_metrics(ground_truth, predictions)
    assert result.map50 == pytest.approx(51 / 101)
    assert result.small.num_gt == 1
    assert result.small.map50 == 0.0  # the large prediction is outside the range: ignored
    assert result.small.recall == 0.0
    wide = compute_metrics(ground_truth, predictions, small_area_px2=300.0**2)
    assert wide.small.num_gt == 2
    assert wide.small.map50 == pytest.approx(51 / 101)


def test_small_range_includes_its_bound_like_coco() -> None:
    box = [0.0, 0.0, 32.0, 32.0]  # area exactly 32²
    result = compute_metrics([gt([box], [0])], [dt([box], [0.9], [0])])
    assert result.small.num_gt == 1
    assert result.small.map50_95 == pytest.approx(1.0)


def test_per_class_table_and_names() -> None:
    result = compute_metrics(
        [gt([BOX, FAR], [0, 1])],
        [dt([BOX, BOX], [0.9, 0.9], [0, 2])],
        class_names=["person", "car", "bike"],
    )
    by_name = {c.name: c for c in result.per_class}
    assert by_name["person"].ap50_95 == pytest.approx(1.0)
    assert by_name["car"].ap50_95 == 0.0
    assert math.isnan(by_name["bike"].ap50_95) and by_name["bike"].num_predictions == 1
    table = result.table()
    assert table.splitlines()[0].startswith("| class | GT |")
    assert "| person | 1 | 1 | 1.0000 | 1.0000 | 1.0000 |" in table
    assert "| bike | 0 | 1 | – | – | – |" in table
    assert result.to_dict()["per_class"][2]["ap50_95"] is None


def test_no_ground_truth_gives_nan() -> None:
    result = compute_metrics([gt([], [])], [dt([BOX], [0.9], [0])])
    assert math.isnan(result.map50_95) and result.overall.num_gt == 0


def test_max_detections_per_image_and_class() -> None:
    # the only hit is the 3rd-best box of its class: with max_detections=2 it is cut off
    predictions = [dt([FAR, FAR, BOX], [0.9, 0.8, 0.7], [0, 0, 0])]
    assert compute_metrics([gt([BOX], [0])], predictions, max_detections=2).map50 == 0.0
    assert compute_metrics([gt([BOX], [0])], predictions, max_detections=3).map50 > 0.0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: compute_metrics([gt([BOX], [0])], []), "one prediction batch per image"),
        (lambda: compute_metrics([], [], max_detections=0), "max_detections must be >= 1"),
        (lambda: compute_metrics([], [], iou_thresholds=[0.6, 0.7]), "must include 0.5"),
        (lambda: compute_metrics([], [], small_area_px2=0), "small_area_px2 must be > 0"),
        (lambda: gt([[10, 10, 5, 5]], [0]), "x2 >= x1"),
        (lambda: gt([BOX], [0, 1]), r"shape \(1,\)"),
        (lambda: gt([BOX], [-1]), "class_id must be >= 0"),
    ],
    ids=["length-mismatch", "max-dets", "no-0.5", "small-area", "bad-box", "bad-len", "neg-cls"],
)
def test_bad_input(call: Any, match: str) -> None:
    with pytest.raises(MetricsError, match=match):
        call()


# --- against pycocotools -------------------------------------------------------------------


def _random_case(
    rng: np.random.Generator, num_images: int, num_classes: int
) -> tuple[list[GroundTruth], list[Detections]]:
    """Random GT and predictions: jittered copies of GT (hits of varying IoU), duplicates, random
    false positives, class confusions, ignored GT, many small boxes; scores with ties."""
    ground_truth, predictions = [], []
    for _ in range(num_images):
        n = int(rng.integers(0, 8))
        xy = rng.uniform(0, 400, (n, 2))
        wh = rng.uniform(4, 120, (n, 2))
        boxes = np.concatenate([xy, xy + wh], axis=1)
        classes = rng.integers(0, num_classes, n)
        ignore = rng.random(n) < 0.15
        ground_truth.append(gt(boxes.tolist(), classes.tolist(), ignore.tolist()))
        found = rng.random(n) < 0.8
        jitter = rng.uniform(0.0, 0.15)  # relative box noise: mostly high IoU, or mostly low
        hits = boxes[found]
        hits = hits + rng.normal(0, jitter, hits.shape) * np.tile(hits[:, 2:] - hits[:, :2], 2)
        confused = rng.random(len(hits)) < 0.15
        hit_classes = np.where(confused, rng.integers(0, num_classes, len(hits)), classes[found])
        m = int(rng.integers(0, 6))
        fxy = rng.uniform(0, 400, (m, 2))
        fp = np.concatenate([fxy, fxy + rng.uniform(4, 120, (m, 2))], axis=1)
        all_boxes = np.concatenate([hits, fp, hits[:1]])  # + one duplicate
        all_boxes[:, 2:] = np.maximum(all_boxes[:, 2:], all_boxes[:, :2] + 0.5)
        all_classes = np.concatenate(
            [hit_classes, rng.integers(0, num_classes, m), hit_classes[:1]]
        )
        scores = np.round(rng.uniform(0.01, 1.0, len(all_boxes)), 2)  # ties on purpose
        predictions.append(dt(all_boxes.tolist(), scores.tolist(), all_classes.tolist()))
    return ground_truth, predictions


def _pycocotools_eval(
    ground_truth: list[GroundTruth],
    predictions: list[Detections],
    num_classes: int,
    max_dets: int,
    small_area: float,
) -> Any:
    """pycocotools' precision array, with COCO's own handling of the per-box ignore flag."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    class IgnoreAwareCOCOeval(COCOeval):  # type: ignore[misc]
        """COCOeval's `_prepare` overwrites `ignore` with `iscrowd`; restore ours after it."""

        def _prepare(self) -> None:
            super()._prepare()
            for boxes in self._gts.values():
                for box in boxes:
                    box["ignore"] = box["low_visibility"]

    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for image_id, (g, d) in enumerate(zip(ground_truth, predictions, strict=True), start=1):
        images.append({"id": image_id, "width": 640, "height": 640})
        for box, cls, ignored in zip(
            g.xyxy.tolist(), g.class_id.tolist(), g.ignore.tolist(), strict=True
        ):
            w, h = box[2] - box[0], box[3] - box[1]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": cls,
                    "bbox": [box[0], box[1], w, h],
                    "area": w * h,
                    "iscrowd": 0,
                    "low_visibility": int(ignored),
                }
            )
        for box, score, cls in zip(
            d.xyxy.tolist(), d.confidence.tolist(), d.class_id.tolist(), strict=True
        ):
            bbox = [box[0], box[1], box[2] - box[0], box[3] - box[1]]
            results.append({"image_id": image_id, "category_id": cls, "bbox": bbox, "score": score})
    coco = COCO()
    coco.dataset = {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": c, "name": str(c)} for c in range(num_classes)],
    }
    coco.createIndex()
    evaluator = IgnoreAwareCOCOeval(coco, coco.loadRes(results), "bbox")
    evaluator.params.maxDets = [max_dets]
    evaluator.params.areaRng = [[0.0, 1e10], [0.0, small_area]]
    evaluator.params.areaRngLbl = ["all", "small"]
    evaluator.evaluate()
    evaluator.accumulate()
    return evaluator.eval["precision"]  # (T, R, K, A, M)


def _coco_numbers(precision: Any, area: int, k: int | None = None) -> tuple[float, float]:
    p = precision[:, :, :, area, 0] if k is None else precision[:, :, k : k + 1, area, 0]
    valid = p[0, 0, :] > -1  # classes with ground truth
    if not valid.any():
        return math.nan, math.nan
    return float(p[:, :, valid].mean()), float(p[0, :, valid].mean())


def _check_against_coco(result: MetricsResult, precision: Any, num_classes: int) -> float:
    worst = 0.0
    pairs = [
        (_coco_numbers(precision, 0), (result.map50_95, result.map50)),
        (_coco_numbers(precision, 1), (result.small.map50_95, result.small.map50)),
    ]
    ours = {c.class_id: c for c in result.per_class}
    for k in range(num_classes):
        mine = ours.get(k)
        pairs.append(
            (
                _coco_numbers(precision, 0, k),
                (mine.ap50_95, mine.ap50) if mine else (math.nan, math.nan),
            )
        )
    for expected, got in pairs:
        for e, g in zip(expected, got, strict=True):
            if math.isnan(e):
                assert math.isnan(g)
            else:
                worst = max(worst, abs(e - g))
    return worst


@pytest.mark.parametrize("seed", range(100))
def test_agrees_with_pycocotools_on_random_cases(seed: int) -> None:
    pytest.importorskip("pycocotools")
    rng = np.random.default_rng(seed)
    num_classes = int(rng.integers(1, 5))
    num_images = int(rng.integers(1, 12))
    max_dets = int(rng.choice([1, 3, 100]))
    small_area = float(rng.choice([32.0**2, 48.0**2]))
    ground_truth, predictions = _random_case(rng, num_images, num_classes)
    if sum(len(d) for d in predictions) == 0:
        pytest.skip("pycocotools' loadRes cannot take an empty result list")
    result = compute_metrics(
        ground_truth, predictions, max_detections=max_dets, small_area_px2=small_area
    )
    precision = _pycocotools_eval(ground_truth, predictions, num_classes, max_dets, small_area)
    assert _check_against_coco(result, precision, num_classes) < 1e-9


def _dets(
    boxes: list[list[float]], classes: list[int], scores: list[float] | None = None
) -> Detections:
    return Detections(
        xyxy=np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
        confidence=np.asarray(scores or [0.9] * len(boxes), dtype=np.float32),
        class_id=np.asarray(classes, dtype=np.int64),
    )


@pytest.mark.parametrize(
    ("reference", "predicted", "classes", "counts"),
    [
        # exact hit, one miss, one false alarm
        ([[0, 0, 10, 10], [20, 20, 30, 30]], [[0, 0, 10, 10], [50, 50, 60, 60]], None, (1, 1, 1)),
        # IoU 0.47 < 0.5: no match
        ([[0, 0, 10, 10]], [[0, 0, 10, 4.7]], None, (0, 1, 1)),
        # right box, wrong class: no match
        ([[0, 0, 10, 10]], [[0, 0, 10, 10]], [0], (0, 0, 1)),
        # nothing on either side
        ([], [], None, (0, 0, 0)),
    ],
)
def test_agreement_counts(
    reference: list[list[float]],
    predicted: list[list[float]],
    classes: list[int] | None,
    counts: tuple[int, int, int],
) -> None:
    from detection.coco_eval import agreement

    ref_classes = [0] * len(reference)
    pred_classes = [0 if classes is None else 1] * len(predicted)
    result = agreement(
        [_dets(reference, ref_classes)], [_dets(predicted, pred_classes)], classes=classes
    )
    assert (result.true_positives, result.false_positives, result.false_negatives) == counts


def test_agreement_scores_and_sum() -> None:
    from detection.coco_eval import Agreement

    total = Agreement(3, 1, 0) + Agreement(1, 0, 4)
    assert (total.precision, total.recall) == (0.8, 0.5)
    assert total.f1 == pytest.approx(2 * 0.8 * 0.5 / 1.3)
    assert np.isnan(Agreement(0, 0, 0).recall)
