"""What a new config changes in a running agent: the plan a reload applies, or why it cannot.

Cameras are the unit of change. A camera added (or enabled) starts, one removed (or disabled)
stops and ends its lasting events, one whose config differs in any way restarts alone (new
tracks), and every other camera goes on untouched: same tracks, same stream, no frame lost.
The `detector:` section swaps the model between two frames (`pipeline.model_swap`: loaded and
checked aside, rolled back if it fails at first); tracks go on, and tracker thresholds taken from
the detector apply to a camera when it next restarts. Anything else (agent id, tracker, MQTT,
escalation, metrics, ...) is shared by every camera or held open by the process, so a change
there is refused as a whole, naming the sections, and needs a restart: a reload applies
completely or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.config import EdgeAgentConfig
from edge_agent.config.camera import CameraConfig

__all__ = ["ReloadPlan", "ReloadRefused", "plan_reload"]


class ReloadRefused(ValueError):
    """The new config cannot be applied without a restart; nothing was changed."""


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    """Camera names by what a reload does to them, in config order."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: tuple[str, ...]
    detector: bool = False  # the `detector:` section changed: the model is swapped

    @property
    def empty(self) -> bool:
        """Whether the reload changes nothing."""
        return not (self.added or self.removed or self.changed or self.detector)

    def summary(self) -> str:
        """One line for the log and for systemd's `STATUS=`."""
        parts = [
            f"{label} {', '.join(names)}"
            for label, names in (
                ("added", self.added),
                ("removed", self.removed),
                ("restarted", self.changed),
            )
            if names
        ]
        if self.detector:
            parts.insert(0, "detector swapped")
        kept = f"{len(self.unchanged)} camera(s) untouched"
        return "; ".join([*parts, kept]) if parts else f"no change; {kept}"


def _enabled(config: EdgeAgentConfig) -> dict[str, CameraConfig]:
    return {camera.name: camera for camera in config.cameras if camera.enabled}


LIVE_SECTIONS = ("cameras", "detector")


def plan_reload(old: EdgeAgentConfig, new: EdgeAgentConfig) -> ReloadPlan:
    """The camera and detector changes from `old` to `new`; raises `ReloadRefused` if anything
    else differs."""
    sections = [
        name
        for name in type(new).model_fields
        if name not in LIVE_SECTIONS and getattr(old, name) != getattr(new, name)
    ]
    if sections:
        raise ReloadRefused(
            f"these sections changed and need a restart: {', '.join(sections)}; "
            "nothing was applied (cameras and the detector alone can change on a reload)"
        )
    before, after = _enabled(old), _enabled(new)
    return ReloadPlan(
        added=tuple(name for name in after if name not in before),
        removed=tuple(name for name in before if name not in after),
        changed=tuple(name for name in after if name in before and after[name] != before[name]),
        unchanged=tuple(name for name in after if name in before and after[name] == before[name]),
        detector=old.detector != new.detector,
    )
