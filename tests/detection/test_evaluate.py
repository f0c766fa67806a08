"""Toolchain evaluation: labelled folders, source vs export metrics, the TensorRT builder's refusal.

The test world: a seeded random-weight YOLOv5n, its batch-norm statistics set on the frames and
its class biases zeroed (so boxes and scores vary as a trained model's do), run on frames cut
from the ultralytics assets; the boxes it finds above a score threshold become the labels.
Scored against them, the source model's own boxes are all true positives ranked first: its mAP
is ~1, and every faithful export must score the same.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import pytest
from onnx import helper

from detection.errors import (
    ExportError,
    ModelLoadError,
    RuntimeUnavailableError,
    UnknownOutputLayoutError,
)
from detection.letterbox import letterbox_batch
from detection.runtimes.base import _BUILTIN_MODULES
from detection.toolchain.cache import cache_key
from detection.toolchain.dataset import DatasetError, load_dataset, read_labels
from detection.toolchain.evaluate import (
    Comparison,
    evaluate_model,
    evaluate_source_model,
    load_model,
    open_detector,
)
from detection.toolchain.tensorrt_build import (
    EngineSettings,
    build_engine,
    calibration_batches,
    calibration_files,
    profile_shapes,
)
from tests.fixtures.models import asset_image, cached
from tests.fixtures.tiny_models import tiny_onnx

IMGSZ = 128
SEED = 0
WORLD_VERSION = "2"  # bump when the generated world changes
TOLERANCE = 2e-3  # source (torch) vs ONNX: float rounding can swap near-tied boxes


def _confident_yolov5n(work: Path) -> Path:
    import torch

    from detection.toolchain.export import build_model

    yolo = build_model("yolov5n.yaml", seed=SEED)
    model = yolo.model.float()
    # Random weights let activations fade to ~0 layer by layer (every box and score alike).
    # Re-estimating the batch-norm statistics on real frames keeps them alive; zeroed class
    # biases move scores from ~1e-5 to ~0.5 with a real spread.
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # cumulative average: the statistics of this one batch
    batch, _ = letterbox_batch(list(_frames().values()), (IMGSZ, IMGSZ))
    model.train()
    with torch.no_grad():
        model(torch.from_numpy(batch))
        for branch in model.model[-1].cv3:  # the class-score convolutions
            branch[-1].bias.zero_()
    model.eval()
    path = work / f"yolov5n_seed{SEED}.pt"  # not `yolov5n.pt`: ultralytics would fetch v5nu
    yolo.save(path)
    return path


def _frames() -> dict[str, Any]:
    frames = {}
    for name in ("bus", "zidane"):
        image = asset_image(f"{name}.jpg")
        h, w = image.shape[:2]
        frames[f"{name}_full"] = image
        frames[f"{name}_flip"] = np.ascontiguousarray(image[:, ::-1])
        frames[f"{name}_crop"] = np.ascontiguousarray(image[h // 4 : 3 * h // 4, w // 4 :])
    return frames


def _threshold_in_a_gap(scores: np.ndarray[Any, Any], wanted: int) -> float:
    """A score threshold letting about `wanted` boxes in, set in the widest gap nearby so float
    differences between runtimes cannot move a box across it."""
    top = np.sort(scores)[::-1][: wanted * 2]
    gaps = (top[:-1] - top[1:])[wanted // 2 :]
    i = int(np.argmax(gaps)) + wanted // 2
    return float((top[i] + top[i + 1]) / 2)


def _write_world(source: Path, folder: Path) -> Path:
    images = folder / "images"
    labels = folder / "labels"
    images.mkdir(parents=True)
    labels.mkdir()
    frames = _frames()
    with open_detector(source, IMGSZ) as detector:
        found = detector.detect(list(frames.values()))
    threshold = _threshold_in_a_gap(np.concatenate([d.confidence for d in found]), 4 * len(frames))
    for (name, frame), boxes in zip(frames.items(), found, strict=True):
        cv2.imwrite(str(images / f"{name}.png"), frame)  # lossless: same pixels when read back
        h, w = frame.shape[:2]
        lines = []
        for (x1, y1, x2, y2), score, cls, _ in boxes:
            if score > threshold:
                cx, cy, bw, bh = (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h
                lines.append(f"{cls} {cx:.8f} {cy:.8f} {bw:.8f} {bh:.8f}")
        (labels / f"{name}.txt").write_text("\n".join(lines) + "\n")
    return images


@pytest.fixture(scope="session")
def tiny_source() -> Path:
    """The confident random-weight YOLOv5n checkpoint (cached)."""
    key = cache_key("toolchain-yolov5n", version=WORLD_VERSION, seed=SEED, imgsz=IMGSZ)
    return cached(key, _confident_yolov5n)


@pytest.fixture(scope="session")
def labelled_folder(tiny_source: Path) -> Path:
    """A YOLO folder (`images/`, `labels/`) labelled by the source model itself (cached)."""
    key = cache_key("toolchain-world", source=tiny_source.parent.name, version=WORLD_VERSION)
    return cached(key, lambda work: _write_world(tiny_source, work)).parent


@pytest.fixture(scope="session")
def tiny_onnx_export(tiny_source: Path) -> Path:
    """The source exported to ONNX (dynamic batch and size) by the toolchain (cached)."""
    from detection.toolchain.export import export_onnx

    key = cache_key("toolchain-onnx", source=tiny_source.parent.name, imgsz=IMGSZ)
    return cached(key, lambda work: export_onnx(str(tiny_source), work, IMGSZ))


def to_yolov5_layout(anchor_free: Path, out: Path) -> Path:
    """Rewrite an `(B, 4+C, N)` ONNX into the original YOLOv5 repo's `(B, N, 5+C)` output, with
    objectness 1: the same scores, in the other layout."""
    model = onnx.load(str(anchor_free))
    graph = model.graph
    source = graph.output[0].name
    const = [
        helper.make_tensor(name, onnx.TensorProto.INT64, [1], [value])
        for name, value in (("v5_0", 0), ("v5_1", 1), ("v5_4", 4), ("v5_end", 2**62), ("v5_2", 2))
    ]
    graph.initializer.extend(const)
    graph.initializer.append(helper.make_tensor("v5_zero", onnx.TensorProto.FLOAT, [], [0.0]))
    graph.initializer.append(helper.make_tensor("v5_one", onnx.TensorProto.FLOAT, [], [1.0]))
    graph.node.extend(
        [
            helper.make_node("Transpose", [source], ["v5_rows"], perm=[0, 2, 1]),
            helper.make_node("Slice", ["v5_rows", "v5_0", "v5_4", "v5_2"], ["v5_boxes"]),
            helper.make_node("Slice", ["v5_rows", "v5_4", "v5_end", "v5_2"], ["v5_cls"]),
            helper.make_node("Slice", ["v5_rows", "v5_0", "v5_1", "v5_2"], ["v5_first"]),
            helper.make_node("Mul", ["v5_first", "v5_zero"], ["v5_zeros"]),
            helper.make_node("Add", ["v5_zeros", "v5_one"], ["v5_obj"]),
            helper.make_node("Concat", ["v5_boxes", "v5_obj", "v5_cls"], ["output"], axis=2),
        ]
    )
    del graph.output[:]
    graph.output.append(
        helper.make_tensor_value_info("output", onnx.TensorProto.FLOAT, ["batch", "anchors", 85])
    )
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    return out


@pytest.fixture(scope="session")
def yolov5_repo_onnx(tiny_onnx_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ONNX shaped like the original YOLOv5 repo's export, `(B, N, 85)` with objectness."""
    return to_yolov5_layout(tiny_onnx_export, tmp_path_factory.mktemp("v5") / "yolov5n_v5.onnx")


