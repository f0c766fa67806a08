"""Detector: config validation, the pipeline on a scripted runtime, real YOLOv5s end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector, InvalidImageError, ModelConfigError
from detection.letterbox import letterbox_batch
from detection.nms import box_iou
from detection.runtimes.base import InputSpec
from detection.runtimes.config import LiteRTConfig, OnnxRuntimeConfig

INPUT = 64  # scripted model input side
NUM_CLASSES = 3


class ScriptedRuntime:
    """A `Runtime` that returns fixed anchor-free rows `(cx, cy, w, h, scores...)` per image."""

    name = "scripted"

    def __init__(self, rows: list[list[float]], spec: InputSpec | None = None) -> None:
        self.rows = np.asarray(rows, np.float32)
        self._spec = spec or InputSpec(INPUT, INPUT, "NCHW", None)
        self.batches: list[int] = []
        self.inputs: list[np.ndarray[Any, np.dtype[np.float32]]] = []
        self.closed = False

    @property
    def input_spec(self) -> InputSpec:
        return self._spec

    def infer(self, images: np.ndarray[Any, np.dtype[np.float32]]) -> Any:
        self.batches.append(images.shape[0])
        self.inputs.append(images.copy())
        return np.repeat(self.rows.T[None], images.shape[0], axis=0)  # (B, 4+C, N)

    def close(self) -> None:
        self.closed = True


def _config(**overrides: Any) -> DetectorConfig:
    """Config for the scripted runtime: naming its 3 classes settles the tiny output's layout."""
    overrides.setdefault("class_names", ["a", "b", "c"])
    return DetectorConfig(runtime=OnnxRuntimeConfig(model_path=Path("unused.onnx")), **overrides)


def _frame(h: int = 100, w: int = 200) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return np.full((h, w, 3), 50, np.uint8)


# A 200x100 frame letterboxes into 64x64 with scale 0.32 and 16 px of padding top and bottom.
BOX = [32.0, 32.0, 32.0, 16.0]  # cx, cy, w, h in model-input pixels
BOX_IN_SOURCE = [50.0, 25.0, 150.0, 75.0]


