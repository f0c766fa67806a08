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
  for a whole batch), `invalid_identity` (INVALID_ARGUMENT: an empty, overlong or odd agent,
  camera or request id). Frames the processor rejects (INVALID_ARGUMENT) count only in
  `frames_total`.
- `frame_streams` / `frame_streams_limit` (gauges): frame streams open, and the most this replica
  serves at once (`server.worker_threads - server.reserved_threads`; 0 when unlimited);
  `frame_streams_refused_total` (counter): streams refused RESOURCE_EXHAUSTED at that limit.
- `log_lines_suppressed_total{event}` (counter): repeated client-driven WARNING lines
  (`stream_refused`, `malformed_request`) left out by the one-line-per-10-s limit
  (`configkit.log_limit`); the first line after a quiet spell says how many.
- `video_packets_total{outcome}` (counter): video uplink packets `decoded`, `reference_lost`
  (answered `keyframe_required`), `corrupt`, `invalid`; `evicted` counts decoders dropped.
- `frames_total{agent_id, camera_id, code}` (counter): every answer per stream key and status code;
  `rate()` of it gives the per-stream frame rates. The label values are client-chosen, so they
  are bounded: identities that fail `cloud_service.identity` count as `invalid`, and at most
  `max_stream_labels` (agent, camera) pairs hold a label at once. A new pair past that takes the
  slot of the least recently answered pair if that one has been silent for `stream_label_idle_s`
  (its series are removed), else it counts as `other`: a flood of made-up ids holds the slots
  only while it lasts, and a running agent, answered every few seconds, never loses its own;
  `stream_labels_evicted_total` (counter) counts the slots taken over.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from cloud_service.identity import id_problem
from configkit.metrics import BATCH_BUCKETS, MetricDeclarer, MetricsExporter, serve_registry

__all__ = ["MetricsExporter", "ServiceMetrics", "start_metrics_exporter"]

_PREFIX = "cloud_service_"
INVALID_LABEL = "invalid"  # an agent or camera id `cloud_service.identity` refuses
OTHER_LABEL = "other"  # a stream key past `max_stream_labels`
VIDEO_OUTCOMES = ("decoded", "reference_lost", "corrupt", "invalid", "evicted")


class ServiceMetrics:
    """The service's metrics, registered in `registry` (a fresh one unless given)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        max_stream_labels: int = 1000,
        stream_label_idle_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.max_stream_labels = max_stream_labels
        self.stream_label_idle_s = stream_label_idle_s
        self._clock = clock
        # stream key -> (last answered, status codes it has series for); least recent first
        self._stream_labels: OrderedDict[tuple[str, str], tuple[float, set[str]]] = OrderedDict()
        self._labels_lock = threading.Lock()
        declare = MetricDeclarer(_PREFIX, self.registry)
        self.queue_time = declare.histogram(
            "queue_time_seconds", "Time from admission to batch formation, per frame."
        )
        self.batch_size = declare.histogram(
            "batch_size_frames", "Frames per batch handed to the engine.", buckets=BATCH_BUCKETS
        )
        self.decode_time = declare.histogram("decode_time_seconds", "JPEG decoding time per batch.")
        self.inference_time = declare.histogram(
            "inference_time_seconds", "Detector time per batch."
        )
        self.in_flight = declare.gauge("frames_in_flight", "Frames admitted and not yet answered.")
        self.queue_depth = declare.gauge("queue_depth_frames", "Frames waiting for a batch.")
        self.rejected = declare.counter(
            "frames_rejected", "Frames answered without inference, by reason.", "reason"
        )
        self.frame_streams = declare.gauge(
            "frame_streams", "Frame streams open (one per edge agent)."
        )
        self.frame_streams_limit = declare.gauge(
            "frame_streams_limit", "Frame streams this replica serves at once; 0: unlimited."
        )
        self.frame_streams_refused = declare.counter(
            "frame_streams_refused", "Frame streams refused RESOURCE_EXHAUSTED at the stream limit."
        )
        self.frames = declare.counter(
            "frames",
            "Frames answered, per stream key and status code.",
            "agent_id",
            "camera_id",
            "code",
        )
        self.log_lines_suppressed = declare.counter(
            "log_lines_suppressed",
            "Log lines left out by the per-event rate limit (stream_refused, malformed_request).",
            "event",
        )
        self.stream_labels_evicted = declare.counter(
            "stream_labels_evicted",
            "Label slots of frames_total taken over from a stream key silent for "
            "stream_label_idle_s (its series removed).",
        )

        self.model_frames = declare.counter(
            "model_frames",
            "Frames answered with detections, per model name and version (A/B tests, swaps).",
            "model",
            "version",
        )
        self.video_packets = declare.counter(
            "video_packets",
            "Video uplink packets by outcome: decoded, reference_lost (keyframe asked for), "
            "corrupt, invalid, evicted (a camera's decoder dropped).",
            "outcome",
        )

    def observe_answer(
        self, agent_id: str, camera_id: str, code: str, model: tuple[str, str] | None = None
    ) -> None:
        """Count one answered frame (under bounded labels, see the module docstring), and the
        `(name, version)` of the model that answered it, if one did."""
        with self._labels_lock:  # a slot taken over meanwhile must not get a series back
            agent, camera = self._labels_locked(agent_id, camera_id, code)
            self.frames.labels(agent_id=agent, camera_id=camera, code=code).inc()
        if model is not None:
            self.model_frames.labels(model=model[0], version=model[1]).inc()

    def stream_labels(self, agent_id: str, camera_id: str) -> tuple[str, str]:
        """The label values `frames_total` uses for this stream key (and it counts as used)."""
        with self._labels_lock:
            return self._labels_locked(agent_id, camera_id, None)

    def _labels_locked(self, agent_id: str, camera_id: str, code: str | None) -> tuple[str, str]:
        if id_problem("agent_id", agent_id) or id_problem("camera_id", camera_id):
            return INVALID_LABEL, INVALID_LABEL
        key, now = (agent_id, camera_id), self._clock()
        slot = self._stream_labels.get(key)
        if slot is None:
            if len(self._stream_labels) >= self.max_stream_labels and not self._evict_idle(now):
                return OTHER_LABEL, OTHER_LABEL
            slot = (now, set())
        codes = slot[1]
        if code is not None:
            codes.add(code)
        self._stream_labels[key] = (now, codes)
        self._stream_labels.move_to_end(key)
        return key

    def _evict_idle(self, now: float) -> bool:
        """Free the least recently answered slot if it has been silent long enough."""
        key, (last, codes) = next(iter(self._stream_labels.items()))
        if now - last < self.stream_label_idle_s:
            return False
        del self._stream_labels[key]
        for code in codes:
            try:
                self.frames.remove(*key, code)
            except KeyError:  # no series was made for it
                pass
        self.stream_labels_evicted.inc()
        return True

    def observe_video_packet(self, outcome: str) -> None:
        """Count one video uplink event (`cloud_service.decoders.video` names them)."""
        if outcome not in VIDEO_OUTCOMES:
            raise ValueError(f"unknown video outcome {outcome!r}; expected one of {VIDEO_OUTCOMES}")
        self.video_packets.labels(outcome=outcome).inc()

    def observe_rejection(self, reason: str) -> None:
        """Count one frame answered without inference."""
        self.rejected.labels(reason=reason).inc()


def start_metrics_exporter(metrics: ServiceMetrics, host: str, port: int) -> MetricsExporter:
    """Serve `metrics.registry` at `http://host:port/metrics` from a daemon thread."""
    return serve_registry(metrics.registry, host, port)
