"""Config sections shared by the edge agent and the cloud service."""

from __future__ import annotations

from pydantic import Field

from configkit.base import StrictModel

__all__ = ["HOST_PORT_PATTERN", "MetricsConfig"]

HOST_PORT_PATTERN = r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}$"
"""`host:port` or `[ipv6]:port`, the form gRPC targets and listeners take."""


class MetricsConfig(StrictModel):
    """Prometheus `/metrics` endpoint."""

    enabled: bool = Field(default=True, description="Serve Prometheus metrics over HTTP.")
    listen_host: str = Field(
        default="127.0.0.1",
        min_length=1,
        max_length=255,
        description="Address to bind; `0.0.0.0` exposes metrics on every interface.",
    )
    listen_port: int = Field(
        default=9108, ge=0, le=65535, description="TCP port to bind; 0 picks a free port (tests)."
    )
