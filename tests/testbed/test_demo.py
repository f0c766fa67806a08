"""The README's main command, shortened: a scene, the edge runtimes, the cloud over gRPC, scores."""

from __future__ import annotations

import pytest

from testbed.demo import main


def test_demo_runs_end_to_end_and_scores_every_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--frames", "6", "--preset", "events"]) == 0
    out = capsys.readouterr().out
    assert "== edge detector: edge INT8 LiteRT" in out
    assert "-- cloud: 6 results for 6 frames" in out
    table = out.split("== accuracy on")[1]
    for label in ("edge INT8 LiteRT", "edge FP32 ONNX", "cloud ONNX (gRPC)"):
        assert f"| {label} |" in table
