"""Prometheus metrics of the edge agent, in a registry owned by the agent (not the global one).

Names (all prefixed `edge_agent_`):
- `frames_total{camera}` (counter): frames analysed (detected, tracked, rules run).
- `frames_dropped_total{camera}` (counter): frames the capture replaced before the pipeline took
  them (the newest-frame slot's drop count).
- `motion_skipped_frames_total{camera}` (counter): frames not analysed because nothing moved.
- `camera_fps{camera}` (gauge): frames analysed per second, as the pipeline measures it.
- `camera_target_fps{camera}` (gauge): the camera's configured `target_fps`, so that alerts can
  compare the frames the pipeline takes with what it should take.
- `camera_state{camera, state}` (gauge): 1 for the camera's current capture state, 0 for the
  others (`connecting`, `streaming`, `stalled`, `reconnecting`, `stopped`).
- `reconnects_total{camera}` (counter): stream reconnects.
- `detect_latency_seconds{runtime}` (histogram): detector run per batch.
- `model_info{model, version, runtime}` (gauge): 1 for the detector model in use.
- `model_swaps_total{outcome}` (counter): model swaps on reload (`applied`, `refused`,
  `rolled_back`).
- `detect_batch_size` (histogram): frames per detector batch.
- `track_latency_seconds{camera}`, `rules_latency_seconds{camera}` (histograms): per frame.
- `end_to_end_latency_seconds{camera}` (histogram): capture to results ready, per frame.
- `alert_latency_seconds` (histogram): capture to event queued in the outbox, per event.
- `embedded_boxes_total{camera}` (counter): boxes that went through the appearance embedder.
- `events_total{camera, rule, kind, phase}` (counter): rule events.
- `outbox_depth` (gauge): alert messages waiting for the broker's acknowledgement.
- `outbox_dropped_total` (counter): alert messages dropped by the outbox bounds.
- `mqtt_connected`, `cloud_connected` (gauges): 1 while the connection is up.
- `escalation_enabled` (gauge): 1 when escalation to the cloud is configured; without it
  `cloud_connected` is 0 by design, not because the cloud is unreachable.
- `escalation_deadline_mismatch` (gauge): 1 while most escalated frames expire before the cloud
  answers them (the log says what to change, the status topic's `cloud_answers` too).
- `escalations_total{camera, outcome}` (counter): frames escalated to the cloud, by outcome
  (`sent`, `answered`, `failed`, `dropped_budget`, `late`).
- `escalation_reasons_total{camera, reason, outcome}` (counter): hard frames by each signal
  that made them hard (a frame counts under every one of its reasons; `refresh` is the periodic
  whole frame), `sent` or refused by the budget (`dropped_budget`): why a camera escalates.
- `escalation_bytes_total{camera, mode}` (counter): image bytes sent to the cloud, as whole
  frames (`frame`) or crops (`regions`): the uplink, and how often a short byte budget sent
  crops instead of whole frames.
- `uplink_frames_total{camera, kind}` (counter): whole frames sent, by how they were encoded:
  video `keyframe` or `inter` (the video uplink), or JPEG because the replica did not announce
  the codec (`jpeg_not_announced`) or the encoder failed (`jpeg_encoder_failed`).
- `escalation_round_trip_seconds` (histogram): escalation request to answer.
- `fusion_changes_total{camera, change}` (counter): what fused cloud answers did to the tracks
  (`reclassified`, `removed`, `rejected`, `created`) and answers dropped as too `late`.
- `cloud_agreement{camera}` (gauge): share of the tracks the edge is sure of that the cloud
  returned a box for (fusion trusts the cloud's corrections only above `min_agreement`).
- `fleet_model_info{name, version, sha}` (gauge): 1 for the model the fleet updater runs
  (`edge_agent.fleet`; the config's own model while no fleet model was kept).
- `fleet_updates_total{outcome}` (counter): the updater's decisions (`FLEET_UPDATE_OUTCOMES`).
- `fleet_rollbacks_total{reason}` (counter): fleet models swapped back out (`evidence`: worse
  on the live signals; `halted`: the rollout stopped; `failed`: the detector failed).

Counters that the capture and the outbox keep themselves (drops, reconnects, outbox drops) are
fed with their running totals through `set_*_total`, which adds the increase since the last call.
"""

