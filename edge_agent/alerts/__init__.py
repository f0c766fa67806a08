"""Alerts: rule events to MQTT through a disk-backed outbox; `payload` documents the schema."""

from edge_agent.alerts.outbox import Outbox, OutboxMessage
from edge_agent.alerts.payload import (
    SCHEMA,
    EventIds,
    availability_topic,
    encode_event,
    event_payload,
    event_topic,
    status_topic,
)
from edge_agent.alerts.publisher import AlertPublisher

__all__ = [
    "SCHEMA",
    "AlertPublisher",
    "EventIds",
    "Outbox",
    "OutboxMessage",
    "availability_topic",
    "encode_event",
    "event_payload",
    "event_topic",
    "status_topic",
]