# --- labelled folders --------------------------------------------------------------------


def _folder(tmp_path: Path, labels: dict[str, str], size: tuple[int, int] = (100, 200)) -> Path:
    (tmp_path / "images").mkdir(parents=True)
    (tmp_path / "labels").mkdir()
    for name, text in labels.items():
        cv2.imwrite(str(tmp_path / "images" / f"{name}.png"), np.zeros((*size, 3), np.uint8))
        (tmp_path / "labels" / f"{name}.txt").write_text(text)
    return tmp_path


def test_reads_yolo_labels_into_pixels(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"a": "1 0.5 0.5 0.5 0.2\n\n0 0.1 0.1 0.2 0.2\n", "b": ""})
    cv2.imwrite(str(folder / "images" / "c.jpg"), np.zeros((10, 10, 3), np.uint8))  # no labels
    dataset = load_dataset(folder)
    assert [i.path.name for i in dataset] == ["a.png", "b.png", "c.jpg"]
    a = dataset.images[0]
    assert a.size == (100, 200)
    np.testing.assert_allclose(a.ground_truth.xyxy, [[50, 40, 150, 60], [0, 0, 40, 20]])
    assert a.ground_truth.class_id.tolist() == [1, 0]
    assert len(dataset.images[1].ground_truth) == 0 and len(dataset.images[2].ground_truth) == 0


def test_reads_data_yaml_split_and_names(tmp_path: Path) -> None:
    _folder(tmp_path / "set", {"a": "0 0.5 0.5 0.5 0.5\n"})
    (tmp_path / "data.yaml").write_text("path: set\nval: images\nnames: {0: person, 1: car}\n")
    dataset = load_dataset(tmp_path / "data.yaml")
    assert len(dataset) == 1 and dataset.class_names == ("person", "car")
    assert load_dataset(tmp_path).class_names == ("person", "car")  # folder holding data.yaml
    with pytest.raises(DatasetError, match="no 'test' entry"):
        load_dataset(tmp_path / "data.yaml", split="test")


