"""The Mosquitto fixture with a real paho-mqtt 2.x client: delivery, retain, Last Will, restarts."""

from __future__ import annotations

import queue
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from tests.fixtures.mqtt import MosquittoBroker

EVENT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Received:
    """A message as a subscriber saw it."""

    topic: str
    payload: bytes
    qos: int
    retain: bool


class TestClient:
    """A paho client on its own network thread that records what happens to it.

    Subscriptions are (re)made in `on_connect`, so they survive a broker restart.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, broker: MosquittoBroker, *, subscriptions: tuple[str, ...] = ()) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"selftest-{uuid.uuid4().hex[:8]}"
        )
        self.client.reconnect_delay_set(min_delay=1, max_delay=1)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.broker = broker
        self.subscriptions = subscriptions
        self.messages: queue.Queue[Received] = queue.Queue()
        self.connects = 0
        self.disconnects = 0
        self._changed = threading.Condition()
        self._subscribed = 0

    def _on_connect(
        self, client: mqtt.Client, _userdata: object, _flags: object, reason: ReasonCode, _p: object
    ) -> None:
        if reason.is_failure:
            return
        for topic in self.subscriptions:
            client.subscribe(topic, qos=1)
        with self._changed:
            self.connects += 1
            self._changed.notify_all()

    def _on_disconnect(
        self,
        _client: mqtt.Client,
        _userdata: object,
        _flags: object,
        _reason: ReasonCode,
        _p: object,
    ) -> None:
        with self._changed:
            self.disconnects += 1
            self._changed.notify_all()

    def _on_subscribe(
        self, _client: mqtt.Client, _userdata: object, _mid: int, _codes: object, _p: object
    ) -> None:
        with self._changed:
            self._subscribed += 1
            self._changed.notify_all()

    def _on_message(self, _client: mqtt.Client, _userdata: object, msg: mqtt.MQTTMessage) -> None:
        self.messages.put(Received(msg.topic, bytes(msg.payload), msg.qos, bool(msg.retain)))

    def wait_for(self, what: str, minimum: int, *, timeout_s: float = EVENT_TIMEOUT_S) -> None:
        """Wait until counter `what` (connects, disconnects, _subscribed) reaches `minimum`."""
        with self._changed:
            ok = self._changed.wait_for(lambda: getattr(self, what) >= minimum, timeout=timeout_s)
        assert ok, f"{what} < {minimum} after {timeout_s} s; broker log:\n{self.broker.log_tail()}"

    def start(self) -> TestClient:
        """Connect, start the network thread, wait for CONNACK and all SUBACKs."""
        self.client.connect(self.broker.host, self.broker.port, keepalive=10)
        self.client.loop_start()
        self.wait_for("connects", 1)
        self.wait_for("_subscribed", len(self.subscriptions))
        return self

    def next_message(self, *, timeout_s: float = EVENT_TIMEOUT_S) -> Received:
        """The next received message; fails the test after `timeout_s`."""
        try:
            return self.messages.get(timeout=timeout_s)
        except queue.Empty:
            pytest.fail(f"no message in {timeout_s} s; broker log:\n{self.broker.log_tail()}")

    def close(self) -> None:
        """Disconnect cleanly and stop the network thread."""
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def clients(mosquitto_broker: MosquittoBroker) -> Iterator[list[TestClient]]:
    """A list to put test clients in; all are closed after the test."""
    made: list[TestClient] = []
    yield made
    for client in made:
        client.close()


def test_qos1_message_is_delivered_with_exact_topic_payload_and_qos(
    mosquitto_broker: MosquittoBroker, clients: list[TestClient]
) -> None:
    subscriber = TestClient(mosquitto_broker, subscriptions=("site/+/events",)).start()
    publisher = TestClient(mosquitto_broker).start()
    clients += [subscriber, publisher]

    info = publisher.client.publish("site/cam1/events", b'{"v":1}', qos=1)
    info.wait_for_publish(timeout=EVENT_TIMEOUT_S)

    assert info.is_published()
    assert subscriber.next_message() == Received("site/cam1/events", b'{"v":1}', 1, False)


def test_retained_message_reaches_a_late_subscriber(
    mosquitto_broker: MosquittoBroker, clients: list[TestClient]
) -> None:
    publisher = TestClient(mosquitto_broker).start()
    clients.append(publisher)
    publisher.client.publish("site/agent/status", b"online", qos=1, retain=True).wait_for_publish(
        timeout=EVENT_TIMEOUT_S
    )

    late = TestClient(mosquitto_broker, subscriptions=("site/agent/status",)).start()
    clients.append(late)

    assert late.next_message() == Received("site/agent/status", b"online", 1, True)


def test_last_will_is_published_when_a_client_dies_uncleanly(
    mosquitto_broker: MosquittoBroker, clients: list[TestClient]
) -> None:
    watcher = TestClient(mosquitto_broker, subscriptions=("site/agent/availability",)).start()
    clients.append(watcher)
    dying = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="selftest-dying")
    dying.will_set("site/agent/availability", b"offline", qos=1, retain=True)
    dying.connect(mosquitto_broker.host, mosquitto_broker.port, keepalive=10)
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while not dying.is_connected() and time.monotonic() < deadline:
        dying.loop(timeout=0.1)
    assert dying.is_connected()

    # No DISCONNECT packet: the TCP connection just goes away, as when the process dies.
    sock = dying.socket()
    assert isinstance(sock, socket.socket)
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()

    # Live subscribers get the will with retain 0 (MQTT 3.1.1 3.3.1.3); it is also retained.
    assert watcher.next_message() == Received("site/agent/availability", b"offline", 1, False)
    late = TestClient(mosquitto_broker, subscriptions=("site/agent/availability",)).start()
    clients.append(late)
    assert late.next_message() == Received("site/agent/availability", b"offline", 1, True)


def test_broker_restart_client_sees_disconnect_then_reconnects_and_delivers(
    mosquitto_broker: MosquittoBroker, clients: list[TestClient]
) -> None:
    subscriber = TestClient(mosquitto_broker, subscriptions=("site/cam1/events",)).start()
    publisher = TestClient(mosquitto_broker).start()
    clients += [subscriber, publisher]

    mosquitto_broker.stop()
    subscriber.wait_for("disconnects", 1)
    publisher.wait_for("disconnects", 1)
    assert not publisher.client.is_connected()

    mosquitto_broker.start()
    subscriber.wait_for("connects", 2)
    publisher.wait_for("connects", 2)
    subscriber.wait_for("_subscribed", 2)

    info = publisher.client.publish("site/cam1/events", b"after-restart", qos=1)
    info.wait_for_publish(timeout=EVENT_TIMEOUT_S)
    assert subscriber.next_message() == Received("site/cam1/events", b"after-restart", 1, False)
