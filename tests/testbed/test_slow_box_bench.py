"""`bench.edge.slow_box_alerts`: the slow runtime it holds the agent down with, and its scoring.

The bench itself runs the live agent in real time (minutes, `python -m bench.edge.slow_box_alerts`);
here the slow runtime runs on the real committed edge model, and the table on known runs.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from bench.edge.slow_box_alerts import PacedRuntime, Run, markdown, rows_of
from detection.runtimes.base import create_runtime
from detection.runtimes.config import OnnxRuntimeConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
EDGE_ONNX = REPO_ROOT / "models" / "edge" / "edge-yolov5n-320.onnx"


def test_the_paced_runtime_takes_its_period_and_answers_as_the_model_does() -> None:
    model = create_runtime(OnnxRuntimeConfig(model_path=EDGE_ONNX, intra_op_threads=1))
    paced = PacedRuntime(model, period_s=0.25)
    try:
        images = np.random.default_rng(0).random((1, 3, 320, 320), dtype=np.float32)
        started = time.perf_counter()
        out = paced.infer(images)
        assert time.perf_counter() - started >= 0.25
        np.testing.assert_array_equal(out, model.infer(images))
        assert paced.input_spec == model.input_spec
        assert "paced to 250 ms" in paced.name
    finally:
        paced.close()


def test_a_bad_period_is_refused_by_name() -> None:
    model = create_runtime(OnnxRuntimeConfig(model_path=EDGE_ONNX, intra_op_threads=1))
    try:
        with pytest.raises(ValueError, match="period_s must be > 0, got 0"):
            PacedRuntime(model, period_s=0.0)
    finally:
        model.close()


def _run(scene: str, share: float, settings: str, matched: int, missing: list[str]) -> Run:
    return Run(scene, "paced", share, None, settings, 36, share * 25, 12, matched, missing, [])


def test_rows_gather_the_runs_of_a_condition_and_the_table_lists_what_was_missed() -> None:
    runs = [
        _run("events-s1", 0.1, "current", 12, []),
        _run("events-s2", 0.1, "current", 11, ["  1.28s zone_enter person @zone-a"]),
        _run("events-s1", 0.1, "previous", 4, ["x"] * 8),
    ]
    rows = rows_of(runs, 25.0)
    assert [(r.settings, r.runs, r.exact_runs, r.matched, r.missing) for r in rows] == [
        ("current", 2, 1, 23, 1),
        ("previous", 1, 0, 4, 8),
    ]
    text = markdown(rows, runs, ["events-s1", "events-s2"], 10.0, "load average 1.0")
    assert "| slow runtime: 10 % of the camera's frame rate (2.5 f/s) | current | 2 | 1 |" in text
    assert "events-s2, paced 0.1, current: missing   1.28s zone_enter person @zone-a" in text
