"""Toolchain steps on the committed edge network: structured pruning and the INT8 block search."""

from __future__ import annotations

import json
import re
from pathlib import Path

import cv2
import numpy as np
import pytest

from detection.toolchain import ExportError
from detection.toolchain.export import export_tflite_float
from detection.toolchain.onnx_weights import checkpoint_from_onnx, trainable_checkpoint_from_onnx
from detection.toolchain.prune import count_macs, prune_checkpoint
from detection.toolchain.sensitivity import block_pattern, blocks_of, search, tensor_names

MODELS = Path(__file__).resolve().parents[2] / "models"
EDGE_ONNX = MODELS / "edge" / "edge-yolov5n-320.onnx"
CLASS_NAMES = json.loads((MODELS / "manifest.json").read_text())["class_names"]


def _images(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 255, (360, 640, 3), dtype=np.uint8) for _ in range(count)]


@pytest.fixture(scope="module")
def trainable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trainable") / "edge.pt"
    return trainable_checkpoint_from_onnx(EDGE_ONNX, "yolov5n.yaml", CLASS_NAMES, _images(4), out)


@pytest.mark.slow
def test_pruning_removes_a_third_of_the_work_and_keeps_the_output_layout(
    trainable: Path, tmp_path: Path
) -> None:
    import torch

    result = prune_checkpoint(trainable, tmp_path / "pruned.pt", 0.15)

    assert result.macs_saved >= 0.30 and result.params_after < result.params_before
    model = torch.load(result.path, weights_only=False)["model"].eval()
    assert count_macs(model, 320)[0] == pytest.approx(result.macs_after)
    with torch.no_grad():
        output = model(torch.zeros(1, 3, 320, 320))[0]
    assert tuple(output.shape) == (1, 4 + len(CLASS_NAMES), 2100)  # boxes + classes, 3 scales


def test_pruning_refuses_bad_input(trainable: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="ratio"):
        prune_checkpoint(trainable, tmp_path / "p.pt", 0.95)
    with pytest.raises(ExportError, match="not found"):
        prune_checkpoint(tmp_path / "none.pt", tmp_path / "p.pt", 0.2)
    fused = checkpoint_from_onnx(EDGE_ONNX, "yolov5n.yaml", CLASS_NAMES, tmp_path / "fused.pt")
    with pytest.raises(ExportError, match="fused"):
        prune_checkpoint(fused, tmp_path / "p.pt", 0.2)


@pytest.mark.slow
def test_the_int8_search_finds_the_blocks_and_keeps_the_best_variant(tmp_path: Path) -> None:
    fused = checkpoint_from_onnx(EDGE_ONNX, "yolov5n.yaml", CLASS_NAMES, tmp_path / "e.pt")
    float_model = export_tflite_float(str(fused), tmp_path / "float", 320)
    names = tensor_names(float_model)
    blocks = blocks_of(names)
    assert blocks[:3] == ["Conv_0", "Conv_1", "C3_2"] and "SPPF_9" in blocks
    assert blocks[-3:] == [f"Detect_24/Sequential_{i}" for i in range(3)] and len(blocks) == 21
    for block in ("Conv_0", "C3_4", "Detect_24/Sequential_1"):
        pattern = re.compile(block_pattern(block))
        assert any(pattern.match(n) for n in names)
    assert not any(re.compile(block_pattern("Conv_1")).match(n) for n in names if "Conv_10" in n)

    calibration = []
    for number, image in enumerate(_images(3)):
        calibration.append(tmp_path / f"c{number}.jpg")
        cv2.imwrite(str(calibration[-1]), image)
    scored: list[Path] = []

    def score(model: Path) -> float:  # the more blocks stay float, the better, in this stand-in
        scored.append(model)
        return {"int8": 0.50, "float-Conv_0": 0.52, "float-C3_2": 0.51}.get(model.stem, 0.53)

    result = search(
        float_model, calibration, (320, 320), score, 0.54, tmp_path / "search",
        max_drop=0.015, blocks=["C3_2", "Conv_0"],
    )  # fmt: skip

    assert result.sensitivity == pytest.approx({"C3_2": 0.01, "Conv_0": 0.02})
    assert [s.float_blocks for s in result.steps] == [("Conv_0",)]  # 0.54 - 0.53 <= 0.015
    assert result.chosen.float_blocks == ("Conv_0",) and result.chosen.path.is_file()
    assert [p.stem for p in scored] == ["int8", "float-C3_2", "float-Conv_0", "mixed-1"]


def test_the_prune_command_says_what_is_wrong_in_one_line(
    trainable: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from detection.toolchain.cli import main

    base = ["prune", "--data", str(tmp_path / "data.yaml"), "--out", str(tmp_path / "out"),
            "--work", str(tmp_path / "work")]  # fmt: skip
    cases = [
        (["--source", str(tmp_path / "none.pt")], "source model not found"),
        (["--source", str(trainable), "--ratio", "0.95"], "pruning ratio must be in (0, 0.9)"),
    ]
    for extra, message in cases:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("vision-toolchain: error: ") and message in err[-1], err
    assert not (tmp_path / "out").exists()
