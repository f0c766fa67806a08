"""The edge agent's frame loop: capture → shared detector → tracker → rules → alerts.

- `EdgeAgent` (agent.py): all cameras of one box, one shared detector batched across cameras.
- `CameraPipeline`, `FrameOutcome` (core.py): one camera's frame loop as pure logic (frame
  choice, tracking, rules, escalation decision, fusion), driven by the agent and the benches.
- `CameraWorker` (camera.py): a `CameraPipeline` fed by a live camera source.
- `FrameRateLimiter` (rate.py), `MotionGate` (motion.py): which frames are analysed at all.
- `CameraStatus` (status.py): what the retained status topic says about a camera.
"""

from edge_agent.pipeline.agent import EdgeAgent, OutcomeHook
from edge_agent.pipeline.camera import CameraWorker
from edge_agent.pipeline.core import CameraCounters, CameraPipeline, Escalator, FrameOutcome
from edge_agent.pipeline.motion import MotionGate, MotionResult
from edge_agent.pipeline.rate import FrameRateLimiter
from edge_agent.pipeline.status import CameraStatus

__all__ = [
    "CameraCounters",
    "CameraPipeline",
    "CameraStatus",
    "CameraWorker",
    "EdgeAgent",
    "Escalator",
    "FrameOutcome",
    "FrameRateLimiter",
    "MotionGate",
    "MotionResult",
    "OutcomeHook",
]
