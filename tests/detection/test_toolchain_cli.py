"""`vision-toolchain`: export + accuracy check end to end, and one clear line per bad input."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from detection.toolchain.cli import main
from tests.detection import test_evaluate as world
from tests.fixtures.tiny_models import tiny_onnx

TOLERANCE = 2e-3
IMGSZ = world.IMGSZ
# the session fixtures of the generated test world, shared with test_evaluate
tiny_source = world.tiny_source
labelled_folder = world.labelled_folder
tiny_onnx_export = world.tiny_onnx_export
yolov5_repo_onnx = world.yolov5_repo_onnx


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_export_onnx_from_pt_with_accuracy_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_source: Path, labelled_folder: Path
) -> None:
    out = tmp_path / "out"
    code, stdout, err = run(
        capsys, "export", "--source", tiny_source, "--format", "onnx", "--imgsz", IMGSZ,
        "--out", out, "--eval-data", labelled_folder,
    )  # fmt: skip
    assert code == 0, err
    artefact = out / f"{tiny_source.stem}.onnx"
    assert f"exported {artefact.resolve()}" in stdout
    assert "| mAP50-95 |" in stdout
    report = json.loads((out / f"{artefact.name}.accuracy.json").read_text())
    assert (out / f"{artefact.name}.accuracy.md").read_text() in stdout
    assert report["source"]["overall"]["map50"] == pytest.approx(1.0, abs=1e-6)
    assert abs(report["delta"]["map50_95"]) < TOLERANCE
    assert abs(report["delta"]["map50"]) < TOLERANCE


@pytest.mark.slow
def test_export_onnx_from_yolov5_repo_onnx(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    yolov5_repo_onnx: Path,
    labelled_folder: Path,
) -> None:
    code, stdout, err = run(
        capsys, "export", "--source", yolov5_repo_onnx, "--format", "onnx", "--imgsz", IMGSZ,
        "--out", tmp_path, "--eval-data", labelled_folder,
    )  # fmt: skip
    assert code == 0, err
    assert (tmp_path / yolov5_repo_onnx.name).is_file()
    report = json.loads((tmp_path / f"{yolov5_repo_onnx.name}.accuracy.json").read_text())
    assert report["delta"]["map50_95"] == 0.0  # the very same file, run the same way
    assert report["export"]["overall"]["map50"] == pytest.approx(1.0, abs=TOLERANCE)


@pytest.mark.slow
def test_export_tflite_int8_with_accuracy_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_source: Path, labelled_folder: Path
) -> None:
    out = tmp_path / "out"
    code, stdout, err = run(
        capsys, "export", "--source", tiny_source, "--format", "tflite-int8", "--imgsz", IMGSZ,
        "--calibration", labelled_folder / "images", "--out", out,
        "--eval-data", labelled_folder,
    )  # fmt: skip
    assert code == 0, err
    artefact = out / f"{tiny_source.stem}_int8.tflite"
    report = json.loads((out / f"{artefact.name}.accuracy.json").read_text())
    assert report["export"]["model"] == artefact.name
    assert 0.0 <= report["export"]["overall"]["map50_95"] <= 1.0
    assert "| class | GT | AP50-95 source | AP50-95 export |" in stdout


@pytest.mark.slow
def test_evaluate_prints_the_metrics_table(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tiny_onnx_export: Path,
    labelled_folder: Path,
) -> None:
    code, stdout, err = run(
        capsys, "evaluate", "--model", tiny_onnx_export, "--data", labelled_folder,
        "--imgsz", IMGSZ, "--json", tmp_path / "m.json",
    )  # fmt: skip
    assert code == 0, err
    assert "| class | GT | predictions | AP50-95 | AP50 |" in stdout
    assert json.loads((tmp_path / "m.json").read_text())["overall"]["map50"] == pytest.approx(
        1.0, abs=TOLERANCE
    )


def _bad_inputs(tmp: Path) -> dict[str, Path]:
    """Files for the bad-input cases: a labelled folder, an empty folder, wrong files."""
    (tmp / "data" / "images").mkdir(parents=True)
    (tmp / "data" / "labels").mkdir()
    import cv2
    import numpy as np

    cv2.imwrite(str(tmp / "data" / "images" / "a.png"), np.zeros((64, 64, 3), np.uint8))
    (tmp / "data" / "labels" / "a.txt").write_text("0 0.5 0.5 0.5\n")
    (tmp / "empty").mkdir()
    (tmp / "empty" / "notes.txt").write_text("no images here")
    (tmp / "model.h5").write_bytes(b"\0")
    (tmp / "broken.onnx").write_bytes(b"not a protobuf")
    (tmp / "broken.pt").write_text("not a checkpoint")
    (tmp / "m.onnx").write_bytes(b"")  # only a name, for checks that run before loading
    tiny_onnx(tmp / "identity.onnx", size=32)  # a model whose output is (B, 3, 32, 32)
    return {}


NO_TENSORRT = importlib.util.find_spec("tensorrt") is None
EXPORT = ["export", "--out", "{tmp}/out"]
CASES = [
    ("missing-source", [*EXPORT, "--source", "{tmp}/nope.pt", "--format", "onnx"],
     "source model not found: .*nope.pt"),
    ("wrong-suffix", [*EXPORT, "--source", "{tmp}/model.h5", "--format", "onnx"],
     r"unsupported source format '\.h5'"),
    ("broken-pt", [*EXPORT, "--source", "{tmp}/broken.pt", "--format", "onnx"],
     "cannot build model .*broken.pt"),
    ("broken-onnx", [*EXPORT, "--source", "{tmp}/broken.onnx", "--format", "onnx"],
     "broken.onnx is not a valid ONNX model"),
    ("tflite-from-onnx", [*EXPORT, "--source", "{tmp}/m.onnx", "--format", "tflite-int8",
                          "--calibration", "{tmp}/empty"],
     "tflite-int8 from an ONNX source is not supported.*needs the ultralytics .pt"),
    ("no-calibration", [*EXPORT, "--source", "{tmp}/broken.pt", "--format", "tflite-int8"],
     "needs --calibration DIR"),
    ("empty-calibration", [*EXPORT, "--source", "{tmp}/broken.pt", "--format", "tflite-int8",
                           "--calibration", "{tmp}/empty"],
     "calibration folder .*empty holds no images"),
    ("missing-calibration", [*EXPORT, "--source", "{tmp}/broken.pt", "--format", "tflite-int8",
                             "--calibration", "{tmp}/nowhere"],
     "calibration folder not found"),
    ("unknown-layout-export", [*EXPORT, "--source", "{tmp}/identity.onnx", "--format", "onnx",
                               "--imgsz", "32"],
     "YOLO output must be 3-D .* got shape \\(1, 3, 32, 32\\)"),
    ("bad-eval-data", [*EXPORT, "--source", "{tmp}/identity.onnx", "--format", "onnx",
                       "--eval-data", "{tmp}/data"],
     r"a\.txt:1: expected 5 fields"),
    ("evaluate-missing-model", ["evaluate", "--model", "{tmp}/nope.onnx", "--data", "{tmp}/data"],
     "model file not found"),
    ("evaluate-wrong-suffix", ["evaluate", "--model", "{tmp}/model.h5", "--data", "{tmp}/data"],
     r"unsupported model format '\.h5'"),
    ("evaluate-missing-data", ["evaluate", "--model", "{tmp}/identity.onnx",
                               "--data", "{tmp}/nowhere"],
     "dataset not found"),
    ("evaluate-no-images", ["evaluate", "--model", "{tmp}/identity.onnx", "--data", "{tmp}/empty"],
     "expected an images/ folder"),
    ("evaluate-unknown-layout", ["evaluate", "--model", "{tmp}/identity.onnx",
                                 "--data", "{tmp}/data", "--imgsz", "32"],
     r"a\.txt:1: expected 5 fields"),
]  # fmt: skip
if NO_TENSORRT:
    CASES.append(
        ("no-tensorrt", [*EXPORT, "--source", "{tmp}/m.onnx", "--format", "tensorrt"],
         "TensorRT is not installed on this machine; build the engine on the target GPU"),
    )  # fmt: skip


@pytest.mark.parametrize(("argv", "match"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_gives_one_clear_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], match: str
) -> None:
    _bad_inputs(tmp_path)
    code, stdout, err = run(capsys, *[a.format(tmp=tmp_path) for a in argv])
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("vision-toolchain: error: ")
    assert re.search(match, err), err


def test_unknown_layout_with_a_valid_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _bad_inputs(tmp_path)
    (tmp_path / "data" / "labels" / "a.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    code, _, err = run(
        capsys, "evaluate", "--model", tmp_path / "identity.onnx", "--data", tmp_path / "data",
        "--imgsz", "32",
    )  # fmt: skip
    assert code == 2 and "YOLO output must be 3-D" in err


def test_missing_litert_torch_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _bad_inputs(tmp_path)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "litert_torch" else real(name)
    )
    code, _, err = run(
        capsys, "export", "--source", tmp_path / "broken.pt", "--format", "tflite-int8",
        "--calibration", tmp_path / "data" / "images", "--out", tmp_path / "out",
    )  # fmt: skip
    assert code == 2
    assert "INT8 TFLite export needs `litert_torch`, which is not installed" in err


def test_argument_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["export", "--source", "m.pt", "--format", "coreml", "--out", "x"])
    assert exc.value.code == 2
    assert "invalid choice: 'coreml'" in capsys.readouterr().err


@pytest.mark.process
def test_module_entry_point_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "detection.toolchain", "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0
    assert "export" in result.stdout and "evaluate" in result.stdout
