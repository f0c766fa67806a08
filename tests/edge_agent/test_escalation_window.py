"""The escalation stage's window on frames in flight: slow start on each stream."""

from __future__ import annotations

from typing import cast

from edge_agent.config.escalation import EscalationConfig
from edge_agent.escalation import EscalationClient
from edge_agent.escalation.policy import FrameSignals
from edge_agent.pipeline.escalation import EscalationStage

HARD = FrameSignals(
    640,
    480,
    detection_count=2,
    uncertain=((10.0, 10.0, 50.0, 90.0), (100.0, 10.0, 140.0, 90.0)),
    new_tracks=((10.0, 10.0, 50.0, 90.0), (100.0, 10.0, 140.0, 90.0)),
)


class StubClient:
    """What `EscalationStage.decide` asks of the client: connected, which stream, in flight."""

    connected = True
    stream_id = 1
    in_flight = 0


def test_hard_frames_wait_while_the_window_is_full_and_a_new_stream_starts_it_small() -> None:
    config = EscalationConfig.model_validate(
        {
            "enabled": True,
            "cloud_address": "127.0.0.1:1",
            "per_camera_frames_per_s": 100.0,
            "per_agent_frames_per_s": 100.0,
            "initial_in_flight": 2,
        }
    )
    client = StubClient()
    stage = EscalationStage(config, "agent-1", cast(EscalationClient, client), clock=lambda: 0.0)
    client.in_flight = 1
    first = stage.decide(HARD, "cam")
    assert first is not None and first.send
    client.in_flight = 2  # the window (2) is full: hard, but not sent, and no token spent
    held = stage.decide(HARD, "cam")
    assert held is not None and not held.send and held.reasons and held.refused_by_budget
    assert stage.counters.refused_budget == 1
    stage.policy.observe_answer(rtt_s=0.05, queue_time_ms=5.0, answered=True)
    grown = stage.decide(HARD, "cam")
    assert grown is not None and grown.send  # 3 in flight allowed now
    client.stream_id = 2  # reconnected, maybe to another replica: slow start again
    again = stage.decide(HARD, "cam")
    assert again is not None and not again.send
    assert stage.policy.budget.stats(0.0).refused_window == 2
