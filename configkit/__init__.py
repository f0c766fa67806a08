"""Strict configuration models and YAML loading shared by the edge agent and the cloud service."""

from configkit.base import StrictModel
from configkit.common import MetricsConfig
from configkit.secrets import SecretError, SecretRef, find_secret_refs
from configkit.yaml_loader import (
    ConfigError,
    ConfigIssue,
    KeyPath,
    config_error_at,
    load_config,
    parse_config,
)

__all__ = [
    "ConfigError",
    "ConfigIssue",
    "KeyPath",
    "MetricsConfig",
    "SecretError",
    "SecretRef",
    "StrictModel",
    "config_error_at",
    "find_secret_refs",
    "load_config",
    "parse_config",
]