from __future__ import annotations

import threading
from typing import Final

from prometheus_client import CollectorRegistry, Counter

from configkit.common import MetricsConfig
from configkit.metrics import BATCH_BUCKETS, MetricDeclarer, MetricsExporter, serve_registry
from edge_agent.escalation.policy import BOX_SIGNALS, FRAME_SIGNALS

__all__ = [
    "CAMERA_STATES",
    "ESCALATION_MODES",
    "ESCALATION_OUTCOMES",
    "ESCALATION_REASONS",
    "FLEET_ROLLBACK_REASONS",
    "FLEET_UPDATE_OUTCOMES",
    "FUSION_CHANGES",
    "UPLINK_KINDS",
    "EdgeMetrics",
    "MetricsExporter",
    "start_edge_metrics_exporter",
]

_PREFIX: Final = "edge_agent_"

CAMERA_STATES: Final = ("connecting", "streaming", "stalled", "reconnecting", "stopped")
"""Values of the `state` label of `camera_state` (those of `capture.CaptureState`)."""

ESCALATION_OUTCOMES: Final = ("sent", "answered", "failed", "dropped_budget", "late")
"""Values of the `outcome` label of `escalations_total`."""

ESCALATION_REASONS: Final = (*BOX_SIGNALS, *FRAME_SIGNALS)
"""Values of the `reason` label of `escalation_reasons_total`: the policy's signals."""

ESCALATION_MODES: Final = ("frame", "regions")
"""Values of the `mode` label of `escalation_bytes_total` (those of `escalation.policy.Mode`)."""

UPLINK_KINDS: Final = ("keyframe", "inter", "jpeg_not_announced", "jpeg_encoder_failed")
"""Values of the `kind` label of `uplink_frames_total` (those of `escalation.uplink.UplinkKind`)."""

FUSION_CHANGES: Final = ("reclassified", "removed", "rejected", "created", "late")
"""Values of the `change` label of `fusion_changes_total`."""

FLEET_UPDATE_OUTCOMES: Final = ("downloaded", "refused", "swapped", "promoted", "failed")
"""Values of the `outcome` label of `fleet_updates_total`."""

FLEET_ROLLBACK_REASONS: Final = ("evidence", "halted", "failed")
"""Values of the `reason` label of `fleet_rollbacks_total`."""


