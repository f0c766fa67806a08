"""`agent:` — who this edge agent is."""

from __future__ import annotations

from pydantic import Field

from configkit.base import StrictModel

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""Names that go into MQTT topics and metric labels: no `/`, `+`, `#` or spaces."""


class AgentConfig(StrictModel):
    """Identity of the agent: used in MQTT topics, event ids and escalation requests."""

    id: str = Field(pattern=NAME_PATTERN, description="Unique id of this agent (box) in the fleet.")
    site: str = Field(
        default="default", pattern=NAME_PATTERN, description="Site (location) the agent serves."
    )
