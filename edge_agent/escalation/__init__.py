"""Escalation of hard frames to the cloud detector: policy, budget, encoding and the gRPC client.

The policy and budget are pure (time is passed in); the client does the I/O on its own thread so
the frame loop never waits for the cloud.
"""

from edge_agent.escalation.budget import AimdBackoff, BudgetStats, EscalationBudget, TokenBucket
from edge_agent.escalation.client import (
    ClientState,
    ClientStats,
    EscalationClient,
    EscalationClientError,
    EscalationResult,
)
from edge_agent.escalation.encode import (
    build_frame_request,
    encode_jpeg,
    payload_bytes,
    payload_pixels,
    request_for_decision,
)
from edge_agent.escalation.policy import (
    EscalationDecision,
    EscalationPolicy,
    FrameSignals,
    SignalSettings,
)
from edge_agent.escalation.roi import Box

__all__ = [
    "AimdBackoff",
    "Box",
    "BudgetStats",
    "ClientState",
    "ClientStats",
    "EscalationBudget",
    "EscalationClient",
    "EscalationClientError",
    "EscalationDecision",
    "EscalationPolicy",
    "EscalationResult",
    "FrameSignals",
    "SignalSettings",
    "TokenBucket",
    "build_frame_request",
    "encode_jpeg",
    "payload_bytes",
    "payload_pixels",
    "request_for_decision",
]
