"""Toolchain: model building, export errors, and what the cached exports look like."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from detection.runtimes.config import LiteRTConfig, OnnxRuntimeConfig
from detection.runtimes.litert import LiteRTRuntime
from detection.runtimes.onnx import OnnxRuntime
from detection.toolchain import ExportError, build_model, export_onnx, export_tflite_int8
from tests.fixtures.models import export_seconds


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda p: build_model(str(p / "missing.pt")), "weights file not found: .*missing.pt"),
        (lambda p: build_model("model.onnx"), "must be a .yaml name or a .pt file"),
        (lambda p: build_model("yolov5q.yaml"), "cannot build model 'yolov5q.yaml'"),
        (
            lambda p: export_tflite_int8("yolov5n.yaml", p / "out", 64, p / "no-such-dir"),
            "calibration folder not found: .*no-such-dir",
        ),
        (
            lambda p: export_tflite_int8("yolov5n.yaml", p / "out", 64, p / "empty"),
            "holds no images",
        ),
        (lambda p: export_onnx(str(p / "missing.pt"), p / "out", 64), "missing.pt"),
    ],
    ids=["missing-pt", "wrong-suffix", "unknown-yaml", "no-calibration", "empty-calibration",
         "export-missing-pt"],
)  # fmt: skip
def test_clear_errors(tmp_path: Path, call: Any, match: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not an image")
    with pytest.raises(ExportError, match=match):
        call(tmp_path)


@pytest.mark.slow
def test_seeded_builds_are_reproducible() -> None:
    first = build_model("yolov5n.yaml", seed=3).model.state_dict()
    second = build_model("yolov5n.yaml", seed=3).model.state_dict()
    other = build_model("yolov5n.yaml", seed=4).model.state_dict()
    name = next(k for k in first if k.endswith("conv.weight"))
    assert all(np.array_equal(first[k].numpy(), second[k].numpy()) for k in first)
    assert not np.array_equal(first[name].numpy(), other[name].numpy())


@pytest.mark.slow
def test_onnx_export_is_float32_nchw_dynamic(yolov5s_onnx: Path) -> None:
    assert yolov5s_onnx.name == "yolov5s_seed0.onnx"
    runtime = OnnxRuntime(OnnxRuntimeConfig(model_path=yolov5s_onnx))
    spec = runtime.input_spec
    assert (spec.layout, spec.height, spec.width, spec.max_batch_size) == ("NCHW", None, None, None)
    output = runtime.infer(np.zeros((1, 3, 256, 384), np.float32))  # any multiple of 32
    assert output.shape == (1, 84, (256 * 384) // 64 + (256 * 384) // 256 + (256 * 384) // 1024)
    assert export_seconds(yolov5s_onnx) > 0


@pytest.mark.slow
def test_tflite_int8_export_is_quantised_inside(yolov5s_tflite_int8: Path) -> None:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(yolov5s_tflite_int8))
    int8_tensors = [d for d in interpreter.get_tensor_details() if d["dtype"] == np.int8]
    assert len(int8_tensors) > 100  # weights and activations
    runtime = LiteRTRuntime(LiteRTConfig(model_path=yolov5s_tflite_int8))
    output = runtime.infer(np.zeros((1, 3, 320, 320), np.float32))
    assert output.shape == (1, 84, 2100)
    assert 0 <= output[:, :4].min() and output[:, :4].max() <= 2  # normalised boxes
    meta = json.loads((yolov5s_tflite_int8.parent / "meta.json").read_text())
    assert meta["ultralytics"] and meta["export_code"]
    # the head's box decoding stays float (its int8 step would be pixels), the convs are int8
    ops = interpreter._get_ops_details()
    tensors = {d["index"]: d for d in interpreter.get_tensor_details()}
    conv_types = [tensors[o["outputs"][0]]["dtype"] for o in ops if o["op_name"] == "CONV_2D"]
    assert conv_types.count(np.int8) > 50
    assert tensors[ops[-1]["outputs"][0]]["dtype"] == np.float32
    assert not any(o["op_name"] == "DEQUANTIZE" for o in ops[-3:])
