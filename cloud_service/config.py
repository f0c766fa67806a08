"""Config of the cloud service (one YAML per service)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from configkit.base import StrictModel


class TlsConfig(StrictModel):
    """Server TLS; with `client_ca_path` set, clients must present a certificate (mutual TLS)."""

    cert_path: Path = Field(description="PEM certificate chain of the server.")
    key_path: Path = Field(description="PEM private key of the server.")
    client_ca_path: Path | None = Field(
        default=None, description="PEM CA bundle that client certificates must chain to (mTLS)."
    )


class ServerConfig(StrictModel):
    """gRPC listener: address, message limits, keepalive, TLS, auth and shutdown grace."""

    listen_address: str = Field(
        default="127.0.0.1:50051",
        pattern=r"^.+:\d{1,5}$",
        description="host:port to bind; port 0 picks a free port (tests).",
    )
    max_receive_message_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024, description="Largest request."
    )
    max_send_message_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024, description="Largest reply."
    )
    max_concurrent_streams: int = Field(
        default=256, ge=1, le=100_000, description="HTTP/2 streams per connection."
    )
    worker_threads: int = Field(
        default=16, ge=1, le=1024, description="Threads serving RPC handlers."
    )
    keepalive_time_ms: int = Field(
        default=30_000, ge=1000, le=3_600_000, description="Ping an idle connection this often."
    )
    keepalive_timeout_ms: int = Field(
        default=10_000, ge=100, le=600_000, description="Drop the connection if a ping is unanswered."
    )
    grace_period_s: float = Field(
        default=10.0, ge=0.0, le=600.0, description="Drain time for in-flight work on shutdown."
    )
    tls: TlsConfig | None = Field(default=None, description="TLS; none serves plaintext.")
    auth_tokens_env: str | None = Field(
        default=None,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="Environment variable holding comma-separated bearer tokens; none: no auth.",
    )
    reflection: bool = Field(default=True, description="Serve gRPC server reflection.")
