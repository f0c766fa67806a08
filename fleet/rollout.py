"""Rollout documents: which model a group of agents should run, and in which stage.

A rollout travels as a retained MQTT message on `{prefix}/fleet/rollouts/{group}` (an empty
retained payload clears it), signed like a manifest. The stages:

* `canary`: only the agents listed in `canary` take the model;
* `all`: every agent in the group takes it;
* `halted`: nobody takes it, and the canary agents that did go back to their previous model.

`desired` is the pure rule an agent applies; agents publish a retained status document on
`{prefix}/fleet/status/{agent_id}` and one event per decision on `{prefix}/fleet/events/{agent_id}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fleet.envelope import parse_envelope, seal_envelope
from fleet.manifest import ManifestError, ModelRef, canonical_json
from fleet.names import NAME_PATTERN, check_name
from fleet.signing import Signature, Signer, Verifier

__all__ = [
    "AGENT_STATES",
    "EVENT_KINDS",
    "MAX_SOAK_S",
    "Rollout",
    "SignedRollout",
    "Stage",
    "desired",
    "events_topic",
    "rollout_topic",
    "rollouts_filter",
    "status_filter",
    "status_topic",
]

Stage = Literal["canary", "all", "halted"]

MAX_SOAK_S: Final = 30 * 24 * 3600.0
"""A soak longer than 30 days is a typo, not a plan."""

AGENT_STATES: Final = (
    "idle",
    "downloading",
    "verifying",
    "warming",
    "evaluating",
    "rolled_back",
    "refused",
)
"""The `state` values of an agent's status document."""

EVENT_KINDS: Final = (
    "downloaded",
    "verified",
    "refused",
    "swapped",
    "promoted",
    "rolled_back",
    "reverted",
)
"""The `event` values of an agent's events."""


class Rollout(BaseModel):
    """Which model a group should run, to whom it goes so far, and since when."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    rollout_id: str = Field(pattern=NAME_PATTERN, description="Id of this rollout (one model).")
    group: str = Field(pattern=NAME_PATTERN, description="Agent group the rollout is for.")
    model: ModelRef = Field(description="The model the group should run.")
    stage: Stage = Field(description="`canary`, `all` or `halted`.")
    canary: list[str] = Field(
        default_factory=list, max_length=1000, description="Agent ids of the canary stage."
    )
    issued_at: str = Field(
        min_length=1, max_length=64, description="When this stage was issued, ISO 8601 UTC."
    )
    soak_s: float = Field(
        default=3600.0,
        ge=0.0,
        le=MAX_SOAK_S,
        description="How long the canary runs the model before a controller promotes it.",
    )

    @field_validator("canary")
    @classmethod
    def _agent_ids(cls, value: list[str]) -> list[str]:
        for agent in value:
            check_name(agent, "canary agent id")
        return value

    def canonical_bytes(self) -> bytes:
        """What is signed: the rollout as canonical JSON."""
        return canonical_json(self.model_dump(mode="json"))

    @classmethod
    def from_json_value(cls, value: object) -> Rollout:
        """Validate a parsed JSON value (`ManifestError` naming the fields at fault)."""
        try:
            return cls.model_validate_json(canonical_json(value))
        except (ValidationError, ValueError) as error:
            raise ManifestError(f"invalid rollout: {_brief(error)}") from None


def _brief(error: Exception) -> str:
    if isinstance(error, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in item['loc']) or 'rollout'}: {item['msg']}"
            for item in error.errors()[:5]
        )
    return str(error)


@dataclass(frozen=True)
class SignedRollout:
    """A rollout with its signatures: the retained payload of a rollout topic."""

    rollout: Rollout
    signatures: tuple[Signature, ...]

    @classmethod
    def sign(cls, rollout: Rollout, signer: Signer) -> SignedRollout:
        """`rollout` signed by `signer`."""
        return cls(rollout, (signer.sign(rollout.canonical_bytes()),))

    @classmethod
    def parse(cls, data: bytes) -> SignedRollout:
        """Parse a payload; `ManifestError` on anything malformed (size-capped)."""
        rollout, signatures = parse_envelope(
            data, "rollout", Rollout.from_json_value, "signed rollout"
        )
        return cls(rollout, tuple(signatures))

    def to_bytes(self) -> bytes:
        """The payload as published (canonical JSON)."""
        return seal_envelope("rollout", self.rollout.model_dump(mode="json"), list(self.signatures))

    def verified(self, verifier: Verifier) -> Rollout:
        """The rollout, once a trusted key's signature checks out (else `SignatureError`)."""
        verifier.verify(self.rollout.canonical_bytes(), self.signatures)
        return self.rollout


def desired(rollout: Rollout, agent_id: str) -> ModelRef | None:
    """The model `agent_id` should run under `rollout`; None: not this rollout's model.

    Canary: only the canary agents; all: everyone; halted: nobody (the canary agents that took
    it go back to their previous model).
    """
    if rollout.stage == "all":
        return rollout.model
    if rollout.stage == "canary" and agent_id in rollout.canary:
        return rollout.model
    return None


def rollout_topic(prefix: str, group: str) -> str:
    """Retained, signed rollout of `group`."""
    return f"{prefix}/fleet/rollouts/{check_name(group, 'group')}"


def status_topic(prefix: str, agent_id: str) -> str:
    """Retained status document of `agent_id`."""
    return f"{prefix}/fleet/status/{check_name(agent_id, 'agent id')}"


def events_topic(prefix: str, agent_id: str) -> str:
    """QoS 1, not retained: one event per decision of `agent_id`."""
    return f"{prefix}/fleet/events/{check_name(agent_id, 'agent id')}"


def rollouts_filter(prefix: str) -> str:
    """Subscription filter for every group's rollout."""
    return f"{prefix}/fleet/rollouts/+"


def status_filter(prefix: str) -> str:
    """Subscription filter for every agent's status document."""
    return f"{prefix}/fleet/status/+"
