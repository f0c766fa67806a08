"""The edge box's side of fleet model updates (issue 34; the shared parts live in `fleet/`).

- `FleetUpdater` (updater.py): follows the rollouts of the box's groups, verifies, downloads,
  swaps through the reload path, rolls back on evidence, publishes status and events.
- `boot_config` (boot.py): the model the box boots on, its hash checked again.
- `FleetState` (state.py): what runs, ran, is on trial or was rejected, written atomically.
- `judge`, `EvidenceLog` (evidence.py): the rollback decision, pure, on an injected clock.
"""

from edge_agent.fleet.boot import boot_config
from edge_agent.fleet.evidence import EvidenceLog, Verdict, judge
from edge_agent.fleet.state import FleetState, ModelRecord, load_state, save_state
from edge_agent.fleet.updater import FleetUpdater

__all__ = [
    "EvidenceLog",
    "FleetState",
    "FleetUpdater",
    "ModelRecord",
    "Verdict",
    "boot_config",
    "judge",
    "load_state",
    "save_state",
]
