"""Rebuilding the edge model's checkpoint from its committed ONNX export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from detection.toolchain import ExportError, export_onnx
from detection.toolchain.onnx_weights import checkpoint_from_onnx

MODELS = Path(__file__).resolve().parents[2] / "models"
EDGE_ONNX = MODELS / "edge" / "edge-yolov5n-320.onnx"
CLASS_NAMES = json.loads((MODELS / "manifest.json").read_text())["class_names"]


def test_the_rebuilt_checkpoint_exports_the_committed_network_at_any_shape(
    tmp_path: Path,
) -> None:
    checkpoint = checkpoint_from_onnx(EDGE_ONNX, "yolov5n.yaml", CLASS_NAMES, tmp_path / "e.pt")
    again = export_onnx(str(checkpoint), tmp_path / "onnx", 320, dynamic=True)

    probe = np.random.default_rng(3).random((1, 3, 192, 320), dtype=np.float32)  # 16:9
    outputs = []
    for model in (EDGE_ONNX, again):
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        outputs.append(session.run(None, {session.get_inputs()[0].name: probe})[0])
    assert outputs[0].shape == outputs[1].shape == (1, 8, 1260)
    difference = np.abs(outputs[0] - outputs[1])
    assert float(difference[:, :4].max()) < 0.5  # box coordinates, input pixels
    assert float(difference[:, 4:].max()) < 0.01  # class scores


def test_weights_of_another_architecture_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="yolov5s.yaml"):
        checkpoint_from_onnx(EDGE_ONNX, "yolov5s.yaml", CLASS_NAMES, tmp_path / "s.pt")
    with pytest.raises(ExportError, match="classes"):
        checkpoint_from_onnx(EDGE_ONNX, "yolov5n.yaml", [*CLASS_NAMES, "bus"], tmp_path / "n.pt")
    assert not list(tmp_path.iterdir())
