"""What `fleet rollout run` decides from the agents' reports: pure, so it is tested on documents.

The controller starts a canary, waits until every canary agent runs the model, lets it soak, and
promotes it to the group unless a canary rolled it back or refused it (then it halts the rollout).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from fleet.status import AgentStatus

__all__ = ["Verdict", "canary_verdict", "group_progress"]

VerdictKind = Literal["waiting", "running", "failed"]


@dataclass(frozen=True)
class Verdict:
    """Where the canary stands: `waiting` (not all run it yet), `running` (all do), `failed`."""

    kind: VerdictKind
    detail: str


def _failed(status: AgentStatus, sha256: str) -> str | None:
    """Why `status` says the agent will not run `sha256`, or None."""
    if sha256 in status.rejected:
        how = "rolled it back" if status.state == "rolled_back" else "refused it"
        return f"{status.agent_id} {how}: {status.detail or status.state}"
    if status.state in ("rolled_back", "refused") and (
        status.desired is None or status.desired.sha256 == sha256
    ):
        return f"{status.agent_id} is {status.state}: {status.detail or 'no detail'}"
    return None


def canary_verdict(
    sha256: str, canary: Collection[str], statuses: Mapping[str, AgentStatus]
) -> Verdict:
    """The canary's state for model `sha256` from the latest status of each agent."""
    waiting = []
    for agent in sorted(canary):
        status = statuses.get(agent)
        if status is None:
            waiting.append(f"{agent} (no status yet)")
            continue
        reason = _failed(status, sha256)
        if reason is not None:
            return Verdict("failed", reason)
        if status.model is None or status.model.sha256 != sha256:
            waiting.append(f"{agent} ({status.state})")
    if waiting:
        return Verdict("waiting", "waiting for " + ", ".join(waiting))
    return Verdict("running", f"all {len(canary)} canary agent(s) run it")


def group_progress(
    sha256: str, group: str, statuses: Mapping[str, AgentStatus]
) -> tuple[list[str], list[str]]:
    """(agents of `group` that run `sha256`, agents of `group` that do not yet)."""
    done: list[str] = []
    behind: list[str] = []
    for agent, status in sorted(statuses.items()):
        if group not in (status.groups or ["default"]):
            continue
        running = status.model is not None and status.model.sha256 == sha256
        (done if running else behind).append(agent)
    return done, behind
