"""`vision-toolchain export/distill --publish STORE --key KEY`: what it admits, signed in the store.

The publish step runs on an already-exported small model (the committed edge ONNX, copied and
checked by `export --format onnx`), not on a fresh training run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detection.toolchain.cli import main
from detection.toolchain.publish import (
    PublishTarget,
    admitted_from_accuracy,
    admitted_from_distill,
    publish_model,
    sha256_of,
)
from fleet.signing import Verifier
from fleet.store import DirectoryStore

pytestmark = pytest.mark.process  # `fleet publish` runs as a child process

MODELS = Path(__file__).resolve().parents[2] / "models"
EDGE_ONNX = MODELS / "edge/edge-yolov5n-320.onnx"
EDGE_TFLITE = MODELS / "edge/edge-yolov5n-320-int8.tflite"


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_export_publishes_what_it_exported(
    tmp_path: Path, key: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    code, out, err = run(
        capsys, "export", "--source", EDGE_ONNX, "--format", "onnx", "--imgsz", "320",
        "--out", tmp_path / "out", "--publish", store, "--key", key[0],
        "--publish-name", "edge-det", "--publish-version", "7",
    )  # fmt: skip
    assert code == 0, err
    assert "published edge-det:7@" in out
    signed = DirectoryStore(store).read_manifest("edge-det", "7")
    assert signed is not None
    manifest = signed.verified(Verifier([key[1]]))
    assert manifest.sha256 == sha256_of(EDGE_ONNX)
    assert manifest.input == (320, 320) and manifest.runtime == "onnx"
    assert manifest.classes == ["person", "car", "truck", "forklift"]
    assert manifest.admitted == {}  # no --eval-data: no check admitted it beyond the layout
    assert manifest.derived_from is None  # the same bytes as its source


def test_publish_carries_the_admitting_metrics(tmp_path: Path, key: tuple[Path, str]) -> None:
    accuracy = {
        "source": {"model": "a.pt", "overall": {"map50": 0.80, "map50_95": 0.50}},
        "export": {"model": "a.onnx", "overall": {"map50": 0.79, "map50_95": 0.49}},
        "delta": {"map50": -0.01, "map50_95": None},
    }
    admitted = admitted_from_accuracy(accuracy)
    assert admitted == {"map50": 0.79, "map50_95": 0.49, "map50_change_vs_source": -0.01}
    target = PublishTarget(tmp_path / "store", key[0], "edge-det", "8")
    out = publish_model(EDGE_ONNX, target, admitted, derived_from="ab" * 32, input_size=(320, 320))
    assert "published edge-det:8@" in out
    signed = DirectoryStore(tmp_path / "store").read_manifest("edge-det", "8")
    assert signed is not None
    assert signed.manifest.admitted == admitted
    assert signed.manifest.derived_from == "ab" * 32


def test_admitted_from_a_distillation_report() -> None:
    report = {
        "camera": "gate",
        "held_out_images": 40,
        "before": {"camera_map50": 0.5, "camera_map50_95": 0.3, "general_map50": 0.7,
                   "general_map50_95": None},
        "after": {"camera_map50": 0.6, "camera_map50_95": 0.35, "general_map50": 0.698,
                  "general_map50_95": 0.4},
    }  # fmt: skip
    admitted = admitted_from_distill(report)
    assert admitted["camera_map50"] == 0.6
    assert admitted["camera_map50_gain"] == pytest.approx(0.1)
    assert admitted["general_map50_change"] == pytest.approx(-0.002)
    assert admitted["held_out_images"] == 40
    assert "general_map50_95" in admitted and "camera_map50_95_gain" not in admitted


def test_a_refused_publish_is_one_line(
    tmp_path: Path, key: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    target = PublishTarget(store, key[0], "edge-det", "1")
    publish_model(EDGE_TFLITE, target, {})  # edge-det:1 taken by another artefact
    code, _, err = run(
        capsys, "export", "--source", EDGE_ONNX, "--format", "onnx", "--imgsz", "320",
        "--out", tmp_path / "out", "--publish", store, "--key", key[0],
        "--publish-name", "edge-det", "--publish-version", "1",
    )  # fmt: skip
    assert code == 2
    assert err.count("\n") == 1
    assert "publishing edge-yolov5n-320.onnx refused: fleet: edge-det:1 is already published" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--publish", "{tmp}/s"], "--publish needs --key KEYFILE"),
        (["--key", "{tmp}/k.pem"], "--key is for --publish STORE"),
        (["--publish", "{tmp}/s", "--key", "{tmp}/missing.pem"], "signing key not found"),
        (
            ["--publish", "{tmp}/s", "--key", "{key}", "--publish-version", "a/b"],
            "--publish-version 'a/b'",
        ),
    ],
)
def test_bad_publish_options(
    tmp_path: Path,
    key: tuple[Path, str],
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    argv = [a.format(tmp=tmp_path, key=key[0]) for a in extra]
    code, _, err = run(
        capsys, "export", "--source", EDGE_ONNX, "--format", "onnx", "--imgsz", "320",
        "--out", tmp_path / "out", *argv,
    )  # fmt: skip
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists()  # refused before any export work


def test_published_manifest_is_plain_json(tmp_path: Path, key: tuple[Path, str]) -> None:
    target = PublishTarget(tmp_path / "store", key[0])
    publish_model(EDGE_ONNX, target, {"map50": 0.5}, input_size=(320, 320))
    (path,) = (tmp_path / "store/models").glob("*/*[0-9]Z.json")
    assert path.parent.name == "edge-yolov5n-320"
    assert json.loads(path.read_text())["manifest"]["admitted"] == {"map50": 0.5}
