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


@pytest.mark.slow
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


def test_the_trainable_checkpoint_computes_the_export_with_batch_norms_back(
    tmp_path: Path,
) -> None:
    import torch
    from ultralytics.nn.tasks import DetectionModel

    from detection.toolchain.onnx_weights import trainable_checkpoint_from_onnx

    rng = np.random.default_rng(5)
    images = [rng.integers(0, 255, (360, 640, 3), dtype=np.uint8) for _ in range(4)]
    out = trainable_checkpoint_from_onnx(
        EDGE_ONNX, "yolov5n.yaml", CLASS_NAMES, images, tmp_path / "t.pt"
    )
    model = torch.load(out, weights_only=False)["model"]
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(norms) == 69 and all(float(n.running_var.mean()) != 1.0 for n in norms)

    probe = np.random.default_rng(3).random((1, 3, 320, 320), dtype=np.float32)
    session = ort.InferenceSession(str(EDGE_ONNX), providers=["CPUExecutionProvider"])
    reference = session.run(None, {session.get_inputs()[0].name: probe})[0]
    with torch.no_grad():
        rebuilt = model.eval()(torch.from_numpy(probe))[0].numpy()
    assert float(np.abs(rebuilt - reference).max()) < 0.01

    # ultralytics' trainer builds the unfused architecture and keeps the weights whose names
    # and shapes match: every one of them must
    fresh = DetectionModel("yolov5n.yaml", nc=len(CLASS_NAMES), verbose=False)
    state = model.state_dict()
    assert set(fresh.state_dict()) == set(state)
    assert all(fresh.state_dict()[k].shape == v.shape for k, v in state.items())
