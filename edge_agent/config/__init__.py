"""Config of the edge agent; modules mirror the top-level sections of the YAML file."""

from edge_agent.config.agent import AgentConfig
from edge_agent.config.camera import CameraConfig, CaptureConfig
from edge_agent.config.escalation import EscalationConfig
from edge_agent.config.geometry import LineConfig, ZoneConfig
from edge_agent.config.homeassistant import HomeAssistantConfig
from edge_agent.config.motion import MotionConfig
from edge_agent.config.mqtt import MqttConfig, MqttTlsConfig
from edge_agent.config.root import EdgeAgentConfig
from edge_agent.config.rules import (
    CountLineRule,
    LineCrossRule,
    LoiterRule,
    RuleConfig,
    ZoneEnterRule,
    ZoneExitRule,
    ZoneOccupancyRule,
)
from edge_agent.config.tracker import TrackerConfig

__all__ = [
    "AgentConfig",
    "CameraConfig",
    "CaptureConfig",
    "EdgeAgentConfig",
    "EscalationConfig",
    "HomeAssistantConfig",
    "LineConfig",
    "CountLineRule",
    "LineCrossRule",
    "LoiterRule",
    "MotionConfig",
    "MqttConfig",
    "MqttTlsConfig",
    "RuleConfig",
    "TrackerConfig",
    "ZoneConfig",
    "ZoneEnterRule",
    "ZoneExitRule",
    "ZoneOccupancyRule",
]
