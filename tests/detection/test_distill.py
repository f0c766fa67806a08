"""Distillation: the label store's records in, a fine-tuned INT8 edge model out, or a refusal.

The loop runs for real on a short schedule: a generated camera's frames go through the real
`LabelStore` with answers standing in for the cloud, `distill` fine-tunes the committed edge
network (rebuilt from its ONNX export with batch norms re-inserted), exports INT8 TFLite and
scores it; the handed-over file is then swapped into a running agent by a reload. A model trained
on wrong labels is refused: one line, exit 2, nothing handed over.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.models.edge_distill import SITES, site_frames, store_escalations
from detection.coco_eval import GroundTruth
from detection.label_format import LabelFormatError, read_camera_records
from detection.toolchain.cli import main as toolchain_main
from detection.toolchain.distill import DistillReport, DistillSettings, Scores, _verdict, distill
from detection.toolchain.distill_data import (
    LabelCut,
    held_out_dataset,
    split_by_time,
    write_training_set,
)
from detection.toolchain.train import FineTuneSpec
from protos.analytics.v1 import analytics_pb2 as pb
from testbed.scenes.dataset import DatasetConfig, write_dataset
from tests.edge_agent import test_model_swap
from tests.edge_agent.test_model_swap import _reload, _Running

MODELS = Path(__file__).resolve().parents[2] / "models"
EDGE_ONNX = MODELS / "edge" / "edge-yolov5n-320.onnx"
EDGE_INT8 = MODELS / "edge" / "edge-yolov5n-320-int8.tflite"
NAMES = ("person", "car", "truck", "forklift")
CAMERA = "yard"
FRAMES = 40

running = test_model_swap.running  # a running agent on the events scene (fixture)


def _truth_answer(shift: float = 0.0, rotate: int = 0) -> Callable[..., list[pb.Detection]]:
    """A cloud that answers the ground truth (at 0.9, every third box at 0.2: uncertain), or
    wrong labels: boxes shifted by `shift` of their width, classes rotated by `rotate`."""

    def answer(_image: np.ndarray, truth: GroundTruth) -> list[pb.Detection]:
        found = []
        for number, ((x1, y1, x2, y2), c) in enumerate(
            zip(truth.xyxy, truth.class_id, strict=True)
        ):
            dx = (x2 - x1) * shift
            cls = (int(c) + rotate) % len(NAMES)
            found.append(
                pb.Detection(
                    class_id=cls,
                    class_name=NAMES[cls],
                    score=0.2 if number % 3 == 2 else 0.9,
                    x1=float(x1 + dx),
                    y1=float(y1),
                    x2=float(x2 + dx),
                    y2=float(y2),
                )  # fmt: skip
            )
        return found

    return answer


@pytest.fixture(scope="module")
def general(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("general")
    config = DatasetConfig(scenes_per_split=(1, 1, 0), frames_per_scene=60, every_n_frames=5)
    write_dataset(config, root, Path(__file__).resolve().parents[2] / ".cache" / "media")
    return root / "data.yaml"


def _store(root: Path, answer: Callable[..., list[pb.Detection]]) -> Path:
    frames = site_frames(SITES["day"], 980_000, FRAMES, 6)
    assert store_escalations(frames, CAMERA, root / "labels", answer) == FRAMES
    return root / "labels"


def _settings(labels: Path, general: Path, root: Path, **changes: Any) -> DistillSettings:
    settings = {
        "labels": labels, "camera": CAMERA, "base": EDGE_ONNX, "current": EDGE_INT8,
        "general_data": general, "out": root / "out", "work": root / "work",
        "replay_data": general, **changes,
    }  # fmt: skip
    return DistillSettings(**settings)


def test_the_store_reads_back_in_time_order_and_splits_by_time(tmp_path: Path) -> None:
    labels = _store(tmp_path, _truth_answer())
    (tmp_path / "labels" / CAMERA / "2026-11-18" / "broken.json").write_text("{not json")
    found = read_camera_records(labels, CAMERA)
    records = found.records
    assert len(records) == FRAMES and len(found.skipped) == 1
    assert [r.frame_id for r in records] == list(range(FRAMES))
    train, held = split_by_time(records, 0.25)
    assert (len(train), len(held)) == (30, 10) and held[0].capture_s > train[-1].capture_s

    cut = LabelCut()  # labels from 0.3, uncertain from 0.15
    held_set = held_out_dataset(held, cut, NAMES)
    ignored = sum(int(i.ground_truth.ignore.sum()) for i in held_set.images)
    total = sum(len(r.score) for r in held)
    assert 0 < ignored < total  # the 0.2 boxes are neither hits nor misses
    written = write_training_set(train, cut, NAMES, tmp_path / "set")
    lines = sum(len(p.read_text().splitlines()) for p in (tmp_path / "set/labels/train").iterdir())
    assert lines == written.label_boxes > 0 and written.masked_boxes > 0
    with pytest.raises(LabelFormatError, match="no label folder"):
        read_camera_records(labels, "gate")
    with pytest.raises(Exception, match="at least 10"):
        split_by_time(records[:5], 0.2)


def test_the_verdict_refuses_a_model_worse_on_the_camera_or_on_the_general_set() -> None:
    settings = _settings(Path("l"), Path("g"), Path("r"))
    before = Scores(0.50, 0.30, 0.80, 0.50)
    assert _verdict(settings, before, Scores(0.60, 0.35, 0.798, 0.49))[0]
    accepted, reason = _verdict(settings, before, Scores(0.49, 0.30, 0.80, 0.50))
    assert not accepted and reason.startswith("not better on the camera")
    accepted, reason = _verdict(settings, before, Scores(0.70, 0.40, 0.79, 0.45))
    assert not accepted and reason.startswith("forgets the general set")
    accepted, reason = _verdict(settings, before, Scores(0.40, 0.20, 0.70, 0.40))
    assert not accepted and "camera" in reason and "; forgets the general set" in reason


@pytest.fixture(scope="module")
def distilled(tmp_path_factory: pytest.TempPathFactory, general: Path) -> DistillReport:
    """The loop on a short schedule (before any agent starts: the scene it plays is short)."""
    root = tmp_path_factory.mktemp("distill")
    labels = _store(root, _truth_answer())
    # a short schedule cannot be relied on to improve: accept any result, check the mechanics
    settings = _settings(labels, general, root, min_camera_gain=-1.0, max_general_drop=1.0)
    return distill(settings, FineTuneSpec(imgsz=320, epochs=2, batch=8))


@pytest.mark.slow
def test_the_loop_distills_exports_and_hands_over_a_model_the_agent_swaps_in(
    distilled: DistillReport, running: tuple[_Running, dict[str, Any], Path]
) -> None:
    report = distilled
    model = Path(report.model)
    assert report.accepted and model.parent.name == "out" and model.is_file()
    assert model.name.startswith(f"edge-{CAMERA}-") and model.name.endswith("-int8.tflite")
    saved = json.loads(model.with_name(f"{model.name}.distill.json").read_text())
    assert saved["train_images"] == 32 and saved["held_out_images"] == 8
    assert saved["replay_images"] == 12 and saved["masked_boxes"] > 0
    assert 0.0 <= saved["after"]["camera_map50"] <= 1.0

    run, document, path = running
    run.wait(lambda: len(run.outcomes) >= 10, "the camera runs")
    outcome = _reload(run, document, path, type="litert", model_path=str(model))
    assert outcome.ok and outcome.plan is not None and outcome.plan.detector, outcome
    swapped_at = len(run.outcomes)
    run.wait(lambda: len(run.outcomes) >= swapped_at + 30, "the distilled model runs")
    status = run.agent.status_documents()[run.agent.workers[0].name]["model"]
    assert status == {"name": model.stem, "version": "1", "runtime": "litert"}
    indices = [o.frame.index for o in run.outcomes]
    assert indices == list(range(len(indices)))  # no frame dropped by the swap


@pytest.mark.slow
def test_a_model_trained_on_wrong_labels_is_refused_with_one_line(
    tmp_path: Path, general: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = _store(tmp_path, _truth_answer(shift=0.6, rotate=1))
    argv = [
        "distill", "--labels", str(labels), "--camera", CAMERA, "--base", str(EDGE_ONNX),
        "--current", str(EDGE_INT8), "--general-data", str(general), "--out",
        str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--epochs", "3",
        "--batch", "8", "--lr0", "0.02",
    ]  # fmt: skip
    assert toolchain_main(argv) == 2

    # (ultralytics and the quantiser write progress to stderr; the verdict is one line, last)
    err = capsys.readouterr().err.strip().splitlines()
    ours = [line for line in err if line.startswith("vision-toolchain:")]
    assert ours == [err[-1]]
    assert err[-1].startswith("vision-toolchain: error: distilled model refused: ")
    assert "forgets the general set: general mAP50" in err[-1]
    assert not (tmp_path / "out").exists()  # nothing handed over
    kept = json.loads((tmp_path / "work" / CAMERA / "refused.tflite.distill.json").read_text())
    assert kept["accepted"] is False


def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, general: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [
        "distill", "--labels", str(tmp_path), "--camera", CAMERA, "--general-data",
        str(general), "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"),
    ]  # fmt: skip
    cases = [
        (["--base", str(EDGE_ONNX), "--current", str(tmp_path / "none.tflite")], "not found"),
        (["--base", str(EDGE_ONNX), "--current", str(EDGE_INT8)], "no label folder"),
    ]
    for extra, message in cases:
        assert toolchain_main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