@pytest.mark.parametrize(
    ("label", "match"),
    [
        ("0 0.5 0.5 0.5\n", r"a\.txt:1: expected 5 fields"),
        ("0 0.5 0.5 0.5 0.5\n1 x 0.5 0.5 0.5\n", r"a\.txt:2: fields must be numbers"),
        ("-1 0.5 0.5 0.5 0.5\n", r"a\.txt:1: class must be a whole number"),
        ("1.5 0.5 0.5 0.5 0.5\n", r"a\.txt:1: class must be a whole number"),
        ("0 0.5 0.5 1.5 0.5\n", r"a\.txt:1: .*normalised to 0\.\.1"),
        ("0 nan 0.5 0.5 0.5\n", r"a\.txt:1: .*normalised to 0\.\.1"),
    ],
    ids=["4-fields", "not-number", "negative-class", "fractional-class", "above-1", "nan"],
)
def test_malformed_label_lines_name_file_and_line(tmp_path: Path, label: str, match: str) -> None:
    with pytest.raises(DatasetError, match=match):
        load_dataset(_folder(tmp_path, {"a": label}))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda p: p / "missing", "dataset not found: .*missing"),
        (lambda p: _mkdir(p / "images").parent, "holds no images"),
        (lambda p: p, "expected an images/ folder"),
        (lambda p: _write(p / "x.txt", ""), "must be a folder or a data"),
        (lambda p: _write(p / "d.yaml", "val: nowhere\n"), "image folder not found"),
        (lambda p: _write(p / "d.yaml", "a: [\n"), "not valid YAML"),
    ],
    ids=["missing", "no-images", "no-layout", "not-yaml", "yaml-missing-split", "bad-yaml"],
)
def test_bad_dataset_locations(tmp_path: Path, make: Any, match: str) -> None:
    with pytest.raises(DatasetError, match=match):
        load_dataset(make(tmp_path))


