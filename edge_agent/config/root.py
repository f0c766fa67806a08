"""`EdgeAgentConfig`: the whole YAML file of one edge agent, and the checks across its sections."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from configkit.base import StrictModel
from configkit.common import MetricsConfig
from configkit.yaml_loader import config_error_at
from detection.config import DetectorConfig
from edge_agent.config.agent import AgentConfig
from edge_agent.config.camera import CameraConfig, first_duplicate
from edge_agent.config.escalation import EscalationConfig
from edge_agent.config.mqtt import MqttConfig
from edge_agent.config.tracker import TrackerConfig


class EdgeAgentConfig(StrictModel):
    """Config of one edge agent: its cameras, models, tracker, escalation, alerts and metrics."""

    agent: AgentConfig = Field(description="Identity of this agent.")
    cameras: list[CameraConfig] = Field(
        min_length=1, max_length=256, description="Cameras this agent reads."
    )
    detector: DetectorConfig = Field(description="The edge detector (small quantized model).")
    tracker: TrackerConfig = Field(
        default_factory=TrackerConfig, description="DeepSORT settings for every camera."
    )
    escalation: EscalationConfig = Field(
        default_factory=EscalationConfig, description="Sending hard frames to the cloud."
    )
    mqtt: MqttConfig = Field(default_factory=MqttConfig, description="Alert delivery over MQTT.")
    metrics: MetricsConfig = Field(
        default_factory=lambda: MetricsConfig(listen_port=9108),
        description="Prometheus metrics endpoint.",
    )

    @model_validator(mode="after")
    def _check_across_sections(self) -> Self:
        duplicate = first_duplicate(camera.name for camera in self.cameras)
        if duplicate is not None:
            index, name = duplicate
            raise config_error_at(("cameras", index, "name"), f"duplicate camera name {name!r}")
        known = set(self.detector.class_names)
        if known:
            for camera_index, camera in enumerate(self.cameras):
                for rule_index, rule in enumerate(camera.rules):
                    for class_index, class_name in enumerate(rule.classes):
                        if class_name not in known:
                            raise config_error_at(
                                (
                                    "cameras",
                                    camera_index,
                                    "rules",
                                    rule_index,
                                    "classes",
                                    class_index,
                                ),
                                f"rule {rule.name!r} names class {class_name!r}, which is not in "
                                "detector.class_names",
                            )
        low = self.tracker.low_score_threshold
        if low is not None and low >= self.detector.confidence_threshold:
            raise config_error_at(
                ("tracker", "low_score_threshold"),
                f"tracker.low_score_threshold ({low}) must be below "
                f"detector.confidence_threshold ({self.detector.confidence_threshold})",
            )
        return self

    @property
    def mqtt_client_id(self) -> str:
        """The MQTT client id: configured, or derived from the agent id."""
        return self.mqtt.client_id or f"edge-agent-{self.agent.id}"

    def summary(self) -> str:
        """One line for `validate-config`: cameras, rules, escalation."""
        enabled = sum(camera.enabled for camera in self.cameras)
        rules = sum(len(camera.rules) for camera in self.cameras)
        escalation = "on" if self.escalation.enabled else "off"
        cameras = len(self.cameras)
        return (
            f"{cameras} camera{'s' * (cameras != 1)} ({enabled} enabled), "
            f"{rules} rule{'s' * (rules != 1)}, "
            f"detector {self.detector.runtime.type}, escalation {escalation}"
        )
