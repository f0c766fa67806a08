"""FP16-stored weights: half the file, the same outputs within float16 rounding, FP32 compute."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from detection.errors import ExportError
from detection.toolchain.fp16 import store_weights_fp16


def test_half_size_and_same_outputs(yolov5s_onnx: Path, tmp_path: Path) -> None:
    target = store_weights_fp16(yolov5s_onnx, tmp_path / "m-fp16w.onnx")
    assert target.stat().st_size < 0.55 * yolov5s_onnx.stat().st_size
    model = onnx.load(str(target))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    x = np.random.default_rng(0).random((2, 3, 320, 320), dtype=np.float32)
    outputs = []
    for path in (yolov5s_onnx, target):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs.append(session.run(None, {session.get_inputs()[0].name: x})[0])
    np.testing.assert_allclose(outputs[1][:, :4], outputs[0][:, :4], atol=0.5)  # pixels at 320
    np.testing.assert_allclose(outputs[1][:, 4:], outputs[0][:, 4:], atol=1e-3)


def test_missing_source_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="ONNX model not found"):
        store_weights_fp16(tmp_path / "none.onnx", tmp_path / "out.onnx")
