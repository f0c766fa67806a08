"""The live signals of a running agent, read from what its frame loop already counts."""

from __future__ import annotations

from edge_agent.fleet.evidence import CameraTotals
from edge_agent.pipeline import EdgeAgent

__all__ = ["totals_of"]


def totals_of(agent: EdgeAgent) -> dict[str, CameraTotals]:
    """Every camera's running totals: frames analysed, detections, escalated frames, and the
    cloud's checks of the sure tracks (`CloudTrust`). Read from another thread: each number is
    one attribute read, and a camera restarted by a reload starts again from zero (which
    `evidence.window_between` allows for)."""
    totals: dict[str, CameraTotals] = {}
    for worker in list(agent.workers):
        counters, trust = worker.counters, worker.cloud_trust
        totals[worker.name] = CameraTotals(
            frames=counters.analysed,
            detections=counters.detections,
            escalated=counters.escalated,
            checked=trust.checked,
            seen=trust.seen,
        )
    return totals
