"""The edge agent's frame loop: capture → shared detector → tracker → rules → alerts.

- `EdgeAgent` (agent.py): all cameras of one box, one shared detector batched across cameras.
- `CameraWorker`, `FrameOutcome` (camera.py): one camera's frame choice, tracking and rules.
- `FrameRateLimiter` (rate.py), `MotionGate` (motion.py): which frames are analysed at all.
- `CameraStatus` (status.py): what the retained status topic says about a camera.
"""

from edge_agent.pipeline.agent import EdgeAgent, OutcomeHook
from edge_agent.pipeline.camera import CameraCounters, CameraWorker, FrameOutcome
from edge_agent.pipeline.motion import MotionGate, MotionResult
from edge_agent.pipeline.rate import FrameRateLimiter
from edge_agent.pipeline.status import CameraStatus

__all__ = [
    "CameraCounters",
    "CameraStatus",
    "CameraWorker",
    "EdgeAgent",
    "FrameOutcome",
    "FrameRateLimiter",
    "MotionGate",
    "MotionResult",
    "OutcomeHook",
]
