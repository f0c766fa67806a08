"""`homeassistant:` — Home Assistant MQTT discovery of the agent's cameras, zones and rules."""

from __future__ import annotations

from string import Formatter

from pydantic import Field, field_validator

from configkit.base import StrictModel

DEVICE_NAME_FIELDS = frozenset({"agent", "site", "camera"})
"""Placeholders `device_name_format` may use."""


class HomeAssistantConfig(StrictModel):
    """Retained discovery messages that make Home Assistant create one device per camera, with
    occupancy and count entities per zone and an event entity per rule."""

    enabled: bool = Field(
        default=False, description="Publish Home Assistant discovery messages (retained)."
    )
    discovery_prefix: str = Field(
        default="homeassistant",
        pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$",
        max_length=200,
        description=(
            "Home Assistant's MQTT discovery prefix (its own default: `homeassistant`); no "
            "wildcards, no leading or trailing `/`."
        ),
    )
    device_name_format: str = Field(
        default="{agent} {camera}",
        min_length=1,
        max_length=200,
        description=(
            "Name of each camera's device in Home Assistant; may use `{agent}`, `{site}` and "
            "`{camera}`. Entity names are added to it (`edge-01 cam-1 door occupied`)."
        ),
    )
    support_url: str | None = Field(
        default=None,
        pattern=r"^https?://\S+$",
        max_length=2048,
        description="Link Home Assistant shows for the software that published the entities.",
    )

    @field_validator("device_name_format")
    @classmethod
    def _check_device_name_format(cls, value: str) -> str:
        try:
            fields = [
                (name, spec, conversion)
                for _text, name, spec, conversion in Formatter().parse(value)
                if name is not None
            ]
        except ValueError as exc:
            raise ValueError(f"not a valid format string: {exc}") from exc
        for name, spec, conversion in fields:
            if name not in DEVICE_NAME_FIELDS:
                allowed = ", ".join(f"{{{n}}}" for n in sorted(DEVICE_NAME_FIELDS))
                raise ValueError(f"unknown placeholder {{{name}}}; allowed: {allowed}")
            if spec or conversion:
                raise ValueError(f"placeholder {{{name}}} takes no format spec or conversion")
        return value

    def device_name(self, agent: str, site: str, camera: str) -> str:
        """The Home Assistant name of `camera`'s device."""
        return self.device_name_format.format(agent=agent, site=site, camera=camera)
