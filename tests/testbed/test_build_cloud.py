"""`testbed.build_cloud`: the verdict on a further-trained cloud model and the manifest it
rewrites (the training itself is the slow part, run by hand: see the module docstring)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from testbed.accuracy import AccuracyRow
from testbed.build_cloud import (
    CANDIDATE_LABEL,
    CLOUD_KEY,
    CURRENT_LABEL,
    main,
    updated_manifest,
    verdict_of,
)


def _row(model: str, scenario: str, map50: float) -> AccuracyRow:
    return AccuracyRow(model, scenario, map50 / 2, map50, 0.1, 0.2, 0.3, 10, 5)


def _rows(current: dict[str, float], candidate: dict[str, float]) -> list[AccuracyRow]:
    return [_row(CURRENT_LABEL, s, v) for s, v in current.items()] + [
        _row(CANDIDATE_LABEL, s, v) for s, v in candidate.items()
    ]


def test_a_candidate_is_kept_only_when_the_mean_rises_and_no_scenario_falls_far() -> None:
    before = {"quiet": 0.90, "small_far": 0.50}
    better = verdict_of(_rows(before, {"quiet": 0.895, "small_far": 0.60}), max_drop=0.01)
    assert better.failures() == [] and better.mean_gain == pytest.approx(0.0475)
    worse_on_one = verdict_of(_rows(before, {"quiet": 0.85, "small_far": 0.70}), max_drop=0.01)
    assert worse_on_one.failures() == ["quiet mAP50 drops 0.0500 (0.900 -> 0.850; at most 0.01)"]
    flat = verdict_of(_rows(before, before), max_drop=0.01)
    assert flat.failures() == ["mean mAP50 does not improve (+0.0000)"]
    with pytest.raises(ValueError, match="same scenarios"):
        verdict_of(_rows(before, {"quiet": 0.9}), max_drop=0.01)


def test_the_manifest_keeps_the_history_and_swaps_the_cloud_rows(tmp_path: Path) -> None:
    model = tmp_path / "cloud.onnx"
    model.write_bytes(b"weights")
    edge_row = _row("edge YOLOv5n TFLite INT8 @320", "quiet", 0.8).__dict__
    manifest: dict[str, Any] = {
        "models": {CLOUD_KEY: {"file": "cloud/cloud.onnx", "epochs": 12, "train_seconds": 100.0}},
        "accuracy": [edge_row, _row(CURRENT_LABEL, "quiet", 0.9).__dict__],
        "accuracy_table": "old",
    }
    run = {"epochs": 10, "seconds": 50.0, "seed": 1}
    out = updated_manifest(manifest, model, run, _rows({"quiet": 0.9}, {"quiet": 0.95}))
    entry = out["models"][CLOUD_KEY]
    assert entry["sha256"] == hashlib.sha256(b"weights").hexdigest() and entry["bytes"] == 7
    assert (entry["epochs"], entry["train_seconds"], entry["continued"]) == (22, 150.0, [run])
    assert [(a["model"], a["map50"]) for a in out["accuracy"]] == [
        ("edge YOLOv5n TFLite INT8 @320", 0.8),
        (CURRENT_LABEL, 0.95),
    ]
    assert "| quiet | cloud YOLOv5s ONNX @640 | 0.475 | 0.950 |" in out["accuracy_table"]
    assert manifest["models"][CLOUD_KEY]["epochs"] == 12  # the input is left alone


def test_bad_arguments_are_refused_before_anything_slow(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--seed", "0"], ["--epochs", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
    assert "--seed 0 is the committed build's training set" in capsys.readouterr().err
    manifest = Path(__file__).resolve().parents[2] / "models" / "manifest.json"
    assert json.loads(manifest.read_text())  # untouched, still readable
