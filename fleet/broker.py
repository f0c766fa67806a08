"""The operator's MQTT link: publish retained documents, read what is retained, watch topics.

paho-mqtt 2 (the client the agent uses, callback API v2), one short-lived connection per
command. Retained messages arrive right after the subscription is acknowledged; there is no
"end of retained" marker in MQTT, so `read_retained` waits until the topics go quiet.
"""

from __future__ import annotations

import logging
import os
import queue
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["BrokerError", "BrokerLink", "BrokerOptions"]

logger = logging.getLogger(__name__)


class BrokerError(Exception):
    """The broker cannot be reached, refused the connection, or did not acknowledge."""


@dataclass(frozen=True)
class BrokerOptions:
    """Where the broker is and how to log in (as the agent's `mqtt:` section says)."""

    host: str = "127.0.0.1"
    port: int = 1883
    ca_path: Path | None = None
    username: str | None = None
    password_env: str | None = None
    timeout_s: float = 10.0

    @classmethod
    def parse_address(cls, address: str) -> tuple[str, int]:
        """`host:port` (IPv6 in brackets) -> (host, port); `ValueError` when malformed."""
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"broker address {address!r}: expected host:port")
        return host.strip("[]"), int(port)


class BrokerLink:
    """A connected client; use as a context manager."""

    def __init__(self, options: BrokerOptions) -> None:
        self.options = options
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"fleet-cli-{uuid.uuid4().hex[:12]}"
        )
        self._connected = threading.Event()
        self._connect_error: str | None = None
        self._subscribed: queue.Queue[bool] = queue.Queue()
        self._messages: queue.Queue[tuple[str, bytes, bool]] = queue.Queue()
        self._client.on_connect = self._on_connect
        self._client.on_message = self._on_message
        self._client.on_subscribe = self._on_subscribe
        if options.username is not None:
            password = None
            if options.password_env is not None:
                password = os.environ.get(options.password_env)
                if password is None:
                    raise BrokerError(f"environment variable {options.password_env} is not set")
            self._client.username_pw_set(options.username, password)
        if options.ca_path is not None:
            try:
                self._client.tls_set(
                    ca_certs=str(options.ca_path), tls_version=ssl.PROTOCOL_TLS_CLIENT
                )
            except (OSError, ssl.SSLError, ValueError) as error:
                raise BrokerError(f"cannot use CA file {options.ca_path}: {error}") from None

    def _on_connect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason: ReasonCode, props: Any
    ) -> None:
        if reason.is_failure:
            self._connect_error = str(reason)
        self._connected.set()

    def _on_subscribe(
        self, client: mqtt.Client, userdata: Any, mid: int, reasons: list[ReasonCode], props: Any
    ) -> None:
        self._subscribed.put(not any(r.is_failure for r in reasons))

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        self._messages.put((message.topic, bytes(message.payload), bool(message.retain)))

    def __enter__(self) -> BrokerLink:
        address = f"{self.options.host}:{self.options.port}"
        try:
            self._client.connect(self.options.host, self.options.port, keepalive=30)
        except (OSError, ssl.SSLError) as error:
            raise BrokerError(f"cannot reach the broker at {address}: {error}") from None
        self._client.loop_start()
        if not self._connected.wait(self.options.timeout_s):
            self._stop()
            raise BrokerError(f"the broker at {address} did not answer the connection")
        if self._connect_error is not None:
            self._stop()
            raise BrokerError(f"the broker at {address} refused: {self._connect_error}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _stop(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    def publish(self, topic: str, payload: bytes, *, retain: bool) -> None:
        """Publish with QoS 1 and wait until the broker has it."""
        info = self._client.publish(topic, payload, qos=1, retain=retain)
        try:
            info.wait_for_publish(self.options.timeout_s)
        except (RuntimeError, ValueError) as error:
            raise BrokerError(f"publish to {topic} failed: {error}") from None
        if not info.is_published():
            raise BrokerError(f"the broker did not acknowledge the publish to {topic}")

    def subscribe(self, topic_filter: str) -> None:
        """Subscribe (QoS 1) and wait for the acknowledgement."""
        self._client.subscribe(topic_filter, qos=1)
        try:
            ok = self._subscribed.get(timeout=self.options.timeout_s)
        except queue.Empty:
            raise BrokerError(f"no answer to the subscription to {topic_filter}") from None
        if not ok:
            raise BrokerError(f"the broker refused the subscription to {topic_filter}")

    def read_retained(self, topic_filter: str, quiet_s: float = 0.5) -> dict[str, bytes]:
        """The retained messages under `topic_filter` (empty payloads left out)."""
        self.subscribe(topic_filter)
        found: dict[str, bytes] = {}
        for topic, payload, retained in self.messages(quiet_s):
            if retained:
                if payload:
                    found[topic] = payload
                else:
                    found.pop(topic, None)
        self._client.unsubscribe(topic_filter)
        return found

    def messages(self, quiet_s: float) -> Iterator[tuple[str, bytes, bool]]:
        """Messages as they come, until none has come for `quiet_s` seconds."""
        while True:
            try:
                yield self._messages.get(timeout=quiet_s)
            except queue.Empty:
                return

    def next_message(self, deadline: float) -> tuple[str, bytes, bool] | None:
        """The next message, or None once `deadline` (`time.monotonic()`) has passed."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            return self._messages.get(timeout=remaining)
        except queue.Empty:
            return None
