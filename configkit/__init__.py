"""Strict configuration models and YAML loading shared by the edge agent and the cloud service."""

from configkit.base import StrictModel

__all__ = ["StrictModel"]
