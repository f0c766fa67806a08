"""`HomeAssistantLink`: the agent's side of Home Assistant MQTT discovery.

At start it announces the agent, its cameras, zones and rules (`alerts.homeassistant`), and sets
every zone's state to empty; from then on it publishes a zone's state (retained, on
`<prefix>/<agent>/zones/<camera>/<zone>`) only when its count of tracked objects changes, so the
outbox sees a row per change, not per frame. After a reload it removes what the new config no
longer has (discovery configs and zone states) and announces the rest again.
"""

from __future__ import annotations

from collections.abc import Mapping

from edge_agent.alerts import AlertPublisher
from edge_agent.alerts.homeassistant import (
    discovery_messages,
    encode_discovery,
    encode_zone_state,
    removal_messages,
    zone_state_topic,
)
from edge_agent.config import EdgeAgentConfig
from edge_agent.pipeline.reload import ReloadPlan

__all__ = ["HomeAssistantLink"]


class HomeAssistantLink:
    """Discovery configs and zone states of one agent (see the module docstring)."""

    def __init__(self, publisher: AlertPublisher, config: EdgeAgentConfig) -> None:
        self.publisher = publisher
        self.config = config
        self._counts: dict[tuple[str, str], int] = {}

    def _topic(self, camera: str, zone: str) -> str:
        mqtt, agent = self.config.mqtt, self.config.agent.id
        return zone_state_topic(mqtt.topic_prefix, agent, camera, zone)

    def _zones(self, config: EdgeAgentConfig) -> set[tuple[str, str]]:
        return {(c.name, z.name) for c in config.cameras if c.enabled for z in c.zones}

    def announce(self) -> None:
        """Publish every discovery config, and each zone not yet seen as empty."""
        for message in discovery_messages(self.config, self.config.homeassistant):
            self.publisher.publish_retained(message.topic, encode_discovery(message.payload))
        for camera, zone in sorted(self._zones(self.config)):
            if (camera, zone) not in self._counts:
                self.zones_seen(camera, {zone: 0})

    def zones_seen(self, camera: str, counts: Mapping[str, int]) -> None:
        """The tracked objects now inside each zone of `camera`; publishes the changed ones."""
        for zone, count in counts.items():
            if self._counts.get((camera, zone)) == count:
                continue
            self._counts[(camera, zone)] = count
            self.publisher.publish_retained(self._topic(camera, zone), encode_zone_state(count))

    def reload(self, config: EdgeAgentConfig, plan: ReloadPlan) -> None:
        """A reload applied `plan` (a `ReloadListener`): remove, then announce again."""
        old = self.config
        for topic, empty in removal_messages(old, config, old.homeassistant, config.homeassistant):
            self.publisher.publish_retained(topic, empty)
        kept = self._zones(config)
        for key in sorted(self._zones(old) - kept):
            self.publisher.publish_retained(self._topic(*key), b"")
        for key in list(self._counts):
            if key not in kept or key[0] in plan.changed:
                del self._counts[key]  # a restarted camera starts again from empty zones
        self.config = config
        self.announce()
