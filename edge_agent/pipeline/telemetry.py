"""`AgentTelemetry`: the frame loop's numbers into Prometheus metrics (`edge_agent.metrics`)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from edge_agent.alerts import AlertPublisher
from edge_agent.alerts.webhook import WebhookSink
from edge_agent.media.store import MediaStore
from edge_agent.metrics import CAMERA_STATES, EdgeMetrics
from edge_agent.pipeline.camera import CameraWorker, FrameOutcome
from edge_agent.pipeline.model_swap import ModelIdentity
from edge_agent.pipeline.status import CameraStatus
from edge_agent.rules import RuleEvent


class AgentTelemetry:
    """Records per-batch and per-frame timings at once, and counters kept elsewhere on `refresh`."""

    def __init__(self, metrics: EdgeMetrics, runtime: str) -> None:
        self.metrics = metrics
        self.runtime = runtime

    def on_model(self, model: ModelIdentity) -> None:
        """The detector now runs `model` (at start and after a swap or roll-back)."""
        self.runtime = model.runtime
        self.metrics.model_info.clear()
        self.metrics.model_info.labels(
            model=model.name, version=model.version, runtime=model.runtime
        ).set(1)

    def on_model_swap(self, outcome: str) -> None:
        """A model swap `applied`, `refused` or `rolled_back`."""
        self.metrics.model_swaps.labels(outcome=outcome).inc()

    def on_batch(self, frames: int, detect_s: float) -> None:
        """One detector run over `frames` frames."""
        self.metrics.detect_latency.labels(runtime=self.runtime).observe(detect_s)
        self.metrics.detect_batch_size.observe(frames)

    def on_outcome(self, outcome: FrameOutcome) -> None:
        """One analysed frame."""
        camera = outcome.camera
        self.metrics.frames.labels(camera=camera).inc()
        self.metrics.track_latency.labels(camera=camera).observe(outcome.track_s)
        self.metrics.rules_latency.labels(camera=camera).observe(outcome.rules_s)
        age_s = time.monotonic() - outcome.frame.monotonic_s
        self.metrics.end_to_end_latency.labels(camera=camera).observe(age_s)

    def on_events(self, events: Iterable[RuleEvent]) -> None:
        """Events just queued in the outbox."""
        now = time.time()
        for event in events:
            self.metrics.observe_event(event.camera, event.rule, event.kind, event.phase)
            self.metrics.alert_latency.observe(max(0.0, now - event.timestamp_s))

    def refresh(
        self,
        workers: Iterable[CameraWorker],
        status: dict[str, CameraStatus],
        publisher: AlertPublisher,
        media: MediaStore | None = None,
        webhook: WebhookSink | None = None,
    ) -> None:
        """Counters and gauges whose truth lives in the sources, workers, outbox, media store
        and webhook sink."""
        m = self.metrics
        for worker in workers:
            stats = worker.source.stats()
            camera = worker.name
            state = status[camera].state
            m.set_camera_state(camera, state if state in CAMERA_STATES else "stopped")
            m.camera_fps.labels(camera=camera).set(status[camera].fps())
            m.camera_target_fps.labels(camera=camera).set(worker.config.target_fps)
            m.set_frames_dropped_total(camera, stats.drops + worker.counters.skipped_rate)
            m.set_reconnects_total(camera, stats.reconnects)
            m.set_camera_total(m.motion_skipped_frames, camera, worker.counters.skipped_motion)
            m.set_camera_total(m.embedded_boxes, camera, worker.tracker.embedded_boxes)
            for change, total in worker.counters.fusion.changes().items():
                m.set_fusion_total(camera, change, total)
            agreement = worker.cloud_trust.agreement
            if agreement is not None:
                m.cloud_agreement.labels(camera=camera).set(agreement)
        if media is not None:
            kept = media.stats()
            m.set_total(m.media_files, kept.written)
            m.set_total(m.media_bytes, kept.bytes_written)
            m.set_total(m.media_deleted, kept.deleted)
            m.set_total(m.media_lost, kept.dropped, reason="dropped")
            m.set_total(m.media_lost, kept.failed, reason="failed")
            m.set_total(m.media_lost, kept.dropped_frames, reason="clip_frame")
        if webhook is not None:
            sent = webhook.stats()
            for outcome, total in (
                ("sent", sent.sent),
                ("failed", sent.failed),
                ("dropped", sent.dropped),
            ):
                m.set_total(m.webhook_events, total, outcome=outcome)
            m.webhook_queue.set(sent.queued)
        m.outbox_depth.set(publisher.outbox.depth())
        m.set_outbox_dropped_total(publisher.outbox.dropped)
        m.mqtt_connected.set(1 if publisher.connected else 0)
