"""Prometheus metrics of the cloud service, in a registry owned by the service (not the global one).

Names (all prefixed `cloud_service_`):
- `queue_time_seconds` (histogram): admission to batch formation, per answered frame.
- `batch_size_frames` (histogram): frames per batch handed to the engine.
- `decode_time_seconds` (histogram): JPEG decoding per batch (frames are decoded together).
- `inference_time_seconds` (histogram): detector run per batch.
- `frames_in_flight` (gauge): frames admitted and not yet answered.
- `queue_depth_frames` (gauge): frames waiting for a batch.
- `frames_rejected_total{reason}` (counter): frames answered without inference: `stream_queue_full`,
  `queue_full` (RESOURCE_EXHAUSTED), `deadline_exceeded` (late on arrival), `deadline_in_queue`
  (DEADLINE_EXCEEDED), `draining`, `drain_timeout` (UNAVAILABLE), `processing_failed` (INTERNAL
  for a whole batch). Frames the processor rejects (INVALID_ARGUMENT) count only in
  `frames_total`.
- `frames_total{agent_id, camera_id, code}` (counter): every answer per stream key and status code;
  `rate()` of it gives the per-stream frame rates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

logger = logging.getLogger(__name__)

_PREFIX = "cloud_service_"
_TIME_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServiceMetrics:
    """The service's metrics, registered in `registry` (a fresh one unless given)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.queue_time = Histogram(
            f"{_PREFIX}queue_time_seconds",
            "Time from admission to batch formation, per frame.",
            buckets=_TIME_BUCKETS_S,
            registry=reg,
        )
        self.batch_size = Histogram(
            f"{_PREFIX}batch_size_frames",
            "Frames per batch handed to the engine.",
            buckets=_BATCH_BUCKETS,
            registry=reg,
        )
        self.decode_time = Histogram(
            f"{_PREFIX}decode_time_seconds",
            "JPEG decoding time per batch.",
            buckets=_TIME_BUCKETS_S,
            registry=reg,
        )
        self.inference_time = Histogram(
            f"{_PREFIX}inference_time_seconds",
            "Detector time per batch.",
            buckets=_TIME_BUCKETS_S,
            registry=reg,
        )
        self.in_flight = Gauge(
            f"{_PREFIX}frames_in_flight", "Frames admitted and not yet answered.", registry=reg
        )
        self.queue_depth = Gauge(
            f"{_PREFIX}queue_depth_frames", "Frames waiting for a batch.", registry=reg
        )
        self.rejected = Counter(
            f"{_PREFIX}frames_rejected",
            "Frames answered without inference, by reason.",
            ["reason"],
            registry=reg,
        )
        self.frames = Counter(
            f"{_PREFIX}frames",
            "Frames answered, per stream key and status code.",
            ["agent_id", "camera_id", "code"],
            registry=reg,
        )

    def observe_answer(self, agent_id: str, camera_id: str, code: str) -> None:
        """Count one answered frame."""
        self.frames.labels(agent_id=agent_id, camera_id=camera_id, code=code).inc()

    def observe_rejection(self, reason: str) -> None:
        """Count one frame answered without inference."""
        self.rejected.labels(reason=reason).inc()


@dataclass
class MetricsExporter:
    """A running `/metrics` HTTP endpoint; `close` stops it."""

    server: WSGIServer
    thread: Thread

    @property
    def port(self) -> int:
        """The bound port (useful when started on port 0)."""
        return int(self.server.server_port)

    def close(self) -> None:
        """Stop serving and release the socket."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def start_metrics_exporter(metrics: ServiceMetrics, host: str, port: int) -> MetricsExporter:
    """Serve `metrics.registry` at `http://host:port/metrics` from a daemon thread."""
    server, thread = start_http_server(port, addr=host, registry=metrics.registry)
    exporter = MetricsExporter(server, thread)
    logger.info("Prometheus metrics on http://%s:%s/metrics", host, exporter.port)
    return exporter