class _RunningTotals:
    """Turns running totals kept elsewhere into counter increments.

    A total below the last one seen means its keeper restarted from zero: the whole new total is
    the increase.
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()

    def increase(self, key: tuple[str, ...], total: int) -> int:
        if total < 0:
            raise ValueError(f"a running total cannot be negative, got {total}")
        with self._lock:
            last = self._last.get(key, 0)
            self._last[key] = total
        return total - last if total >= last else total


class EdgeMetrics:
    """The agent's metrics, registered in `registry` (a fresh one unless given)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        declare = MetricDeclarer(_PREFIX, self.registry)
        self._totals = _RunningTotals()
        self._states: dict[str, str] = {}
        self._states_lock = threading.Lock()

        # -- cameras --------------------------------------------------------------------------
        self.frames = declare.counter("frames", "Frames analysed.", "camera")
        self.frames_dropped = declare.counter(
            "frames_dropped", "Frames the capture replaced before the pipeline took them.", "camera"
        )
        self.motion_skipped_frames = declare.counter(
            "motion_skipped_frames", "Frames not analysed because nothing moved.", "camera"
        )
        self.camera_fps = declare.gauge("camera_fps", "Frames analysed per second.", "camera")
        self.camera_target_fps = declare.gauge(
            "camera_target_fps",
            "Frames per second the camera is configured to analyse (target_fps).",
            "camera",
        )
        self.camera_state = declare.gauge(
            "camera_state",
            "1 for the camera's current capture state, 0 for the others.",
            "camera",
            "state",
        )
        self.reconnects = declare.counter("reconnects", "Stream reconnects.", "camera")

        # -- pipeline stages --------------------------------------------------------------------
        self.detect_latency = declare.histogram(
            "detect_latency_seconds", "Detector run per batch.", "runtime"
        )
        self.model_info = declare.gauge(
            "model_info", "1 for the detector model in use.", "model", "version", "runtime"
        )
        self.model_swaps = declare.counter(
            "model_swaps", "Model swaps on reload, by outcome.", "outcome"
        )
        self.detect_batch_size = declare.histogram(
            "detect_batch_size", "Frames per detector batch.", buckets=BATCH_BUCKETS
        )
        self.track_latency = declare.histogram(
            "track_latency_seconds", "Tracker update (embedding included) per frame.", "camera"
        )
        self.rules_latency = declare.histogram(
            "rules_latency_seconds", "Rules evaluation per frame.", "camera"
        )
        self.end_to_end_latency = declare.histogram(
            "end_to_end_latency_seconds", "Capture to results ready, per frame.", "camera"
        )
        self.embedded_boxes = declare.counter(
            "embedded_boxes", "Boxes that went through the appearance embedder.", "camera"
        )

        # -- alerts -----------------------------------------------------------------------------
        self.events = declare.counter("events", "Rule events.", "camera", "rule", "kind", "phase")
        self.alert_latency = declare.histogram(
            "alert_latency_seconds", "Capture to event queued in the outbox, per event."
        )
        self.outbox_depth = declare.gauge(
            "outbox_depth", "Alert messages waiting for the broker's acknowledgement."
        )
        self.outbox_dropped = declare.counter(
            "outbox_dropped", "Alert messages dropped by the outbox bounds."
        )
        self.mqtt_connected = declare.gauge(
            "mqtt_connected", "1 while connected to the MQTT broker."
        )
        self.media_files = declare.counter(
            "media_files", "Event snapshots, crops and clips written (media store)."
        )
        self.media_bytes = declare.counter("media_bytes", "Bytes of event media written.")
        self.media_lost = declare.counter(
            "media_lost",
            "Event media not written: `dropped` (queue full), `failed` (raised), `clip_frame` "
            "(frames missing from clips).",
            "reason",
        )
        self.media_deleted = declare.counter("media_deleted", "Media files removed by retention.")
        self.webhook_events = declare.counter(
            "webhook_events",
            "Events the webhook sink finished with, by outcome (`sent`, `failed`, `dropped`).",
            "outcome",
        )
        self.webhook_queue = declare.gauge("webhook_queue", "Events waiting for the webhook.")

        # -- escalation ---------------------------------------------------------------------------
        self.escalations = declare.counter(
            "escalations", "Frames escalated to the cloud, by outcome.", "camera", "outcome"
        )
        self.escalation_reasons = declare.counter(
            "escalation_reasons",
            "Hard frames by each signal that made them hard, sent or refused by the budget.",
            "camera",
            "reason",
            "outcome",
        )
        self.escalation_bytes = declare.counter(
            "escalation_bytes",
            "Image bytes sent to the cloud, by mode (whole frame or crops).",
            "camera",
            "mode",
        )
        self.uplink_frames = declare.counter(
            "uplink_frames",
            "Whole frames sent to the cloud, by encoding (video keyframe or inter, or JPEG).",
            "camera",
            "kind",
        )
        self.escalation_round_trip = declare.histogram(
            "escalation_round_trip_seconds", "Escalation request to answer."
        )
        self.fusion_changes = declare.counter(
            "fusion_changes", "What fused cloud answers did to the tracks.", "camera", "change"
        )
        self.cloud_agreement = declare.gauge(
            "cloud_agreement",
            "Share of the tracks the edge is sure of that the cloud returned a box for.",
            "camera",
        )
        self.cloud_connected = declare.gauge(
            "cloud_connected", "1 while the cloud service is reachable."
        )
        self.escalation_enabled = declare.gauge(
            "escalation_enabled",
            "1 when escalation to the cloud is configured (cloud_connected means something).",
        )
        self.escalation_deadline_mismatch = declare.gauge(
            "escalation_deadline_mismatch",
            "1 while most escalated frames expire before the cloud answers them "
            "(escalation.deadline_ms shorter than the cloud's queue plus inference).",
        )

        # -- fleet updates ----------------------------------------------------------------------
        self.fleet_model_info = declare.gauge(
            "fleet_model_info",
            "1 for the model the fleet updater runs (artifact sha256 in `sha`).",
            "name",
            "version",
            "sha",
        )
        self.fleet_updates = declare.counter(
            "fleet_updates", "Fleet model update decisions, by outcome.", "outcome"
        )
        self.fleet_rollbacks = declare.counter(
            "fleet_rollbacks", "Fleet models swapped back out, by reason.", "reason"
        )
        # every label value exported from the start (0 where the fleet is off), so dashboards
        # and alerts see a series rather than no data
        for outcome in FLEET_UPDATE_OUTCOMES:
            self.fleet_updates.labels(outcome=outcome)
        for reason in FLEET_ROLLBACK_REASONS:
            self.fleet_rollbacks.labels(reason=reason)

    def set_fleet_model(self, name: str, version: str, sha256: str) -> None:
        """Mark the model the fleet updater runs now (the only series of `fleet_model_info`)."""
        self.fleet_model_info.clear()
        self.fleet_model_info.labels(name=name, version=version, sha=sha256).set(1)

    def observe_fleet_update(self, outcome: str) -> None:
        """Count one update decision (`outcome` one of `FLEET_UPDATE_OUTCOMES`)."""
        if outcome not in FLEET_UPDATE_OUTCOMES:
            raise ValueError(
                f"unknown fleet update outcome {outcome!r}; expected one of {FLEET_UPDATE_OUTCOMES}"
            )
        self.fleet_updates.labels(outcome=outcome).inc()

    def observe_fleet_rollback(self, reason: str) -> None:
        """Count one roll-back (`reason` one of `FLEET_ROLLBACK_REASONS`)."""
        if reason not in FLEET_ROLLBACK_REASONS:
            raise ValueError(
                f"unknown fleet rollback reason {reason!r}; expected one of "
                f"{FLEET_ROLLBACK_REASONS}"
            )
        self.fleet_rollbacks.labels(reason=reason).inc()

    def set_camera_state(self, camera: str, state: str) -> None:
        """Mark `state` (one of `CAMERA_STATES`) as the camera's current one."""
        if state not in CAMERA_STATES:
            raise ValueError(f"unknown camera state {state!r}; expected one of {CAMERA_STATES}")
        with self._states_lock:
            self._states[camera] = state
            for name in CAMERA_STATES:
                self.camera_state.labels(camera=camera, state=name).set(1 if name == state else 0)

    def camera_state_of(self, camera: str) -> str | None:
        """The state last set for `camera`, or None."""
        with self._states_lock:
            return self._states.get(camera)

    def set_frames_dropped_total(self, camera: str, total: int) -> None:
        """Feed the capture slot's running drop count of `camera`."""
        self.frames_dropped.labels(camera=camera).inc(
            self._totals.increase(("drops", camera), total)
        )

    def set_reconnects_total(self, camera: str, total: int) -> None:
        """Feed the capture source's running reconnect count of `camera`."""
        self.reconnects.labels(camera=camera).inc(
            self._totals.increase(("reconnects", camera), total)
        )

    def set_camera_total(self, counter: Counter, camera: str, total: int) -> None:
        """Feed a running per-camera total kept elsewhere into `counter` (labelled `camera`)."""
        key = (counter._name, camera)  # noqa: SLF001 - the name is public in the exposition
        counter.labels(camera=camera).inc(self._totals.increase(key, total))

    def set_fusion_total(self, camera: str, change: str, total: int) -> None:
        """Feed a camera's running count of one fusion `change` (one of `FUSION_CHANGES`)."""
        if change not in FUSION_CHANGES:
            raise ValueError(f"unknown fusion change {change!r}; expected one of {FUSION_CHANGES}")
        self.fusion_changes.labels(camera=camera, change=change).inc(
            self._totals.increase(("fusion", camera, change), total)
        )

    def set_total(self, counter: Counter, total: int, **labels: str) -> None:
        """Feed a running total kept elsewhere (a store's or a sink's stats) into `counter`."""
        named = [f"{name}={value}" for name, value in sorted(labels.items())]
        key = (counter._name, *named)  # noqa: SLF001 - the name is public in the exposition
        increase = self._totals.increase(key, total)
        (counter.labels(**labels) if labels else counter).inc(increase)

    def set_outbox_dropped_total(self, total: int) -> None:
        """Feed the outbox's running count of dropped messages (kept across restarts)."""
        self.outbox_dropped.inc(self._totals.increase(("outbox",), total))

    def observe_event(self, camera: str, rule: str, kind: str, phase: str) -> None:
        """Count one rule event."""
        self.events.labels(camera=camera, rule=rule, kind=kind, phase=phase).inc()

    def observe_escalation(self, camera: str, outcome: str) -> None:
        """Count one escalation outcome (one of `ESCALATION_OUTCOMES`)."""
        if outcome not in ESCALATION_OUTCOMES:
            raise ValueError(
                f"unknown escalation outcome {outcome!r}; expected one of {ESCALATION_OUTCOMES}"
            )
        self.escalations.labels(camera=camera, outcome=outcome).inc()

    def observe_escalation_reasons(
        self, camera: str, reasons: tuple[str, ...], *, sent: bool
    ) -> None:
        """Count one hard frame under each of its `reasons` (of `ESCALATION_REASONS`)."""
        unknown = [r for r in reasons if r not in ESCALATION_REASONS]
        if unknown:
            raise ValueError(
                f"unknown escalation reason {unknown[0]!r}; expected one of {ESCALATION_REASONS}"
            )
        outcome = "sent" if sent else "dropped_budget"
        for reason in reasons:
            self.escalation_reasons.labels(camera=camera, reason=reason, outcome=outcome).inc()

    def observe_escalation_bytes(self, camera: str, mode: str, n_bytes: int) -> None:
        """Count the JPEG bytes of one sent escalation (`mode` one of `ESCALATION_MODES`)."""
        if mode not in ESCALATION_MODES:
            raise ValueError(
                f"unknown escalation mode {mode!r}; expected one of {ESCALATION_MODES}"
            )
        self.escalation_bytes.labels(camera=camera, mode=mode).inc(n_bytes)

    def observe_uplink(self, camera: str, kind: str) -> None:
        """Count one whole frame sent, by encoding (`kind` one of `UPLINK_KINDS`)."""
        if kind not in UPLINK_KINDS:
            raise ValueError(f"unknown uplink kind {kind!r}; expected one of {UPLINK_KINDS}")
        self.uplink_frames.labels(camera=camera, kind=kind).inc()


def start_edge_metrics_exporter(
    metrics: EdgeMetrics, config: MetricsConfig
) -> MetricsExporter | None:
    """Serve `metrics` as `config` says; None when metrics are disabled.

    `listen_port` 0 binds a free port (`exporter.port` tells which). Raises `OSError` when the
    address cannot be bound.
    """
    if not config.enabled:
        return None
    return serve_registry(metrics.registry, config.listen_host, config.listen_port)
