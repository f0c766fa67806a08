"""Broker credentials and TLS on a paho client, shared by the alert publisher and subscriber."""

from __future__ import annotations

import ssl
from collections.abc import Mapping

import paho.mqtt.client as mqtt

from edge_agent.config.mqtt import MqttConfig

__all__ = ["configure_client"]


def configure_client(
    client: mqtt.Client, config: MqttConfig, environ: Mapping[str, str] | None = None
) -> None:
    """Set the user name, password and TLS of `config` on `client` (before it connects).

    The password's secret reference is resolved from `environ` (default `os.environ`); raises
    `SecretError` if it cannot be.
    """
    if config.username is not None:
        password = config.password.resolve(environ=environ) if config.password is not None else None
        client.username_pw_set(config.username, password)
    if config.tls is not None:
        client.tls_set(
            ca_certs=str(config.tls.ca_path) if config.tls.ca_path else None,
            certfile=str(config.tls.cert_path) if config.tls.cert_path else None,
            keyfile=str(config.tls.key_path) if config.tls.key_path else None,
            tls_version=ssl.PROTOCOL_TLS_CLIENT,
        )
