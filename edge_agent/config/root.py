"""`EdgeAgentConfig`: the whole YAML file of one edge agent, and the checks across its sections."""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, ModelWrapValidatorHandler, model_validator

from configkit.base import StrictModel
from configkit.common import MetricsConfig
from configkit.yaml_loader import LocatedMessage, field_of, validate_with_checks
from detection.config import DetectorConfig
from edge_agent.config.agent import AgentConfig
from edge_agent.config.camera import CameraConfig
from edge_agent.config.escalation import EscalationConfig
from edge_agent.config.fleet import FleetConfig
from edge_agent.config.homeassistant import HomeAssistantConfig
from edge_agent.config.labels import LabelStoreConfig
from edge_agent.config.media import MediaConfig
from edge_agent.config.mqtt import MqttConfig
from edge_agent.config.tracker import TrackerConfig
from edge_agent.config.web import WebConfig
from edge_agent.config.webhook import WebhookConfig


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
    media: MediaConfig = Field(
        default_factory=MediaConfig,
        description="Event snapshots, crops and clips on this box, and their retention.",
    )
    labels: LabelStoreConfig = Field(
        default_factory=LabelStoreConfig,
        description="Escalated frames and the cloud's answers kept for training (off).",
    )
    webhook: WebhookConfig | None = Field(
        default=None,
        description="POST each event as JSON to an HTTP(S) endpoint too (none: off).",
    )
    web: WebConfig = Field(
        default_factory=WebConfig, description="The local status page (off by default)."
    )
    homeassistant: HomeAssistantConfig = Field(
        default_factory=HomeAssistantConfig,
        description="Home Assistant MQTT discovery: cameras, zones and rules as HA entities.",
    )
    fleet: FleetConfig = Field(
        default_factory=FleetConfig,
        description="Model updates from the fleet's signed store, rolled back on evidence (off).",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _check_across_sections(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        # name checks run on the raw input too, so they are reported along with field errors
        return validate_with_checks(
            data, handler, cls.__name__, _section_name_issues, _built_issues
        )

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


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


def _section_name_issues(data: object) -> list[LocatedMessage]:
    """Duplicate camera names, `labels.cameras` naming no camera, and rule classes missing from
    `detector.class_names` (when it is set: otherwise the model's own names apply, which
    `validate-config` checks), on raw input."""
    issues: list[LocatedMessage] = []
    cameras = _list(field_of(data, "cameras"))
    seen: set[str] = set()
    for index, camera in enumerate(cameras):
        name = field_of(camera, "name")
        if isinstance(name, str):
            if name in seen:
                issues.append((("cameras", index, "name"), f"duplicate camera name {name!r}"))
            seen.add(name)
    for index, name in enumerate(_list(field_of(field_of(data, "labels"), "cameras"))):
        if isinstance(name, str) and name not in seen:
            issues.append((("labels", "cameras", index), f"no camera named {name!r}"))
    known = {
        n for n in _list(field_of(field_of(data, "detector"), "class_names")) if isinstance(n, str)
    }
    if not known:
        return issues
    for camera_index, camera in enumerate(cameras):
        for rule_index, rule in enumerate(_list(field_of(camera, "rules"))):
            for class_index, class_name in enumerate(_list(field_of(rule, "classes"))):
                if isinstance(class_name, str) and class_name not in known:
                    issues.append(
                        (
                            ("cameras", camera_index, "rules", rule_index, "classes", class_index),
                            f"rule {field_of(rule, 'name')!r} names class {class_name!r}, which "
                            "is not in detector.class_names",
                        )
                    )
    return issues


def _built_issues(config: EdgeAgentConfig) -> list[LocatedMessage]:
    return [*_threshold_issues(config), *_labels_issues(config)]


def _labels_issues(config: EdgeAgentConfig) -> list[LocatedMessage]:
    if config.labels.enabled and not config.escalation.enabled:
        return [
            (
                ("labels", "enabled"),
                "labels.enabled keeps the cloud's answers to escalated frames: it needs "
                "escalation.enabled",
            )
        ]
    return []


def _threshold_issues(config: EdgeAgentConfig) -> list[LocatedMessage]:
    low = config.tracker.low_score_threshold
    if low is not None and low >= config.detector.confidence_threshold:
        return [
            (
                ("tracker", "low_score_threshold"),
                f"tracker.low_score_threshold ({low}) must be below "
                f"detector.confidence_threshold ({config.detector.confidence_threshold})",
            )
        ]
    return []
