"""Where an agent's events go: media recorders first, then every alert sink, one payload for all.

The frame loop hands each rule event to an `AlertFanout` with what the camera saw (the frame, the
tracked boxes, the camera's config). The fan-out gives the event its stable id (`EventIds`), asks
each `MediaRecorder` (snapshots, clips) for references to what it *will* write (paths and URLs
known at once; the writing happens off the frame loop), adds them to the `edge-alert/v1` payload
as `media`, and hands that one payload to every `AlertSink` (the MQTT publisher, a webhook, the
status page's recent events). A sink or recorder that fails is logged and skipped: the others,
and the frame loop, go on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from detection.detections import Detections
from edge_agent.alerts.payload import EventIds, event_payload
from edge_agent.capture.frames import CapturedFrame
from edge_agent.config.camera import CameraConfig
from edge_agent.rules.engine import RuleEvent

__all__ = ["AlertFanout", "AlertSink", "EventContext", "Lifecycle", "MediaRecorder"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EventContext:
    """One event with what its camera saw when it fired.

    `frame`, `detections` (tracked boxes of that frame) and `camera` are None for events raised
    without a frame, e.g. lasting events ended when the agent or a camera stops.
    """

    event: RuleEvent
    event_id: str
    frame: CapturedFrame | None = None
    detections: Detections | None = None
    camera: CameraConfig | None = None
    class_names: Sequence[str] = ()


@runtime_checkable
class MediaRecorder(Protocol):
    """Records pictures of events (snapshots, clips), off the frame loop."""

    def record(self, context: EventContext) -> Mapping[str, object]:
        """Queue what to write for the event; the references (paths, URLs) it will have, e.g.
        `{"snapshot": {"path": ..., "url": ...}}`, or `{}`. Must not block the frame loop."""
        ...


@runtime_checkable
class Lifecycle(Protocol):
    """A sink or recorder with background work: started with the agent, closed (drained within
    `timeout_s`) when it stops, after the last events were handed over."""

    def start(self) -> None:
        """Start the background work."""
        ...

    def close(self, timeout_s: float) -> None:
        """Finish or drop the pending work within `timeout_s`, then stop."""
        ...


@runtime_checkable
class AlertSink(Protocol):
    """Delivers event payloads somewhere (MQTT, a webhook, the status page)."""

    def deliver(self, context: EventContext, payload: Mapping[str, object]) -> None:
        """Take one `edge-alert/v1` payload; must not block the frame loop for long."""
        ...


class AlertFanout:
    """Ids, media and one payload per event, to every sink (see the module docstring)."""

    def __init__(
        self,
        agent_id: str,
        sinks: Sequence[AlertSink] = (),
        recorders: Sequence[MediaRecorder] = (),
    ) -> None:
        """Fan events of agent `agent_id` out to `sinks`, after asking `recorders` for media."""
        self.agent_id = agent_id
        self.sinks = list(sinks)
        self.recorders = list(recorders)
        self._ids = EventIds(agent_id)
        self.failures = 0

    def emit(
        self,
        event: RuleEvent,
        frame: CapturedFrame | None = None,
        detections: Detections | None = None,
        camera: CameraConfig | None = None,
        class_names: Sequence[str] = (),
    ) -> EventContext:
        """Give `event` its id, record its media and deliver its payload; the context used."""
        context = EventContext(
            event, self._ids.id_for(event), frame, detections, camera, tuple(class_names)
        )
        media: dict[str, object] = {}
        for recorder in self.recorders:
            try:
                media.update(recorder.record(context))
            except Exception:  # no picture is no reason to lose the alert
                self.failures += 1
                logger.exception("media recorder %s failed on event %s", recorder, event.rule)
        payload = event_payload(event, self.agent_id, context.event_id)
        if media:
            payload["media"] = media
        for sink in self.sinks:
            try:
                sink.deliver(context, payload)
            except Exception:
                self.failures += 1
                logger.exception("alert sink %s failed on event %s", sink, event.rule)
        return context
