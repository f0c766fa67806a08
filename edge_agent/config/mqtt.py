"""`mqtt:` — the broker that alerts go to, and the disk outbox in front of it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, model_validator

from configkit.base import StrictModel
from configkit.secrets import SecretRef
from configkit.yaml_loader import config_error_at


class MqttTlsConfig(StrictModel):
    """TLS to the broker; a client certificate and key for mutual TLS."""

    ca_path: Path | None = Field(
        default=None, description="PEM CA bundle to verify the broker; none: system roots."
    )
    cert_path: Path | None = Field(default=None, description="PEM client certificate (mTLS).")
    key_path: Path | None = Field(default=None, description="PEM client private key (mTLS).")

    @model_validator(mode="after")
    def _check_pair(self) -> Self:
        if (self.cert_path is None) != (self.key_path is None):
            raise ValueError(
                "set both `cert_path` and `key_path` for a client certificate, or neither"
            )
        return self


class MqttConfig(StrictModel):
    """Broker connection, topics and the SQLite outbox that keeps events through outages."""

    host: str = Field(default="localhost", min_length=1, max_length=255, description="Broker host.")
    port: int = Field(default=1883, ge=1, le=65535, description="Broker port (8883 for TLS).")
    client_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="MQTT client id; none: `edge-agent-<agent.id>`.",
    )
    topic_prefix: str = Field(
        default="video-analytics",
        pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$",
        max_length=200,
        description="Prefix of every topic; no wildcards, no leading or trailing `/`.",
    )
    qos: int = Field(default=1, ge=0, le=2, description="QoS of event messages (1: at least once).")
    keepalive_s: int = Field(default=30, ge=5, le=3_600, description="MQTT keepalive interval.")
    username: str | None = Field(
        default=None, min_length=1, max_length=256, description="Broker user name."
    )
    password: SecretRef | None = Field(
        default=None, description="Where the broker password comes from."
    )
    tls: MqttTlsConfig | None = Field(default=None, description="TLS; none: plain TCP.")
    status_interval_s: float = Field(
        default=30.0,
        ge=1.0,
        le=3_600.0,
        description="Republish each camera's retained status this often (and on every change).",
    )
    status_ttl_s: float | None = Field(
        default=None,
        ge=1.0,
        le=86_400.0,
        description=(
            "How long a camera's retained status outlives its last refresh on the broker (MQTT 5 "
            "message expiry), so a crashed agent's statuses vanish; none: 3x status_interval_s. "
            "The `stopped` statuses of a clean stop never expire."
        ),
    )
    protocol: Literal["5", "3.1.1"] = Field(
        default="5",
        description="MQTT version; 5 lets statuses expire, 3.1.1 suits brokers without MQTT 5.",
    )
    outbox_path: Path = Field(
        default=Path("/var/lib/edge-agent/outbox.sqlite3"),
        description="SQLite file that holds events until the broker acknowledges them.",
    )
    outbox_max_rows: int = Field(
        default=100_000, ge=100, le=100_000_000, description="Oldest events dropped beyond this."
    )
    outbox_max_age_s: int = Field(
        default=7 * 86_400, ge=60, le=365 * 86_400, description="Events older than this dropped."
    )

    @property
    def effective_status_ttl_s(self) -> float:
        """`status_ttl_s`, or 3x `status_interval_s` when unset."""
        return self.status_ttl_s if self.status_ttl_s is not None else 3.0 * self.status_interval_s

    @model_validator(mode="after")
    def _check_credentials(self) -> Self:
        if self.password is not None and self.username is None:
            raise config_error_at(("password",), "a password needs a `username`")
        return self
