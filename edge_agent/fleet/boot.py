"""Which model the box boots on: the kept fleet model, re-checked, else the one before, else the
config's own (see `edge_agent.fleet.state`), and the detector config that runs it."""

from __future__ import annotations

import logging
from pathlib import Path

from detection.config import DetectorConfig
from edge_agent.config import EdgeAgentConfig
from edge_agent.fleet.state import FleetState, ModelRecord, file_sha256, load_state, save_state

__all__ = ["boot_config", "detector_for", "verified_file"]

logger = logging.getLogger(__name__)


def detector_for(own: DetectorConfig, record: ModelRecord | None) -> DetectorConfig:
    """`own` (the config's detector) running `record`'s file instead; `own` for None.

    The config's `shape_models` are exports of its own model, so a fleet model runs without them.
    """
    if record is None:
        return own
    runtime = own.runtime.model_copy(update={"model_path": record.path})
    return own.model_copy(update={"runtime": runtime, "shape_models": []})


def verified_file(record: ModelRecord) -> str | None:
    """Why `record`'s file cannot run (missing, or its sha256 differs); None when it can."""
    path = Path(record.path)
    try:
        digest = file_sha256(path)
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    if digest != record.sha256:
        return f"{path} hashes to {digest[:12]}, not {record.sha256[:12]}"
    return None


def boot_config(config: EdgeAgentConfig) -> tuple[EdgeAgentConfig, FleetState]:
    """`config` with the detector the fleet state says to boot on, and that state (saved again
    when boot changed it: a cut-short trial cleared, a bad file passed over)."""
    fleet = config.fleet
    if not fleet.enabled:
        return config, FleetState()
    state = load_state(fleet.state_dir)
    changed = False
    if state.trial is not None:
        logger.warning(
            "fleet: the trial of %s was cut short (power lost mid-swap?); booting on %s",
            state.trial.model,
            state.current or "the config's model",
        )
        state = state.model_copy(update={"trial": None})
        changed = True
    for _ in range(2):
        record = state.current
        if record is None:
            break
        problem = verified_file(record)
        if problem is None:
            break
        fallback = state.previous
        logger.error(
            "fleet: model %s does not verify (%s); booting on %s",
            record,
            problem,
            fallback or "the config's model",
        )
        state = state.model_copy(update={"current": fallback, "previous": None})
        changed = True
    if changed:
        save_state(fleet.state_dir, state)
    chosen = detector_for(config.detector, state.current)
    if state.current is not None:
        logger.info("fleet: booting on %s (hash checked)", state.current)
    return config.model_copy(update={"detector": chosen}), state