def test_labels_are_clipped_to_the_image(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("0 0.05 0.5 0.2 0.2\n")
    np.testing.assert_allclose(read_labels(tmp_path / "a.txt", (10, 10)).xyxy, [[0, 4, 1.5, 6]])


# --- source vs export --------------------------------------------------------------------


def _assert_same_metrics(a: Any, b: Any) -> None:
    assert a.map50_95 == pytest.approx(b.map50_95, abs=TOLERANCE)
    assert a.map50 == pytest.approx(b.map50, abs=TOLERANCE)
    assert [c.class_id for c in a.per_class if c.num_gt] == [
        c.class_id for c in b.per_class if c.num_gt
    ]
    for x, y in zip(a.per_class, b.per_class, strict=False):
        if x.num_gt:
            assert x.ap50_95 == pytest.approx(y.ap50_95, abs=5 * TOLERANCE)


@pytest.mark.slow
def test_source_model_scores_its_own_labels_perfectly(
    tiny_source: Path, labelled_folder: Path
) -> None:
    dataset = load_dataset(labelled_folder)
    result = evaluate_source_model(tiny_source, dataset, IMGSZ)
    assert result.overall.num_gt >= 2 * len(dataset)
    assert result.map50 == pytest.approx(1.0, abs=1e-6)
    assert result.map50_95 > 0.95  # labels are rounded to 8 decimals: IoU just below 1
    assert result.overall.recall == 1.0
    assert "| **all** |" in result.table()


@pytest.mark.slow
def test_onnx_export_matches_source(
    tiny_source: Path, tiny_onnx_export: Path, labelled_folder: Path
) -> None:
    dataset = load_dataset(labelled_folder)
    source = evaluate_source_model(tiny_source, dataset, IMGSZ)
    export = evaluate_model(tiny_onnx_export, dataset, IMGSZ)
    _assert_same_metrics(source, export)
    comparison = Comparison(tiny_source.name, tiny_onnx_export.name, source, export)
    report = comparison.markdown()
    assert f"`{tiny_onnx_export.name}` vs source `{tiny_source.name}`" in report
    assert "| mAP50-95 |" in report and "| class | GT |" in report
    data = json.loads(json.dumps(comparison.to_dict(), allow_nan=False))
    assert abs(data["delta"]["map50_95"]) < TOLERANCE


@pytest.mark.slow
def test_yolov5_repo_layout_onnx_source_matches_pt(
    tiny_source: Path, yolov5_repo_onnx: Path, labelled_folder: Path
) -> None:
    dataset = load_dataset(labelled_folder)
    model = load_model(yolov5_repo_onnx, IMGSZ)
    assert model.layout.value == "yolov5" and len(model.class_names) == 80
    model.runtime.close()
    _assert_same_metrics(
        evaluate_source_model(tiny_source, dataset, IMGSZ),
        evaluate_source_model(yolov5_repo_onnx, dataset, IMGSZ),
    )


def test_model_with_unknown_output_layout_is_refused(tmp_path: Path) -> None:
    path = tiny_onnx(tmp_path / "identity.onnx", size=32)  # output (B, 3, 32, 32)
    with pytest.raises(UnknownOutputLayoutError, match="must be 3-D"):
        load_model(path, 32)


@pytest.mark.parametrize(
    ("name", "match"),
    [("missing.onnx", "model file not found"), ("model.h5", "unsupported model format '.h5'")],
)
def test_load_model_bad_files(tmp_path: Path, name: str, match: str) -> None:
    (tmp_path / "model.h5").write_bytes(b"\0")
    with pytest.raises(ModelLoadError, match=match):
        load_model(tmp_path / name, 64)


def test_source_must_be_pt_or_onnx(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="must be .pt or .onnx"):
        evaluate_source_model(tmp_path / "m.tflite", load_dataset_stub(tmp_path), 64)


def load_dataset_stub(tmp_path: Path) -> Any:
    return load_dataset(_folder(tmp_path, {"a": ""}))


def test_torch_runtime_is_not_an_edge_runtime() -> None:
    assert "torch" not in _BUILTIN_MODULES


# --- TensorRT builder: pure parts and the refusal ----------------------------------------


def test_engine_settings_validation(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="1 <= min <= opt <= max"):
        EngineSettings(min_batch=4, opt_batch=2, max_batch=8)
    with pytest.raises(ExportError, match="multiple of 32"):
        EngineSettings(imgsz=100)
    with pytest.raises(ExportError, match="INT8 needs a calibration image folder"):
        EngineSettings(precision="int8")
    with pytest.raises(ExportError, match="precision must be fp16 or int8"):
        EngineSettings(precision="fp8")  # type: ignore[arg-type]
    cache = tmp_path / "calib.cache"
    cache.write_bytes(b"cache")
    assert EngineSettings(precision="int8", calibration_cache=cache).precision == "int8"


def test_profile_shapes() -> None:
    settings = EngineSettings(imgsz=320, min_batch=1, opt_batch=4, max_batch=8)
    assert profile_shapes((-1, 3, -1, -1), settings) == (
        (1, 3, 320, 320),
        (4, 3, 320, 320),
        (8, 3, 320, 320),
    )
    assert profile_shapes((-1, 3, 640, 640), settings)[2] == (8, 3, 640, 640)
    assert profile_shapes((1, 3, 640, 640), EngineSettings())[0] == (1, 3, 640, 640)
    with pytest.raises(ExportError, match="fixed batch of 1; re-export it with a dynamic batch"):
        profile_shapes((1, 3, 640, 640), settings)
    with pytest.raises(ExportError, match="NCHW with 3 channels"):
        profile_shapes((1, 640, 640, 3), settings)


def test_calibration_batches_are_letterboxed_full_batches(tmp_path: Path) -> None:
    for i in range(5):
        cv2.imwrite(str(tmp_path / f"{i}.jpg"), np.full((60, 90, 3), 40 * i, np.uint8))
    (tmp_path / "notes.txt").write_text("not an image")
    files = calibration_files(tmp_path, limit=100)
    assert len(files) == 5
    batches = list(calibration_batches(files, 2, (64, 64)))
    assert [b.shape for b in batches] == [(2, 3, 64, 64)] * 2  # the 5th image is dropped
    assert batches[0].dtype == np.float32 and 0.0 <= batches[1].min() <= batches[1].max() <= 1.0
    with pytest.raises(ExportError, match="holds no images"):
        calibration_files(_mkdir(tmp_path / "empty"), 10)
    with pytest.raises(ExportError, match="calibration folder not found"):
        calibration_files(tmp_path / "missing", 10)


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT present")
def test_build_engine_refuses_without_tensorrt(tmp_path: Path) -> None:
    with pytest.raises(RuntimeUnavailableError, match="TensorRT is not installed on this machine"):
        build_engine(tmp_path / "m.onnx", tmp_path / "m.engine", EngineSettings())


def test_nan_free_comparison_json_for_empty_classes(tmp_path: Path) -> None:
    from detection.coco_eval import GroundTruth, compute_metrics
    from detection.detections import Detections

    gt = GroundTruth(np.zeros((0, 4), np.float32), np.zeros(0, np.int64))
    result = compute_metrics([gt], [Detections.empty()])
    data = Comparison("a.pt", "b.onnx", result, result).to_dict()
    assert data["delta"]["map50_95"] is None and math.isnan(result.map50)
    json.dumps(data, allow_nan=False)
