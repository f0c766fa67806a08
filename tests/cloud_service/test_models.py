"""`TrafficSplit` and `ModelTable`: stable assignment, shares, and closing swapped-out models."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cloud_service.decoders import BgrImage
from cloud_service.models import ModelInfo, ModelTable, ServedModel, TrafficSplit, split_point
from detection.detections import Detections


class _Detector:
    def detect(
        self, images: Sequence[BgrImage], *, scale_up: bool | Sequence[bool] = True
    ) -> list[Detections]:
        return [Detections.empty() for _ in images]


def _model(version: str, closed: list[str]) -> ServedModel:
    return ServedModel(_Detector(), ModelInfo("m", version), close=lambda: closed.append(version))


def test_split_points_are_stable_and_spread() -> None:
    points = [split_point(f"agent-{i}") for i in range(2000)]
    assert points == [split_point(f"agent-{i}") for i in range(2000)]  # no per-run salt
    assert all(0.0 <= p < 1.0 for p in points)
    assert 0.45 < sum(p < 0.5 for p in points) / len(points) < 0.55


def test_split_by_agent_keeps_an_agent_on_one_side_and_grows_monotonically() -> None:
    agents = [f"agent-{i}" for i in range(400)]
    small, large = TrafficSplit(0.1), TrafficSplit(0.3)
    on_small = {a for a in agents if small.to_candidate(a, "cam", 0)}
    on_large = {a for a in agents if large.to_candidate(a, "cam", 0)}
    assert on_small <= on_large  # raising the share only moves agents to the candidate
    assert 20 <= len(on_small) <= 60 and 90 <= len(on_large) <= 150
    for agent in agents[:20]:
        sides = {small.to_candidate(agent, cam, f) for cam in ("a", "b") for f in range(5)}
        assert len(sides) == 1


def test_split_by_frame_spreads_one_agents_frames() -> None:
    split = TrafficSplit(0.5, "frame")
    sides = [split.to_candidate("agent", "cam", frame) for frame in range(400)]
    assert 150 < sum(sides) < 250


def test_split_share_must_be_a_fraction() -> None:
    with pytest.raises(ValueError, match="share"):
        TrafficSplit(1.5)


def test_table_routes_frames_to_the_candidate_by_the_split() -> None:
    closed: list[str] = []
    stable, candidate = _model("1", closed), _model("2", closed)
    split = TrafficSplit(0.5)
    table = ModelTable(stable, candidate, split)
    frames = [(f"agent-{i}", "cam", 1) for i in range(50)]

    chosen = table.checkout(frames)
    table.release(chosen)

    for frame, model in zip(frames, chosen, strict=True):
        assert (model is candidate) == split.to_candidate(*frame)
    assert closed == []


def test_replaced_models_close_only_after_their_last_batch() -> None:
    closed: list[str] = []
    old, new = _model("1", closed), _model("2", closed)
    table = ModelTable(old)
    running = table.checkout([("a", "c", 1), ("b", "c", 2)])  # a batch in flight on "1"

    table.replace(new)
    assert closed == []  # still in use
    assert table.checkout([("a", "c", 3)]) == [new]  # new batches go to the new model
    table.release(running)
    assert closed == ["1"]

    table.close()
    assert closed == ["1", "2"]


def test_an_idle_replaced_model_closes_at_once_and_a_kept_one_stays_open() -> None:
    closed: list[str] = []
    stable, candidate = _model("1", closed), _model("2", closed)
    table = ModelTable(stable, candidate, TrafficSplit(0.2))
    table.replace(stable)  # drop the candidate, keep the stable model
    assert closed == ["2"]
    assert table.models == [stable]


def test_a_candidate_needs_a_split() -> None:
    closed: list[str] = []
    with pytest.raises(ValueError, match="split"):
        ModelTable(_model("1", closed), _model("2", closed))
