"""The test world's trade-off table (`bench.hybrid.hybrid_tradeoff`): how sure its gap is."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from bench.hybrid.hybrid_tradeoff import Summary, gap_interval


def _summary(*map50: float) -> Summary:
    cells = [SimpleNamespace(scores=SimpleNamespace(map50=m)) for m in map50]
    return cast(Summary, SimpleNamespace(cells=cells))


def test_the_gap_interval_draws_the_same_scenes_for_the_three_variants() -> None:
    # the hybrid closes exactly half the gap on every scene: any paired draw says 50 %
    edge, cloud = _summary(0.2, 0.5, 0.7), _summary(0.4, 0.9, 0.8)
    half = _summary(0.3, 0.7, 0.75)
    interval = gap_interval(half, edge, cloud)
    assert round(interval.low, 6) == round(interval.high, 6) == 0.5
    assert interval.defined == 1.0


def test_draws_where_the_cloud_is_not_above_the_edge_leave_the_gap_undefined() -> None:
    edge, cloud = _summary(0.5, 0.5), _summary(0.4, 0.9)  # scene 0: the cloud is below
    interval = gap_interval(_summary(0.5, 0.7), edge, cloud)
    assert 0.0 < interval.defined < 1.0
