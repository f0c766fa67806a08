"""The demo's local broker: Mosquitto or the embedded amqtt, with what the agent relies on."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from testbed.broker import BrokerKind, amqtt_available, mosquitto_executable, start_broker

pytestmark = pytest.mark.timeout(60)


def _client(client_id: str) -> mqtt.Client:
    return mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)


@pytest.mark.process
@pytest.mark.parametrize("kind", ["mosquitto", "amqtt"])
def test_broker_keeps_qos1_retained_and_last_will(kind: BrokerKind, tmp_path: Path) -> None:
    if kind == "mosquitto" and mosquitto_executable() is None:
        pytest.skip("mosquitto not installed")
    if kind == "amqtt" and not amqtt_available():
        pytest.skip("amqtt not installed")
    broker = start_broker(kind, tmp_path)
    try:
        publisher = _client("agent")
        publisher.will_set("t/availability", b"offline", qos=1, retain=True)
        publisher.connect(broker.host, broker.port, keepalive=5)
        publisher.loop_start()
        publisher.publish("t/availability", b"online", qos=1, retain=True).wait_for_publish(5)
        for i in range(20):
            publisher.publish("t/events", str(i).encode(), qos=1).wait_for_publish(5)
        sock = publisher.socket()
        assert sock is not None
        sock.close()  # dies without DISCONNECT: the broker sends the will
        publisher.loop_stop()
        time.sleep(1.0)

        received: list[tuple[str, bytes, bool]] = []
        subscribed = threading.Event()
        subscriber = _client("late-subscriber")
        subscriber.on_subscribe = lambda *_: subscribed.set()

        def on_message(_c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
            received.append((msg.topic, bytes(msg.payload), bool(msg.retain)))

        subscriber.on_message = on_message
        subscriber.connect(broker.host, broker.port)
        subscriber.subscribe("t/#", qos=1)
        subscriber.loop_start()
        assert subscribed.wait(5)
        time.sleep(0.5)
        subscriber.disconnect()
        subscriber.loop_stop()
    finally:
        broker.stop()
    assert received == [("t/availability", b"offline", True)], broker.log_tail()