# --- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"confidence_threshold": 1.5}, "less than or equal to 1"),
        ({"iou_threshold": -0.1}, "greater than or equal to 0"),
        ({"max_detections": 0}, "greater than or equal to 1"),
        ({"input_size": (320, 300)}, "multiples of 32"),
        ({"input_size": (0, 320)}, "multiples of 32"),
        ({"box_units": "inches"}, "'auto', 'pixels' or 'normalized'"),
        ({"score_threshold": 0.5}, "Extra inputs are not permitted"),
    ],
)
def test_config_rejects_bad_values(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        _config(**overrides)


def test_config_parses_runtime_by_type_and_names_classes() -> None:
    config = DetectorConfig.model_validate(
        {"runtime": {"type": "litert", "model_path": "m.tflite"}, "class_names": ["person", "car"]}
    )
    assert isinstance(config.runtime, LiteRTConfig)
    assert [config.class_name(i) for i in (0, 1, 7)] == ["person", "car", "7"]
    assert all(f.description for f in DetectorConfig.model_fields.values())


# --- pipeline on a scripted runtime ----------------------------------------------------------


def test_boxes_come_back_in_source_pixels() -> None:
    runtime = ScriptedRuntime([[*BOX, 0.9, 0.1, 0.0]])
    [result] = Detector(runtime, _config()).detect([_frame()])
    np.testing.assert_allclose(result.xyxy, [BOX_IN_SOURCE], atol=1e-3)
    np.testing.assert_allclose(result.confidence, [0.9])
    assert result.class_id.tolist() == [0]
    assert result.tracker_id.tolist() == [-1]


# A 40x20 crop (w x h) in the 64x64 input: enlarged by 1.6 with 16 px of padding top and bottom
# by default; at native scale (scale_up=False) centred with 12 px left and 22 px top.
CROP_HW = (20, 40)
CROP_BOX_SCALED_UP = [10.0, 5.0, 30.0, 15.0]  # BOX (input x 16..48, y 24..40) mapped back
CROP_BOX_NATIVE = [4.0, 2.0, 36.0, 18.0]


@pytest.mark.parametrize(
    ("scale_up", "expected_boxes"),
    [
        (True, [CROP_BOX_SCALED_UP] * 2),
        (False, [CROP_BOX_NATIVE] * 2),
        ([True, False], [CROP_BOX_SCALED_UP, CROP_BOX_NATIVE]),
        ((False, True), [CROP_BOX_NATIVE, CROP_BOX_SCALED_UP]),
    ],
    ids=["default", "native", "mixed", "mixed-tuple"],
)
def test_scale_up_per_image_maps_boxes_back(
    scale_up: bool | list[bool] | tuple[bool, ...], expected_boxes: list[list[float]]
) -> None:
    runtime = ScriptedRuntime([[*BOX, 0.9, 0.0, 0.0]])
    crop = _frame(*CROP_HW)

    results = Detector(runtime, _config()).detect([crop, crop], scale_up=scale_up)

    assert runtime.batches == [2]  # one batch, whatever the flags
    for result, expected in zip(results, expected_boxes, strict=True):
        np.testing.assert_allclose(result.xyxy, [expected], atol=1e-4)


def test_native_scale_crop_is_placed_unscaled_in_the_input() -> None:
    runtime = ScriptedRuntime([[*BOX, 0.9, 0.0, 0.0]])
    crop = np.random.default_rng(1).integers(0, 256, (*CROP_HW, 3), dtype=np.uint8)

    Detector(runtime, _config()).detect([crop], scale_up=False)

    (batch,) = runtime.inputs
    placed = batch[0][:, 22:42, 12:52]  # RGB CHW 0..1
    np.testing.assert_allclose(placed, crop[:, :, ::-1].transpose(2, 0, 1) / 255, atol=1e-6)
    outside = np.ones((INPUT, INPUT), dtype=bool)
    outside[22:42, 12:52] = False
    np.testing.assert_allclose(batch[0][:, outside], 114 / 255, atol=1e-6)


def test_large_frames_shrink_whatever_scale_up_says() -> None:
    runtime = ScriptedRuntime([[*BOX, 0.9, 0.0, 0.0]])
    detector = Detector(runtime, _config())
    [default] = detector.detect([_frame()])
    [native] = detector.detect([_frame()], scale_up=False)
    np.testing.assert_allclose(native.xyxy, default.xyxy)
    np.testing.assert_allclose(native.xyxy, [BOX_IN_SOURCE], atol=1e-3)


def test_scale_up_flags_must_match_the_images() -> None:
    from detection.errors import DetectionError

    detector = Detector(ScriptedRuntime([[*BOX, 0.9, 0.0, 0.0]]), _config())
    with pytest.raises(DetectionError, match="1 flags for 2 images"):
        detector.detect([_frame(), _frame()], scale_up=[False])


@pytest.mark.parametrize(
    ("overrides", "expected_scores"),
    [
        ({}, [0.9, 0.7]),  # the 0.8 box overlaps the 0.9 box of the same class
        ({"class_agnostic_nms": True}, [0.9]),  # the 0.7 box (other class) overlaps too
        ({"iou_threshold": 1.0}, [0.9, 0.8, 0.7]),
        ({"max_detections": 1}, [0.9]),
        ({"confidence_threshold": 0.85}, [0.9]),
        # a and b one group: the b twin of the 0.9 a box goes (IoU about 0.94 > 0.8)
        ({"class_groups": [["a", "b"]]}, [0.9]),
        ({"class_groups": [["a", "b"]], "class_group_iou": 0.95}, [0.9, 0.7]),
        ({"class_groups": [["a", "c"]]}, [0.9, 0.7]),  # b is in no group
        ({"class_groups": [["a", "zebra"]]}, [0.9, 0.7]),  # a group of one known class
    ],
    ids=[
        "per-class",
        "agnostic",
        "no-suppression",
        "max-detections",
        "threshold",
        "group",
        "group-below-iou",
        "other-group",
        "unknown-names",
    ],
)
def test_nms_and_limits(overrides: dict[str, Any], expected_scores: list[float]) -> None:
    shifted = [BOX[0] + 1, *BOX[1:]]
    runtime = ScriptedRuntime(
        [
            [*BOX, 0.9, 0.0, 0.0],
            [*shifted, 0.8, 0.0, 0.0],
            [*shifted, 0.0, 0.7, 0.0],
            [*BOX, 0.0, 0.0, 0.1],  # below the default 0.25
        ]
    )
    [result] = Detector(runtime, _config(**overrides)).detect([_frame()])
    np.testing.assert_allclose(result.confidence, expected_scores, atol=1e-6)


@pytest.mark.parametrize(
    ("max_batch", "images", "expected_calls"),
    [(None, 5, [5]), (2, 5, [2, 2, 1]), (1, 2, [1, 1])],
)
def test_batches_are_split_to_the_runtime_limit(
    max_batch: int | None, images: int, expected_calls: list[int]
) -> None:
    runtime = ScriptedRuntime([[*BOX, 0.9, 0.0, 0.0]], InputSpec(INPUT, INPUT, "NCHW", max_batch))
    results = Detector(runtime, _config()).detect([_frame()] * images)
    assert runtime.batches == expected_calls
    assert len(results) == images
    assert all(len(r) == 1 for r in results)


def test_input_size_is_required_for_dynamic_models_and_must_match_fixed_ones() -> None:
    dynamic = ScriptedRuntime([[*BOX, 0.9, 0.0, 0.0]], InputSpec(None, None, "NCHW", None))
    with pytest.raises(ModelConfigError, match="dynamic input size; set input_size"):
        Detector(dynamic, _config())
    assert Detector(dynamic, _config(input_size=(64, 96))).input_shape == (64, 96)
    with pytest.raises(ModelConfigError, match=r"does not match the model's fixed size \(64, 64\)"):
        Detector(ScriptedRuntime([[*BOX, 0.9, 0.0, 0.0]]), _config(input_size=(320, 320)))


def test_a_dynamic_model_fits_its_input_to_each_frame_and_batches_alike_shapes() -> None:
    dynamic = ScriptedRuntime([[*BOX, 0.9, 0.0, 0.0]], InputSpec(None, None, "NCHW", None))
    detector = Detector(dynamic, _config(input_size=(64, 64)))
    wide, tall = _frame(100, 200), _frame(200, 100)
    results = detector.detect([wide, tall, wide])
    # one run per shape, first seen first: the two wide frames at 32x64, the tall one at 64x32
    assert [x.shape for x in dynamic.inputs] == [(2, 3, 32, 64), (1, 3, 64, 32)]
    assert detector.input_shapes_for([wide, tall], [True, True]) == [(32, 64), (64, 32)]
    np.testing.assert_array_equal(results[0].xyxy, results[2].xyxy)  # answers in frame order
    assert not np.array_equal(results[0].xyxy, results[1].xyxy)
    fixed = ScriptedRuntime([[*BOX, 0.9, 0.0, 0.0]], InputSpec(None, None, "NCHW", None))
    Detector(fixed, _config(input_size=(64, 64), letterbox="fixed")).detect([wide, tall])
    assert [x.shape for x in fixed.inputs] == [(2, 3, 64, 64)]
    square = ScriptedRuntime([[*BOX, 0.9, 0.0, 0.0]])  # a fixed-size model keeps its size
    Detector(square, _config()).detect([wide])
    assert [x.shape for x in square.inputs] == [(1, 3, 64, 64)]


def test_fitted_input_finds_the_same_objects_on_real_frames(bus_image: Any) -> None:
    model = Path(__file__).resolve().parents[2] / "models" / "coco" / "nanodet-coco-int8.onnx"
    wide = np.ascontiguousarray(bus_image[300:756, :])  # 810x456, about 16:9
    found: dict[str, list[Detections]] = {}
    for letterbox in ("fit", "fixed"):
        config = DetectorConfig(
            runtime=OnnxRuntimeConfig(model_path=model, intra_op_threads=1),
            input_size=(320, 320),
            letterbox=letterbox,
        )
        with Detector.from_config(config) as detector:
            found[letterbox] = detector.detect([bus_image, wide])
    # the confident objects are the same (weak ones near the cut padding may differ); the INT8
    # kernels' rounding moves with onnxruntime's version: one person's box overlaps its fitted
    # twin by 0.82 under 1.32, above 0.85 under 1.20-1.24
    for fit, fixed in zip(found["fit"], found["fixed"], strict=True):
        sure = fixed[fixed.confidence >= 0.4]
        assert len(sure) >= 1
        iou = box_iou(sure.xyxy, fit.xyxy)
        assert (iou.max(axis=1) > 0.75).all(), (sure, fit)


@pytest.mark.parametrize(
    ("image", "match"),
    [
        (np.zeros((10, 10, 3), np.float32), "image 1: expected dtype uint8, got float32"),
        (np.zeros((10, 10), np.uint8), r"image 1: expected shape \(H, W, 3\)"),
        (np.zeros((10, 10, 4), np.uint8), r"image 1: expected shape \(H, W, 3\)"),
        (np.zeros((0, 10, 3), np.uint8), r"image 1: expected shape \(H, W, 3\)"),
        ([[1, 2, 3]], "image 1: expected numpy array, got list"),
    ],
    ids=["float32", "gray", "bgra", "empty", "list"],
)
def test_bad_images_are_rejected_with_their_index(image: Any, match: str) -> None:
    detector = Detector(ScriptedRuntime([[*BOX, 0.9, 0.0, 0.0]]), _config())
    with pytest.raises(InvalidImageError, match=match):
        detector.detect([_frame(), image])


def test_no_images_no_results_and_context_manager_closes() -> None:
    runtime = ScriptedRuntime([[*BOX, 0.9, 0.0, 0.0]])
    with Detector(runtime, _config()) as detector:
        assert detector.detect([]) == []
        assert runtime.batches == []
    assert runtime.closed


# --- class names, box units and the classes filter from the model's metadata -----------------


class MetadataRuntime(ScriptedRuntime):
    """A scripted runtime whose model carries metadata (as ONNX `metadata_props` do)."""

    def __init__(self, rows: list[list[float]], metadata: dict[str, str]) -> None:
        super().__init__(rows)
        self.metadata = metadata


ABC_JSON = '["a", "b", "c"]'


@pytest.mark.parametrize(
    ("configured", "metadata", "expected"),
    [
        (["x", "y", "z"], {}, ("x", "y", "z")),
        ([], {"class_names": ABC_JSON}, ("a", "b", "c")),
        (["x", "y", "z"], {"class_names": ABC_JSON}, ("x", "y", "z")),  # the config wins
        ([], {"names": "{0: 'p', 1: 'q', 2: 'r'}"}, ("p", "q", "r")),  # an ultralytics export
        ([], {"class_names": ABC_JSON, "names": "{0: 'p'}"}, ("a", "b", "c")),
        ([], {"names": "{0: 'p', 2: 'r'}"}, ()),  # ids with a gap: not read
        ([], {}, ()),
    ],
    ids=["config", "metadata", "both", "ultralytics", "ours-first", "gap", "none"],
)
def test_class_names_come_from_the_config_else_the_model(
    configured: list[str], metadata: dict[str, str], expected: tuple[str, ...]
) -> None:
    runtime = MetadataRuntime([[*BOX, 0.9, 0.1, 0.0]], metadata)
    detector = Detector(runtime, _config(class_names=configured))
    assert detector.class_names == expected
    assert detector.class_name(0) == (expected[0] if expected else "0")
    assert detector.class_name(7) == "7"
    assert detector.metadata == metadata


@pytest.mark.parametrize(
    ("configured", "metadata", "match"),
    [
        (
            ["x", "y"],
            {"class_names": ABC_JSON},
            r"class_names in the config names 2 classes \(x, y\) but the model unused.onnx has 3 "
            r"\(a, b, c\)",
        ),
        ([], {"class_names": "person,car"}, "metadata is not a JSON list of names"),
        ([], {"class_names": "[1, 2]"}, "metadata is not a JSON list of names"),
        ([], {"box_units": "inches"}, "`box_units` metadata is 'inches'"),
    ],
    ids=["count-mismatch", "not-json", "not-names", "bad-box-units"],
)
def test_metadata_that_does_not_fit_is_a_clear_error(
    configured: list[str], metadata: dict[str, str], match: str
) -> None:
    runtime = MetadataRuntime([[*BOX, 0.9, 0.1, 0.0]], metadata)
    with pytest.raises(ModelConfigError, match=match):
        Detector(runtime, _config(class_names=configured))


@pytest.mark.parametrize(
    ("configured", "metadata", "expected"),
    [
        ("auto", {"box_units": "normalized"}, "normalized"),
        ("auto", {"box_units": "pixels"}, "pixels"),
        ("auto", {}, "auto"),
        ("pixels", {"box_units": "normalized"}, "pixels"),  # the config wins
    ],
)
def test_box_units_come_from_the_metadata_when_the_config_says_auto(
    configured: str, metadata: dict[str, str], expected: str
) -> None:
    normalized_box = [v / INPUT for v in BOX]
    runtime = MetadataRuntime([[*normalized_box, 0.9, 0.0, 0.0]], metadata)
    detector = Detector(runtime, _config(box_units=configured))
    assert detector.box_units == expected
    [result] = detector.detect([_frame()])
    if expected == "pixels":  # taken at its word: a box of a few pixels at the frame's corner
        assert result.xyxy.max() < 5.0
    else:  # scaled to the input, as `auto` guesses from the values too
        np.testing.assert_allclose(result.xyxy, [BOX_IN_SOURCE], atol=1e-3)


# A box of class a (0.9) overlapping one of class b (0.7): class-agnostic NMS keeps only a,
# unless the filter drops a first.
OVERLAPPING = [[*BOX, 0.9, 0.0, 0.0], [BOX[0] + 1, *BOX[1:], 0.0, 0.7, 0.0], [*BOX, 0, 0, 0.5]]


@pytest.mark.parametrize(
    ("classes", "metadata", "expected"),
    [
        ([], {}, [(0, 0.9)]),
        (["b"], {}, [(1, 0.7)]),  # filtered before NMS: a no longer suppresses b
        (["c", "b"], {}, [(1, 0.7)]),  # b suppresses the overlapping c
        (["c"], {}, [(2, 0.5)]),
        (["b"], {"class_names": ABC_JSON}, [(1, 0.7)]),  # names from the model
    ],
    ids=["all", "one", "two", "other", "model-names"],
)
def test_classes_filter_keeps_only_those_classes_before_nms(
    classes: list[str], metadata: dict[str, str], expected: list[tuple[int, float]]
) -> None:
    names = [] if metadata else ["a", "b", "c"]
    runtime = MetadataRuntime(OVERLAPPING, metadata)
    config = _config(class_names=names, classes=classes, class_agnostic_nms=True)
    [result] = Detector(runtime, config).detect([_frame()])
    got = [(c, round(score, 3)) for _, score, c, _ in result]
    assert got == expected


@pytest.mark.parametrize(("classes", "kept"), [([], None), (["c", "a"], (0, 2))])
def test_the_kept_class_ids_are_the_filters(classes: list[str], kept: object) -> None:
    """What fusion drops of the cloud's answers (classes this camera does not detect)."""
    config = _config(class_names=["a", "b", "c"], classes=classes)
    assert Detector(MetadataRuntime(OVERLAPPING, {}), config).kept_class_ids == kept


def test_classes_filter_names_must_be_known() -> None:
    with pytest.raises(ValidationError, match=r"unknown class 'dog'; the classes of class_names"):
        _config(classes=["a", "dog"])
    runtime = MetadataRuntime(OVERLAPPING, {"class_names": ABC_JSON})
    with pytest.raises(
        ModelConfigError,
        match=r"unknown class 'dog'; the classes of the model unused.onnx are: a, b, c",
    ):
        Detector(runtime, _config(class_names=[], classes=["dog"]))
    runtime = MetadataRuntime(OVERLAPPING, {})
    with pytest.raises(ModelConfigError, match="needs class names"):
        Detector(runtime, _config(class_names=[], classes=["a"]))


# --- real models ----------------------------------------------------------------------------


class TorchRuntime:
    """The ultralytics torch model behind the `Runtime` protocol (reference for comparisons)."""

    name = "torch"

    def __init__(self, model: Any, size: int) -> None:
        self._model = model
        self._spec = InputSpec(size, size, "NCHW", None)

    @property
    def input_spec(self) -> InputSpec:
        return self._spec

    def infer(self, images: Any) -> Any:
        import torch

        with torch.no_grad():
            return self._model(torch.from_numpy(images))[0].numpy()

    def close(self) -> None:
        pass


def _check_valid(result: Detections, frame: np.ndarray[Any, Any], limit: int) -> None:
    h, w = frame.shape[:2]
    assert 0 < len(result) <= limit
    assert np.all(result.xyxy >= 0)
    assert np.all(result.xyxy[:, [0, 2]] <= w) and np.all(result.xyxy[:, [1, 3]] <= h)
    assert np.all(np.diff(result.confidence) <= 0)  # highest confidence first
    assert np.all((result.class_id >= 0) & (result.class_id < 80))


def _threshold_in_a_gap(scores: np.ndarray[Any, Any]) -> float:
    """A threshold letting a few % of anchors in, set in the widest gap between their scores.

    Random weights give class scores of ~1e-5 with many near-ties; a threshold far from every
    score keeps float rounding differences between runtimes from flipping a box in or out.
    """
    top = np.unique(scores)[-max(len(scores) // 50, 2) :]
    i = int(np.argmax(np.diff(top) / top[1:]))
    return float((top[i] + top[i + 1]) / 2)


@pytest.mark.slow
def test_onnx_detector_on_bus_matches_the_torch_pipeline(
    yolov5s_onnx: Path, yolov5s_torch: Any, bus_image: Any
) -> None:
    reference = TorchRuntime(yolov5s_torch, 320)
    frames = [bus_image, np.ascontiguousarray(bus_image[:200, :300])]
    batch, _ = letterbox_batch(frames, (320, 320))
    threshold = _threshold_in_a_gap(reference.infer(batch)[:, 4:].max(axis=1).ravel())
    config = DetectorConfig(
        runtime=OnnxRuntimeConfig(model_path=yolov5s_onnx, intra_op_threads=2),
        input_size=(320, 320),
        letterbox="fixed",  # the reference runs the same square input
        confidence_threshold=threshold,
        max_detections=50,
    )
    with Detector.from_config(config) as detector:
        results = detector.detect(frames)
    expected = Detector(reference, config).detect(frames)
    for frame, got, want in zip(frames, results, expected, strict=True):
        _check_valid(got, frame, 50)
        assert len(got) == len(want)
        np.testing.assert_allclose(got.xyxy, want.xyxy, atol=0.05)  # source pixels
        np.testing.assert_allclose(got.confidence, want.confidence, rtol=1e-3)
        assert got.class_id.tolist() == want.class_id.tolist()


@pytest.mark.slow
def test_tflite_int8_detector_on_bus_gives_valid_source_boxes(
    yolov5s_tflite_int8: Path, bus_image: Any
) -> None:
    # random weights score near zero (as the torch model does): threshold 0 lets boxes through
    config = DetectorConfig(
        runtime=LiteRTConfig(model_path=yolov5s_tflite_int8),
        confidence_threshold=0.0,
        max_detections=20,
        iou_threshold=0.3,
    )
    with Detector.from_config(config) as detector:
        assert detector.input_shape == (320, 320)
        [result] = detector.detect([bus_image])
    _check_valid(result, bus_image, 20)
    # NMS ran in model-input pixels; clipping to the frame can raise overlaps afterwards, so
    # only identical boxes would show NMS failed
    overlap = box_iou(result.xyxy, result.xyxy)
    np.fill_diagonal(overlap, 0)
    assert overlap.max() < 0.999


COCO = Path(__file__).resolve().parents[2] / "models" / "coco"


def test_coco_model_names_its_classes_and_the_filter_keeps_one(bus_image: Any) -> None:
    runtime = OnnxRuntimeConfig(model_path=COCO / "nanodet-coco-fp32.onnx", intra_op_threads=2)
    config = DetectorConfig(runtime=runtime, input_size=(480, 640), confidence_threshold=0.3)
    with Detector.from_config(config) as detector:
        assert len(detector.class_names) == 80 and detector.box_units == "pixels"
        assert detector.class_names[:3] == ("person", "bicycle", "car")
        [everything] = detector.detect([bus_image])
    labels = [detector.class_name(int(c)) for c in everything.class_id]
    assert labels.count("person") >= 3 and "bus" in labels, labels  # four people and a bus
    with Detector.from_config(config.model_copy(update={"classes": ["bus"]})) as detector:
        [buses] = detector.detect([bus_image])
    assert len(buses) >= 1 and {detector.class_name(int(c)) for c in buses.class_id} == {"bus"}


def test_from_config_reports_a_missing_model(tmp_path: Path) -> None:
    from detection.errors import ModelLoadError

    config = DetectorConfig(runtime=OnnxRuntimeConfig(model_path=tmp_path / "nope.onnx"))
    with pytest.raises(ModelLoadError, match="nope.onnx"):
        Detector.from_config(config)
