"""`AlertPublisher`: rule events to MQTT through the disk outbox, with availability and Last Will.

Flow: `publish_event` writes the encoded event into the `Outbox` (SQLite) and wakes a worker
thread. The worker hands the oldest rows to paho, at most `window` at a time, only while connected
and only once the previous batch is fully acknowledged (so a reconnect, where paho resends its
unacknowledged messages, never reorders them). A row leaves the outbox only after its PUBACK
(`on_publish` with its mid). paho's network thread (`loop_start`) reconnects with exponential
back-off; on each connect the agent publishes `online` (retained, QoS 1) to its availability topic,
whose Last Will is `offline`. `close()` drains for a bounded time, publishes `offline` and
disconnects.

Camera statuses are retained, so a crashed agent's last status would outlive it. Each status is
therefore published with an MQTT 5 message expiry (`mqtt.status_ttl_s`, default 3x the refresh
interval) and says when it expires (`expires_at`): while the agent lives it refreshes them; after
a crash the broker deletes them, and `availability` (the Last Will) says `offline`. The statuses
of a clean stop (`stopped`) are published without expiry: they stay true.

Delivery is at least once: a message acknowledged by the broker but not yet deleted when the
process dies is sent again by the next instance on the same outbox file.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edge_agent.alerts.connection import configure_client
from edge_agent.alerts.outbox import Outbox
from edge_agent.alerts.payload import (
    AVAILABILITY_OFFLINE,
    AVAILABILITY_ONLINE,
    EventIds,
    availability_topic,
    encode_event,
    encode_status,
    event_topic,
    iso_utc,
    status_topic,
)
from edge_agent.alerts.sinks import EventContext
from edge_agent.config.mqtt import MqttConfig
from edge_agent.rules.engine import RuleEvent

__all__ = ["AlertPublisher"]

logger = logging.getLogger(__name__)

_QUEUED = (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN)


class AlertPublisher:
    """Publishes an agent's rule events and availability to MQTT, never losing an event."""

    def __init__(
        self,
        config: MqttConfig,
        agent_id: str,
        *,
        outbox: Outbox | None = None,
        window: int = 20,
        reconnect_min_s: int = 1,
        reconnect_max_s: int = 30,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """Set up (not connect) a publisher; `outbox` defaults to `Outbox.from_config(config)`.

        `window` is the largest batch handed to paho at once; `environ` is where the password's
        secret reference is resolved (default `os.environ`); raises `SecretError` if it cannot be.
        """
        if window < 1:
            raise ValueError("window must be at least 1")
        self.config = config
        self.agent_id = agent_id
        self.outbox = outbox if outbox is not None else Outbox.from_config(config)
        self.window = window
        self.availability_topic = availability_topic(config.topic_prefix, agent_id)
        self._event_ids = EventIds(agent_id)
        self._connected = threading.Event()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._acks: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._inflight: dict[int, int] = {}  # paho mid -> outbox row id; worker thread only
        self._idle = threading.Event()  # set while nothing is in flight and the outbox is empty
        self._worker: threading.Thread | None = None
        self._closed = False

        client_id = config.client_id or f"edge-agent-{agent_id}"
        self._mqtt5 = config.protocol == "5"
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5 if self._mqtt5 else mqtt.MQTTv311,
        )
        self.client.will_set(self.availability_topic, AVAILABILITY_OFFLINE, qos=1, retain=True)
        self.client.reconnect_delay_set(min_delay=reconnect_min_s, max_delay=reconnect_max_s)
        self.client.max_inflight_messages_set(max(window, 20) + 2)
        configure_client(self.client, config, environ)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish

    @property
    def connected(self) -> bool:
        """Whether the broker connection is up."""
        return self._connected.is_set()

    def start(self) -> None:
        """Connect in the background (retrying with back-off) and start the worker thread."""
        if self._worker is not None:
            return
        self._worker = threading.Thread(target=self._run, name="alert-outbox", daemon=True)
        self._worker.start()
        self.client.connect_async(self.config.host, self.config.port, self.config.keepalive_s)
        self.client.loop_start()

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait until connected; returns whether it is."""
        return self._connected.wait(timeout_s)

    def publish_event(self, event: RuleEvent) -> int:
        """Queue `event` in the outbox (durably) and trigger a drain; returns its outbox id."""
        topic = event_topic(self.config.topic_prefix, self.agent_id, event.camera, event.rule)
        payload = encode_event(event, self.agent_id, self._event_ids.id_for(event))
        return self._enqueue(topic, payload, self.config.qos, retain=False)

    def deliver(self, context: EventContext, payload: Mapping[str, object]) -> None:
        """`AlertSink`: queue the ready `payload` of `context.event` in the outbox."""
        event = context.event
        topic = event_topic(self.config.topic_prefix, self.agent_id, event.camera, event.rule)
        encoded = json.dumps(dict(payload), separators=(",", ":")).encode()
        self._enqueue(topic, encoded, self.config.qos, retain=False)

    def publish_status(
        self, camera: str, status: Mapping[str, object], *, expires: bool = True
    ) -> int:
        """Queue a retained JSON status of `camera` (QoS 1); returns its outbox id.

        With `expires`, the status carries `expires_at` and the broker deletes it then unless a
        newer one replaced it (MQTT 5); a status not sent by then is not sent at all.
        """
        topic = status_topic(self.config.topic_prefix, self.agent_id, camera)
        document = dict(status)
        expires_s = None
        if expires:
            expires_s = time.time() + self.config.effective_status_ttl_s
            document["expires_at"] = iso_utc(expires_s)
        return self._enqueue(topic, encode_status(document), 1, retain=True, expires_s=expires_s)

    def clear_status(self, camera: str) -> int:
        """Delete `camera`'s retained status from the broker (a camera removed by a reload)."""
        return self.publish_retained(
            status_topic(self.config.topic_prefix, self.agent_id, camera), b""
        )

    def publish_retained(self, topic: str, payload: bytes) -> int:
        """Queue any retained message (QoS 1) through the outbox, e.g. Home Assistant discovery
        configs or zone states; an empty `payload` clears the topic. Returns its outbox id."""
        return self._enqueue(topic, payload, 1, retain=True)

    def flush(self, timeout_s: float) -> bool:
        """Wait until the outbox is empty and nothing is in flight; returns whether it is."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._idle.clear()
            self._wake.set()
            if self._idle.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
                return True
        return False

    def close(self, timeout_s: float = 5.0) -> None:
        """Drain for up to `timeout_s`, publish `offline` (retained), disconnect, close the outbox.

        Events not delivered by then stay in the outbox for the next start.
        """
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        if self._worker is not None and self.connected:
            if not self.flush(timeout_s):
                logger.warning(
                    "closing with %d alert message(s) still in the outbox", self.outbox.depth()
                )
            if self.connected:
                info = self.client.publish(
                    self.availability_topic, AVAILABILITY_OFFLINE, qos=1, retain=True
                )
                try:
                    info.wait_for_publish(max(0.1, deadline - time.monotonic()))
                except (RuntimeError, ValueError):
                    logger.warning("could not publish `offline` before disconnecting")
        self._stop.set()
        self._wake.set()
        if self._worker is not None:
            self.client.disconnect()
            self.client.loop_stop()
            self._worker.join(timeout=5.0)
        self.outbox.close()

    def __enter__(self) -> AlertPublisher:
        """Start and return the publisher."""
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close the publisher."""
        self.close()

    # -- internals -----------------------------------------------------------------------------

    def _enqueue(
        self, topic: str, payload: bytes, qos: int, *, retain: bool, expires_s: float | None = None
    ) -> int:
        if self._closed:
            raise RuntimeError("AlertPublisher is closed")
        row_id = self.outbox.put(topic, payload, qos, retain, expires_s)
        self._idle.clear()
        self._wake.set()
        return row_id

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:
            logger.warning(
                "MQTT broker %s refused the connection: %s", self.config.host, reason_code
            )
            return
        logger.info("connected to MQTT broker %s:%d", self.config.host, self.config.port)
        client.publish(self.availability_topic, AVAILABILITY_ONLINE, qos=1, retain=True)
        self._connected.set()
        self._wake.set()

    def _on_disconnect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if self._connected.is_set():
            # Our own disconnect on close is routine; any other is worth a warning.
            level = logging.INFO if self._closed else logging.WARNING
            logger.log(level, "disconnected from MQTT broker: %s", reason_code)
        self._connected.clear()

    def _on_publish(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        # Runs in paho's thread holding its locks: only hand the mid over to the worker.
        self._acks.put(mid)
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                self._process_acks()
                self._drain()
            except Exception:  # keep the worker alive; the rows stay in the outbox
                logger.exception("alert outbox worker failed; retrying")
                self._stop.wait(1.0)

    def _process_acks(self) -> None:
        acked: list[int] = []
        while True:
            try:
                mid = self._acks.get_nowait()
            except queue.Empty:
                break
            row_id = self._inflight.pop(mid, None)
            if row_id is not None:
                acked.append(row_id)
        if acked:
            self.outbox.ack(acked)

    def _drain(self) -> None:
        if self._inflight:
            return  # the batch handed to paho is not fully acknowledged yet
        if not self._connected.is_set():
            return
        rows = self.outbox.peek(self.window)
        if not rows:
            self._idle.set()
            return
        for row in rows:
            properties = None
            if row.expires_s is not None and self._mqtt5:
                properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
                properties.MessageExpiryInterval = max(1, math.ceil(row.expires_s - time.time()))
            info = self.client.publish(
                row.topic, row.payload, qos=row.qos, retain=row.retain, properties=properties
            )
            if info.rc not in _QUEUED:
                logger.warning("paho refused an alert message: %s", mqtt.error_string(info.rc))
                break
            if row.qos == 0:
                self.outbox.ack([row.id])  # no PUBACK for QoS 0: sent is as good as it gets
            else:
                self._inflight[info.mid] = row.id
        self._wake.set()  # acks may already have arrived for this batch
