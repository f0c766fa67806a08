"""Replica kill and add under load: real replicas behind the real Envoy (bench.cloud.fleet_load)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cloud.fleet_load import RunResult, run_scenario, trivial_detector
from testbed.envoy import EnvoyUnavailableError, envoy_executable


def _envoy_or_skip() -> None:
    try:
        envoy_executable()
    except EnvoyUnavailableError as exc:
        pytest.skip(str(exc))


def test_trivial_detector_loads_like_an_exported_model(tmp_path: Path) -> None:
    import onnx

    from detection.model_metadata import metadata_class_names

    model = onnx.load(str(trivial_detector(tmp_path / "t.onnx")))
    props = {p.key: p.value for p in model.metadata_props}
    assert metadata_class_names(props) == ("person", "car")


@pytest.mark.process
def test_replica_killed_and_added_mid_run_loses_and_repeats_nothing(tmp_path: Path) -> None:
    _envoy_or_skip()
    # 3 agents x 8 cameras at 2 frames/s through Envoy to 2 replicas; r0 dies at 25 % of the
    # run, a new replica starts at 40 %; connections age out every ~2 s so streams re-balance.
    result: RunResult = run_scenario(
        "faults", "fast", tmp_path, seconds=16.0, age_s=2.0, faults=True, agents_n=3
    )
    assert result.submitted > 300
    assert result.no_result == 0  # every frame: its answer or a status
    assert result.duplicates == 0  # never answered twice
    assert result.answered_ok >= 0.8 * result.submitted
    # streams moved: the added replica took frames once connections aged out (how evenly the
    # load spreads is the bench's measurement, not a pass/fail here)
    assert set(result.replica_share) == {"r0", "r1", "r-new"}
    assert result.replica_share["r-new"] > 0
