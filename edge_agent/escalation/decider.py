"""`EscalationDecider`: the escalation policy and its budget on an injected clock.

The pure half of escalation: it decides on a frame's signals (spending the budget), learns the
real size of what was encoded, and feeds the cloud's round trips and overload signals to the
budget's back-off. The agent's `EscalationStage` wraps one with a lock, the cloud's connection
state and the encoder; the trade-off simulation drives one directly on simulated time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from edge_agent.config.escalation import EscalationConfig
from edge_agent.escalation.budget import EscalationBudget
from edge_agent.escalation.policy import EscalationDecision, EscalationPolicy, FrameSignals


class EscalationDecider:
    """`EscalationPolicy` + `EscalationBudget` on `clock` (monotonic seconds)."""

    def __init__(
        self, config: EscalationConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._config = config
        self._clock = clock
        self.policy = EscalationPolicy(config, EscalationBudget(config, clock()))

    @property
    def config(self) -> EscalationConfig:
        """The escalation settings."""
        return self._config

    def decide(self, signals: FrameSignals, camera: str) -> EscalationDecision:
        """Decide on one frame of `camera` now; a send is charged to the budget."""
        return self.policy.decide(signals, camera, self._clock())

    def record_encoded(
        self, camera: str, decision: EscalationDecision, n_bytes: int, pixels: int
    ) -> None:
        """The real JPEG size of a sent decision (see `EscalationPolicy.record_encoded`)."""
        self.policy.record_encoded(camera, decision, n_bytes, pixels)

    def observe_answer(
        self,
        *,
        rtt_s: float | None = None,
        queue_time_ms: float | None = None,
        overloaded: bool = False,
    ) -> None:
        """One answer (or failure) came back now: feeds the budget's back-off."""
        self.policy.budget.observe(
            self._clock(), rtt_s=rtt_s, queue_time_ms=queue_time_ms, overloaded=overloaded
        )
