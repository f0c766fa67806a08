"""The agents' reports as the operator reads them: status documents and the fleet view.

Agents publish a retained status document on `{prefix}/fleet/status/{agent_id}`. Parsing here is
lenient about fields it does not know (a newer agent may add some) and strict about the ones it
reads. `fleet_rows` turns the documents and the groups' rollouts into the operator's table: which
box runs which model on which camera, which are behind, which rolled back. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleet.manifest import ManifestError
from fleet.names import NAME_PATTERN, SHA256_PATTERN
from fleet.rollout import Rollout, desired

__all__ = [
    "AgentStatus",
    "FleetRow",
    "ModelId",
    "availability_filter",
    "fleet_rows",
    "parse_status",
    "render_table",
]

_MAX_STATUS_BYTES: Final = 64 * 1024


def availability_filter(prefix: str) -> str:
    """The agents' retained `online` / `offline` topics (their Last Will), every agent.

    The agent's MQTT contract (`edge_agent.alerts.payload.availability_topic`), repeated here
    because `fleet` does not import the agent.
    """
    return f"{prefix}/+/availability"


class ModelId(BaseModel):
    """A model as status documents name it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str = Field(pattern=NAME_PATTERN, description="Model name.")
    version: str = Field(pattern=NAME_PATTERN, description="Model version.")
    sha256: str = Field(pattern=SHA256_PATTERN, description="Artifact digest.")

    def __str__(self) -> str:
        return f"{self.name}:{self.version}"


class AgentStatus(BaseModel):
    """One agent's retained report (see docs/fleet.md for every field)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    agent_id: str = Field(pattern=NAME_PATTERN, description="The agent.")
    site: str = Field(default="", max_length=64, description="Its site.")
    groups: list[str] = Field(default_factory=list, max_length=64, description="Its groups.")
    state: str = Field(default="idle", max_length=32, description="What it is doing.")
    model: ModelId | None = Field(default=None, description="The fleet model it runs, if any.")
    previous: ModelId | None = Field(default=None, description="The model it would go back to.")
    desired: ModelId | None = Field(default=None, description="The model it was told to run.")
    cameras: dict[str, str] = Field(
        default_factory=dict, max_length=256, description="Camera -> `name:version` it runs."
    )
    rejected: list[str] = Field(
        default_factory=list, max_length=1000, description="Digests it refused or rolled back."
    )
    detail: str = Field(default="", max_length=2000, description="Last decision, in words.")
    updated_at: str = Field(default="", max_length=64, description="When, ISO 8601 UTC.")


def parse_status(payload: bytes) -> AgentStatus:
    """A status document; `ManifestError` (with the reason) when it is not one."""
    if len(payload) > _MAX_STATUS_BYTES:
        raise ManifestError(f"status document of {len(payload)} bytes: too large")
    try:
        return AgentStatus.model_validate(json.loads(payload.decode("utf-8")))
    except (UnicodeDecodeError, ValueError, ValidationError) as error:
        raise ManifestError(f"not a status document: {str(error).splitlines()[0]}") from None


@dataclass(frozen=True)
class FleetRow:
    """One line of `fleet list`."""

    agent: str
    site: str
    online: str  # `yes`, `no` (its Last Will said offline), `?` (never said)
    cameras: str
    desired: str
    state: str
    behind: bool
    rolled_back: bool
    updated_at: str


def _wanted(status: AgentStatus, rollouts: Mapping[str, Rollout]) -> tuple[str, str] | None:
    """(sha256, name:version) that the agent's groups' rollouts want it to run, if any."""
    for group in status.groups or ["default"]:
        rollout = rollouts.get(group)
        if rollout is None:
            continue
        ref = desired(rollout, status.agent_id)
        if ref is not None:
            return ref.sha256, f"{ref.name}:{ref.version}"
    return None


def fleet_rows(
    statuses: Sequence[AgentStatus],
    rollouts: Mapping[str, Rollout],
    availability: Mapping[str, str] | None = None,
) -> list[FleetRow]:
    """The operator's view of each agent, sorted by site and agent.

    `availability`: agent id -> the payload of its retained availability topic (`online`,
    `offline`). A box that is offline keeps its last status; it catches up when it returns.

    Behind: a rollout (or the agent's own `desired`) names a model the agent does not run yet
    and has not rejected. Rolled back: the agent's state says so, or it rejected the model a
    rollout of its groups names.
    """
    rows = []
    for status in sorted(statuses, key=lambda s: (s.site, s.agent_id)):
        wanted = _wanted(status, rollouts)
        if wanted is None and status.desired is not None:
            wanted = status.desired.sha256, str(status.desired)
        running = status.model.sha256 if status.model is not None else None
        rejected = wanted is not None and wanted[0] in status.rejected
        behind = wanted is not None and wanted[0] != running and not rejected
        group_models = {r.model.sha256 for g, r in rollouts.items() if g in status.groups}
        rolled_back = (
            status.state == "rolled_back" or rejected or bool(group_models & set(status.rejected))
        )
        cameras = ", ".join(f"{cam}={model}" for cam, model in sorted(status.cameras.items()))
        if not cameras:
            cameras = str(status.model) if status.model is not None else "-"
        rows.append(
            FleetRow(
                agent=status.agent_id,
                site=status.site or "-",
                online=_online((availability or {}).get(status.agent_id)),
                cameras=cameras,
                desired=wanted[1] if wanted is not None else "-",
                state=status.state,
                behind=behind,
                rolled_back=rolled_back,
                updated_at=status.updated_at or "-",
            )
        )
    return rows


def _online(payload: str | None) -> str:
    return {"online": "yes", "offline": "no"}.get(payload or "", "?")


_HEADERS: Final = (
    "agent",
    "site",
    "online",
    "model per camera",
    "desired",
    "state",
    "behind",
    "rolled back",
)


def render_table(rows: Sequence[FleetRow]) -> str:
    """A plain-text table of `rows` (columns padded to their widest cell)."""
    cells = [
        (
            r.agent,
            r.site,
            r.online,
            r.cameras,
            r.desired,
            r.state,
            _yes(r.behind),
            _yes(r.rolled_back),
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(_HEADERS)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(_HEADERS, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
