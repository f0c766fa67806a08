"""Runtimes: registry, tiny hand-built models (layout, dtype, quantisation, batch), real YOLOv5s."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from detection.errors import ModelLoadError, RuntimeUnavailableError
from detection.letterbox import letterbox_batch
from detection.runtimes.base import (
    Runtime,
    available_runtimes,
    create_runtime,
    read_model_metadata,
    runtime_metadata,
)
from detection.runtimes.config import LiteRTConfig, OnnxRuntimeConfig, TensorRTConfig
from detection.runtimes.litert import LiteRTRuntime, dequantize, quantize
from detection.runtimes.onnx import OnnxRuntime
from tests.fixtures.tiny_models import TensorQuant, tiny_onnx, tiny_tflite

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
IMGSZ = 320


@pytest.fixture
def images() -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.random.default_rng(0).random((3, 3, 8, 8), dtype=np.float32)


def _torch_output(model: Any, batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    import torch

    with torch.no_grad():
        return np.asarray(model(torch.from_numpy(batch))[0].numpy())


# --- registry -------------------------------------------------------------------------------


def test_available_runtimes_lists_the_backends_that_import_here() -> None:
    names = available_runtimes()
    assert {"onnxruntime", "litert"} <= set(names)
    # tensorrt.py imports without TensorRT (it imports tensorrt in the constructor)
    assert "tensorrt" in names


def test_unknown_runtime_type_is_a_clear_error() -> None:
    class Config:
        type = "openvino"

    with pytest.raises(RuntimeUnavailableError, match="'openvino' is not available"):
        create_runtime(Config())


@pytest.mark.parametrize(
    ("make_config", "expected"),
    [
        (lambda p: OnnxRuntimeConfig(model_path=tiny_onnx(p / "m.onnx")), OnnxRuntime),
        (lambda p: LiteRTConfig(model_path=tiny_tflite(p / "m.tflite")), LiteRTRuntime),
    ],
)
def test_create_runtime_builds_the_configured_backend(
    tmp_path: Path, make_config: Any, expected: type
) -> None:
    runtime = create_runtime(make_config(tmp_path))
    assert isinstance(runtime, expected)
    assert isinstance(runtime, Runtime)
    runtime.close()


# --- model metadata -------------------------------------------------------------------------

META = {"class_names": '["person", "car"]', "model_name": "tiny", "box_units": "pixels"}
COCO = Path(__file__).resolve().parents[2] / "models" / "coco"


def _onnx_with_metadata(path: Path, metadata: dict[str, str]) -> Path:
    import onnx

    model = onnx.load(str(tiny_onnx(path)))
    onnx.helper.set_model_props(model, metadata)
    onnx.save(model, str(path))
    return path


def _tflite_with_metadata(path: Path, metadata: dict[str, str]) -> Path:
    import flatbuffers
    from ai_edge_litert import schema_py_generated as tfl

    model = tfl.ModelT.InitFromObj(tfl.Model.GetRootAs(tiny_tflite(path).read_bytes(), 0))
    model.metadata = list(model.metadata or [])
    for name, value in metadata.items():
        buffer = tfl.BufferT()
        buffer.data = list(value.encode())
        model.buffers.append(buffer)
        entry = tfl.MetadataT()
        entry.name, entry.buffer = name, len(model.buffers) - 1
        model.metadata.append(entry)
    binary = tfl.BufferT()  # a binary entry (as CONVERSION_METADATA): left out
    binary.data = [0xFF, 0xFE, 0x00, 0x81]
    model.buffers.append(binary)
    entry = tfl.MetadataT()
    entry.name, entry.buffer = "binary", len(model.buffers) - 1
    model.metadata.append(entry)
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    path.write_bytes(bytes(builder.Output()))
    return path


@pytest.mark.parametrize(
    ("make_config", "expected"),
    [
        (lambda p: OnnxRuntimeConfig(model_path=_onnx_with_metadata(p / "m.onnx", META)), META),
        (lambda p: OnnxRuntimeConfig(model_path=tiny_onnx(p / "m.onnx")), {}),
        (lambda p: LiteRTConfig(model_path=_tflite_with_metadata(p / "m.tflite", META)), META),
        (lambda p: LiteRTConfig(model_path=tiny_tflite(p / "m.tflite")), {}),
    ],
    ids=["onnx", "onnx-none", "tflite", "tflite-none"],
)
def test_runtimes_expose_the_model_metadata(
    tmp_path: Path, make_config: Any, expected: dict[str, str]
) -> None:
    config = make_config(tmp_path)
    runtime = create_runtime(config)
    try:
        got = runtime_metadata(runtime)
        assert {k: v for k, v in got.items() if k in META or not expected} == expected
        assert "binary" not in got
        assert dict(read_model_metadata(config)) == dict(got)  # the same, without a runtime
    finally:
        runtime.close()


@pytest.mark.parametrize("name", ["nanodet-coco-fp32.onnx", "nanodet-coco-int8.onnx"])
def test_the_coco_models_carry_their_class_names_and_identity(name: str) -> None:
    metadata = read_model_metadata(OnnxRuntimeConfig(model_path=COCO / name))
    names = json.loads(metadata["class_names"])
    assert len(names) == 80 and names[0] == "person" and names[-1] == "toothbrush"
    assert (metadata["model_name"], metadata["box_units"]) == ("nanodet-coco", "pixels")
    assert metadata["model_version"]


def test_runtime_metadata_of_a_runtime_without_any_is_empty() -> None:
    class Bare:
        name = "bare"

    class Odd:
        metadata = {"ok": "yes", 3: "int key", "bad": 4}

    assert dict(runtime_metadata(Bare())) == {}
    assert dict(runtime_metadata(Odd())) == {"ok": "yes"}
    assert dict(read_model_metadata(TensorRTConfig(engine_path=Path("absent.engine")))) == {}


# --- load errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make_config", "match"),
    [
        (lambda p: OnnxRuntimeConfig(model_path=p / "missing.onnx"), "not found: .*missing.onnx"),
        (lambda p: LiteRTConfig(model_path=p / "missing.tflite"), "not found: .*missing.tflite"),
        (lambda p: OnnxRuntimeConfig(model_path=p / "bad.onnx"), "cannot load ONNX .*bad.onnx"),
        (lambda p: LiteRTConfig(model_path=p / "bad.tflite"), "cannot load TFLite .*bad.tflite"),
        (
            lambda p: LiteRTConfig(
                model_path=tiny_tflite(p / "m.tflite"), delegate_path=p / "missing.so"
            ),
            "delegate library not found: .*missing.so",
        ),
        (
            lambda p: LiteRTConfig(
                model_path=tiny_tflite(p / "m.tflite"), delegate_path=p / "bad.so"
            ),
            "cannot load LiteRT delegate .*bad.so",
        ),
        (
            lambda p: LiteRTConfig(
                model_path=tiny_tflite(p / "m.tflite", input_quant=TensorQuant(np.int8))
            ),
            "no quantisation scale",
        ),
    ],
    ids=["onnx-missing", "tflite-missing", "onnx-corrupt", "tflite-corrupt", "delegate-missing",
         "delegate-not-a-library", "int8-without-scale"],
)  # fmt: skip
# ai_edge_litert's Delegate.__del__ trips over its own failed __init__: not ours to fix
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_load_errors_name_the_file(tmp_path: Path, make_config: Any, match: str) -> None:
    for name in ("bad.onnx", "bad.tflite", "bad.so"):
        (tmp_path / name).write_bytes(b"not a model \x00\x01\x02" * 10)
    with pytest.raises(ModelLoadError, match=match):
        create_runtime(make_config(tmp_path))


def test_onnx_unavailable_providers_are_skipped_and_none_left_is_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = tiny_onnx(tmp_path / "m.onnx")
    with caplog.at_level(logging.INFO, logger="detection.runtimes.onnx"):
        runtime = OnnxRuntime(
            OnnxRuntimeConfig(
                model_path=model, providers=["NoSuchProvider", "CPUExecutionProvider"]
            )
        )
    assert "NoSuchProvider not available" in caplog.text
    runtime.close()
    with pytest.raises(RuntimeUnavailableError, match="NoSuchProvider"):
        OnnxRuntime(OnnxRuntimeConfig(model_path=model, providers=["NoSuchProvider"]))


# --- tiny models: layout, dtype, quantisation, batch -----------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "layout", "max_batch", "atol"),
    [
        ({}, "NCHW", None, 0.0),
        ({"layout": "NHWC"}, "NHWC", None, 0.0),
        ({"fp16": True}, "NCHW", None, 1e-3),  # float16 keeps ~3 decimal digits
        ({"batch": 2}, "NCHW", 2, 0.0),  # fixed batch 2: 3 images run as 2 + (1 + padding)
    ],
    ids=["nchw", "nhwc", "fp16", "fixed-batch-2"],
)
def test_onnx_tiny_models(
    tmp_path: Path, images: Any, kwargs: dict[str, Any], layout: str, max_batch: Any, atol: float
) -> None:
    runtime = OnnxRuntime(OnnxRuntimeConfig(model_path=tiny_onnx(tmp_path / "m.onnx", **kwargs)))
    assert runtime.input_spec.layout == layout
    assert runtime.input_spec.max_batch_size == max_batch
    assert (runtime.input_spec.height, runtime.input_spec.width) == (8, 8)
    output = runtime.infer(images)
    assert output.dtype == np.float32
    np.testing.assert_allclose(output, images, rtol=0, atol=atol)


_STEP = 1 / 255  # quantisation step of an image in 0..1 as int8 / uint8: error <= step / 2


@pytest.mark.parametrize(
    ("kwargs", "layout", "atol"),
    [
        ({}, "NHWC", 0.0),
        ({"layout": "NCHW"}, "NCHW", 0.0),
        ({"input_quant": TensorQuant(np.int8, _STEP, -128)}, "NHWC", _STEP / 2 + 1e-6),
        ({"input_quant": TensorQuant(np.uint8, _STEP, 0)}, "NHWC", _STEP / 2 + 1e-6),
        ({"output_quant": TensorQuant(np.int8, 0.01, 5)}, "NHWC", 0.005 + 1e-6),
        ({"dynamic_batch": True}, "NHWC", 0.0),
    ],
    ids=["nhwc-float", "nchw-float", "int8-io", "uint8-io", "float-in-int8-out", "dynamic-batch"],
)
def test_litert_tiny_models(
    tmp_path: Path, images: Any, kwargs: dict[str, Any], layout: str, atol: float
) -> None:
    runtime = LiteRTRuntime(LiteRTConfig(model_path=tiny_tflite(tmp_path / "m.tflite", **kwargs)))
    assert runtime.input_spec.layout == layout
    for batch in (images[:1], images):  # batch 1, then 3 (resized or looped)
        output = runtime.infer(batch)
        assert output.dtype == np.float32
        np.testing.assert_allclose(output, batch, rtol=0, atol=atol)


@pytest.mark.parametrize(
    ("layout", "resized"), [("NHWC", True), ("NCHW", False)], ids=["transpose", "baked-reshape"]
)
def test_litert_batch_resizes_when_the_graph_allows_else_loops(
    tmp_path: Path, images: Any, caplog: pytest.LogCaptureFixture, layout: str, resized: bool
) -> None:
    runtime = LiteRTRuntime(LiteRTConfig(model_path=tiny_tflite(tmp_path / "m.tflite", layout)))
    with caplog.at_level(logging.INFO, logger="detection.runtimes.litert"):
        np.testing.assert_array_equal(runtime.infer(images), images)
        np.testing.assert_array_equal(runtime.infer(images[:2]), images[:2])
    assert ("cannot take batch" in caplog.text) is not resized


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_quantize_round_trip_saturates(dtype: type[np.integer[Any]]) -> None:
    info = np.iinfo(dtype)
    zero_point = -128 if dtype is np.int8 else 0
    values = np.array([-1.0, 0.0, 0.5, 1.0, 2.0], np.float32)
    q = quantize(values, dtype, _STEP, zero_point)
    assert q.dtype == dtype
    assert q[0] == info.min and q[-1] == info.max  # out of range saturates
    np.testing.assert_allclose(dequantize(q, _STEP, zero_point)[1:4], values[1:4], atol=_STEP)


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        (np.zeros((1, 3, 8, 8), np.float64), "float32"),
        (np.zeros((3, 8, 8), np.float32), r"\(B>=1, 3, H, W\)"),
        (np.zeros((1, 8, 8, 3), np.float32), r"\(B>=1, 3, H, W\)"),
        (np.zeros((1, 3, 16, 8), np.float32), "height is 8, got 16"),
    ],
    ids=["float64", "rank-3", "nhwc-given", "wrong-size"],
)
def test_infer_rejects_bad_input(tmp_path: Path, batch: Any, match: str) -> None:
    for runtime in (
        OnnxRuntime(OnnxRuntimeConfig(model_path=tiny_onnx(tmp_path / "m.onnx", batch=1))),
        LiteRTRuntime(LiteRTConfig(model_path=tiny_tflite(tmp_path / "m.tflite"))),
    ):
        with pytest.raises(ValueError, match=match):
            runtime.infer(batch)


# --- real YOLOv5s: ONNX and INT8 TFLite against the torch model -------------------------------


@pytest.fixture(scope="module")
def letterboxed(bus_image: Any) -> np.ndarray[Any, np.dtype[np.float32]]:
    """bus.jpg and its mirror, letterboxed to 320x320."""
    batch, _ = letterbox_batch([bus_image, bus_image[:, ::-1].copy()], (IMGSZ, IMGSZ))
    return batch


@pytest.mark.slow
def test_onnx_yolov5s_matches_torch(
    yolov5s_onnx: Path, yolov5s_torch: Any, letterboxed: Any
) -> None:
    runtime = OnnxRuntime(OnnxRuntimeConfig(model_path=yolov5s_onnx, intra_op_threads=2))
    spec = runtime.input_spec
    assert (spec.height, spec.width, spec.max_batch_size) == (None, None, None)  # dynamic export
    output = runtime.infer(letterboxed)
    reference = _torch_output(yolov5s_torch, letterboxed)
    assert output.shape == reference.shape == (2, 84, 2100)
    # fp32 both sides; the ONNX graph has Conv+BN folded, so only rounding differs
    np.testing.assert_allclose(output[:, :4], reference[:, :4], rtol=1e-4, atol=1e-2)  # pixels
    np.testing.assert_allclose(output[:, 4:], reference[:, 4:], rtol=1e-3, atol=1e-6)  # scores
    # batch of 2 equals two batches of 1
    np.testing.assert_allclose(runtime.infer(letterboxed[1:]), output[1:], rtol=1e-5, atol=1e-3)


def _box_iou_rows(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """IoU of box i in `a` with box i in `b`, both `(N, 4)` cx, cy, w, h."""
    a_lo, a_hi = a[:, :2] - a[:, 2:] / 2, a[:, :2] + a[:, 2:] / 2
    b_lo, b_hi = b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2
    inter = np.prod(np.clip(np.minimum(a_hi, b_hi) - np.maximum(a_lo, b_lo), 0, None), axis=1)
    union = np.prod(a[:, 2:], axis=1) + np.prod(b[:, 2:], axis=1) - inter
    return np.asarray(inter / np.maximum(union, 1e-9))


@pytest.mark.slow
def test_tflite_int8_yolov5s_boxes_track_torch(
    yolov5s_tflite_int8: Path, yolov5s_torch: Any, letterboxed: Any
) -> None:
    runtime = LiteRTRuntime(LiteRTConfig(model_path=yolov5s_tflite_int8, num_threads=2))
    spec = runtime.input_spec
    assert (spec.height, spec.width, spec.layout) == (IMGSZ, IMGSZ, "NCHW")
    output = runtime.infer(letterboxed)  # batch 2 on a batch-1 model: looped
    reference = _torch_output(yolov5s_torch, letterboxed)
    assert output.shape == reference.shape
    boxes = output[:, :4].transpose(0, 2, 1).reshape(-1, 4) * IMGSZ  # normalised -> pixels
    ref_boxes = reference[:, :4].transpose(0, 2, 1).reshape(-1, 4)
    # INT8 moves each box by a few quantisation steps; judge the boxes as boxes: nearly every
    # anchor's INT8 box overlaps its float box closely, and the coordinates correlate.
    iou = _box_iou_rows(boxes, ref_boxes)
    assert np.median(iou) > 0.95, np.median(iou)
    assert np.quantile(iou, 0.05) > 0.8, np.quantile(iou, 0.05)
    assert np.corrcoef(boxes.ravel(), ref_boxes.ravel())[0, 1] > 0.999
    scores = output[:, 4:]
    assert np.all((scores >= 0) & (scores <= 1))


# --- TensorRT -------------------------------------------------------------------------------


@pytest.mark.skipif(HAS_TENSORRT, reason="TensorRT is installed here")
def test_tensorrt_runtime_says_clearly_when_tensorrt_is_absent(tmp_path: Path) -> None:
    config = TensorRTConfig(engine_path=tmp_path / "model.engine")
    with pytest.raises(RuntimeUnavailableError, match="TensorRT is not installed"):
        create_runtime(config)


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TENSORRT, reason="TensorRT not installed")
def test_tensorrt_yolov5s_matches_onnx(
    tmp_path: Path, yolov5s_onnx: Path, letterboxed: Any
) -> None:  # pragma: no cover - needs TensorRT and a GPU
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(yolov5s_onnx.read_bytes()), parser.get_error(0)
    profile = builder.create_optimization_profile()
    name = network.get_input(0).name
    shape = (3, IMGSZ, IMGSZ)
    profile.set_shape(name, (1, *shape), (2, *shape), (4, *shape))
    build_config = builder.create_builder_config()
    build_config.add_optimization_profile(profile)
    engine_path = tmp_path / "yolov5s.engine"
    engine_path.write_bytes(bytes(builder.build_serialized_network(network, build_config)))

    runtime = create_runtime(TensorRTConfig(engine_path=engine_path, max_batch_size=4))
    assert runtime.input_spec.max_batch_size == 4
    output = runtime.infer(np.concatenate([letterboxed] * 3))  # 6 images: batches of 4 + 2
    reference = OnnxRuntime(OnnxRuntimeConfig(model_path=yolov5s_onnx)).infer(letterboxed)
    np.testing.assert_allclose(output[:2], reference, rtol=1e-3, atol=5e-2)  # TF32 on the GPU
    np.testing.assert_allclose(output[4:], reference, rtol=1e-3, atol=5e-2)
    runtime.close()
