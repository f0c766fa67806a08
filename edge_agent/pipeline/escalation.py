"""`EscalationStage`: hard frames from the frame loop to the cloud, without ever waiting for it.

Each camera's pipeline calls `decide` on its analysed frames: the policy scores a frame and
spends the budget (fast, pure: `EscalationPolicy` on the stage's clock). The frame loop
`submit`s a frame to send to a small queue; an encoder thread makes the JPEG and hands the
request to the `EscalationClient`, whose own thread talks gRPC. The loop collects the answers
with `poll` and passes them to fusion. With the cloud unreachable nothing is decided or encoded
at all, and the agent goes on alone (the client reconnects in the background).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from edge_agent.capture import CapturedFrame
from edge_agent.config.escalation import EscalationConfig
from edge_agent.escalation import (
    EscalationClient,
    EscalationDecision,
    EscalationPolicy,
    EscalationResult,
    FrameSignals,
    SignalSettings,
    payload_bytes,
    payload_pixels,
    request_for_decision,
)
from edge_agent.escalation.deadline import DeadlineWatch
from edge_agent.escalation.encode import BgrImage, encode_jpeg
from edge_agent.escalation.uplink import CameraUplinks, EncodedPacket
from edge_agent.labels import LabelStore
from edge_agent.metrics import EdgeMetrics
from protos.analytics.v1 import analytics_pb2 as pb

logger = logging.getLogger(__name__)


@dataclass
class EscalationCounters:
    """What the stage did, for the status line, the demo summary and benchmarks."""

    considered: int = 0
    hard: int = 0
    sent: int = 0
    refused_budget: int = 0
    dropped_busy: int = 0  # encoder queue or client window full
    offline: int = 0  # frames seen while the cloud was unreachable
    answered: int = 0
    failed: int = 0
    bytes_sent: int = 0
    # hard frames per signal that made them hard ("refresh": the periodic whole frame), and of
    # those the ones sent; a frame counts under each of its reasons
    hard_reasons: Counter[str] = field(default_factory=Counter)
    sent_reasons: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class _Job:
    camera: str
    frame: CapturedFrame
    decision: EscalationDecision


class EscalationStage:
    """Policy in the frame loop; JPEG encoding and gRPC off it (see the module docstring)."""

    def __init__(
        self,
        config: EscalationConfig,
        agent_id: str,
        client: EscalationClient,
        *,
        metrics: EdgeMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        labels: LabelStore | None = None,
    ) -> None:
        self.config = config
        self.labels = labels
        self.agent_id = agent_id
        self.client = client
        self.metrics = metrics
        self.policy = EscalationPolicy.from_config(config, clock)
        self.deadlines = DeadlineWatch(config.deadline_ms)  # answers expiring: say so
        self.counters = EscalationCounters()
        self._clock = clock
        self.uplinks = CameraUplinks(
            config.uplink,
            camera_budget_bytes_per_s=config.per_camera_bytes_per_s,
            on_frame=metrics.observe_uplink if metrics is not None else None,
        )
        self._lock = threading.Lock()  # policy, budget and counters: loop and encoder share them
        self._jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=config.max_in_flight)
        self._encoder: threading.Thread | None = None

    def start(self) -> None:
        """Start the client (connects in the background) and the encoder thread."""
        if self.metrics is not None:
            self.metrics.escalation_enabled.set(1)
        self.client.start()
        if self.labels is not None:
            self.labels.start()
        self._encoder = threading.Thread(target=self._encode_loop, name="escalation-encoder")
        self._encoder.daemon = True
        self._encoder.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop encoding and close the client (frames in flight are reported failed)."""
        if self._encoder is not None:
            self._jobs.put(None)
            self._encoder.join(timeout_s)
        self.client.close(timeout_s=timeout_s)
        if self.labels is not None:
            self.labels.close(timeout_s=timeout_s)

    @property
    def signal_settings(self) -> SignalSettings:
        """What the frame signals are computed with (the policy's)."""
        return self.policy.signal_settings

    @property
    def connected(self) -> bool:
        """Whether the cloud stream is up."""
        return self.client.connected

    def decide(self, signals: FrameSignals, camera: str) -> EscalationDecision | None:
        """Decide on one analysed frame (the `Escalator` of the camera pipelines); None while
        the cloud is unreachable. The frame loop then `submit`s the frames to send."""
        with self._lock:
            self.counters.considered += 1
            if not self.client.connected:
                self.counters.offline += 1
                return None
            self.policy.budget.follow_stream(self.client.stream_id)  # slow start on a new one
            # frames waiting for the encoder are in flight too: the window is on what the
            # agent has asked the cloud and not heard back on
            decision = self.policy.decide(
                signals, camera, in_flight=self.client.in_flight + self._jobs.qsize()
            )
            if decision.reasons:
                self.counters.hard += 1
                self.counters.hard_reasons.update(decision.reasons)
                if decision.send:
                    self.counters.sent_reasons.update(decision.reasons)
            if decision.refused_by_budget:
                self.counters.refused_budget += 1
        if decision.refused_by_budget:
            self._observe(camera, "dropped_budget")
        if decision.reasons and self.metrics is not None:
            self.metrics.observe_escalation_reasons(camera, decision.reasons, sent=decision.send)
        return decision

    def submit(self, camera: str, frame: CapturedFrame, decision: EscalationDecision) -> bool:
        """Queue a frame decided to be sent for encoding and sending; False when the encoder is
        busy (the frame is then counted as dropped, and its answer never comes)."""
        try:
            self._jobs.put_nowait(_Job(camera, frame, decision))
        except queue.Full:
            with self._lock:
                self.counters.dropped_busy += 1
            self._observe(camera, "failed")
            return False
        return True

    def poll(self) -> list[EscalationResult]:
        """Answers (and failures) that came back since the last call; feeds the back-off."""
        results = self.client.poll_results()
        with self._lock:
            for result in results:
                self.policy.observe_answer(
                    rtt_s=result.rtt_s,
                    queue_time_ms=result.queue_time_ms,
                    overloaded=result.overloaded,
                    answered=result.ok,
                )
                if result.ok:
                    self.counters.answered += 1
                else:
                    self.counters.failed += 1
        with self._lock:
            for result in results:
                self.uplinks.answered(
                    result.request_id,
                    answered=result.result is not None,
                    keyframe_required=result.result is not None and result.result.keyframe_required,
                )
        self._watch_deadlines(results)
        for result in results:
            if self.labels is not None:
                self.labels.answered(result)
            self._observe(result.camera_id, "answered" if result.ok else "failed")
            if result.ok and result.rtt_s is not None and self.metrics is not None:
                self.metrics.escalation_round_trip.observe(result.rtt_s)
        if self.metrics is not None:
            self.metrics.cloud_connected.set(1 if self.client.connected else 0)
        return results

    def _watch_deadlines(self, results: list[EscalationResult]) -> None:
        """Feed the deadline watch; log once (with what to change) when most frames expire."""
        now = self._clock()
        began = False
        with self._lock:
            for result in results:
                expired = result.code is grpc.StatusCode.DEADLINE_EXCEEDED
                if expired or result.ok:
                    began |= self.deadlines.observe(now, expired=expired, rtt_s=result.rtt_s)
            mismatch = self.deadlines.verdict(now).mismatch
            advice = self.deadlines.advice(now) if began else ""
        if began:
            logger.warning("escalation deadline mismatch: %s", advice)
        if self.metrics is not None:
            self.metrics.escalation_deadline_mismatch.set(1 if mismatch else 0)

    def deadline_status(self) -> dict[str, object]:
        """The deadline watch's verdict, for the status topic: `mismatch` true when most
        escalated frames expire before the cloud answers (with a `suggested_deadline_ms`)."""
        with self._lock:
            verdict = self.deadlines.verdict(self._clock())
        share = verdict.expired_share
        return {
            "deadline_ms": self.deadlines.deadline_ms,
            "mismatch": verdict.mismatch,
            "expired_share": None if share is None else round(share, 3),
            "suggested_deadline_ms": verdict.suggested_deadline_ms,
        }

    def _encode_loop(self) -> None:
        _yield_to_the_frame_loop()
        while (job := self._jobs.get()) is not None:
            try:
                self._send(job)
            except Exception:  # an encoding failure loses one escalation, never the loop
                logger.exception("camera %s: cannot escalate frame %d", job.camera, job.frame.index)
                with self._lock:
                    self.counters.failed += 1

    def _send(self, job: _Job) -> None:
        frame = job.frame
        if not self.client.has_room():  # encode only what can go: a lost packet costs a keyframe
            with self._lock:
                self.counters.dropped_busy += 1
            self._observe(job.camera, "failed")
            return
        video = self._video_packet(job)
        request = request_for_decision(
            frame.image,
            job.decision,
            agent_id=self.agent_id,
            camera_id=job.camera,
            frame_id=frame.index,
            capture_time_s=frame.capture_time_s,
            jpeg_quality=self.config.jpeg_quality,
            region_jpeg_quality=self.config.regions.jpeg_quality,
            deadline_s=time.time() + self.config.deadline_ms / 1000.0,
            video=video,
        )
        if self.labels is not None:
            self.labels.sent(self._as_label(request, frame.image))
        sent = self.client.submit(request)
        if not sent and self.labels is not None:
            self.labels.forget(request.request_id)
        n_bytes = payload_bytes(request)
        with self._lock:
            if video is not None and sent:
                self.uplinks.sent(request.request_id, job.camera, video)
            elif video is not None:
                self.uplinks.unsent(job.camera, video)
            if sent:
                self.counters.sent += 1
                self.counters.bytes_sent += n_bytes
            else:
                self.counters.dropped_busy += 1
            self.policy.record_encoded(job.camera, job.decision, n_bytes, payload_pixels(request))
        self._observe(job.camera, "sent" if sent else "failed")
        if sent and self.metrics is not None:
            self.metrics.observe_escalation_bytes(job.camera, job.decision.mode, n_bytes)

    def _video_packet(self, job: _Job) -> EncodedPacket | None:
        """The whole frame as its camera's next video packet; None: JPEG (crops, the jpeg
        uplink, a replica without the codec, an encoder failure)."""
        if job.decision.mode != "frame" or not self.uplinks.enabled:
            return None
        # encoding runs outside the lock (milliseconds); only this thread touches the encoders
        return self.uplinks.encode(
            job.camera,
            job.frame.image,
            self._clock(),
            stream_id=self.client.stream_id,
            codecs=self.client.uplink_codecs,
        )

    def _as_label(self, request: pb.FrameRequest, image: BgrImage) -> pb.FrameRequest:
        """What the label store keeps of a request: a video packet is no picture on its own, so
        a whole frame sent as video is kept as a JPEG of the frame (only where labels are kept)."""
        if not request.HasField("video") or self.labels is None:
            return request
        if not self.labels.wants(request.camera_id):
            return request
        kept = pb.FrameRequest()
        kept.CopyFrom(request)
        kept.ClearField("video")
        kept.jpeg = encode_jpeg(image, self.config.jpeg_quality)
        kept.jpeg_quality = self.config.jpeg_quality
        return kept

    def _observe(self, camera: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.observe_escalation(camera, outcome)


ENCODER_NICENESS_STEP = 10
"""How much nicer than the frame loop the escalation encoder thread runs (Linux niceness is per
thread). Measured with `bench.edge.edge_pipeline --escalation --pin` (edge on one core)."""


def _yield_to_the_frame_loop() -> None:
    """Lower the calling thread's scheduling priority, so that on a small edge CPU the frame
    loop preempts JPEG encoding instead of waiting for it; best effort (no-op where the OS has
    no per-thread niceness)."""
    try:
        thread = threading.get_native_id()
        niceness = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(19, niceness + ENCODER_NICENESS_STEP))
    except (AttributeError, OSError) as exc:
        logger.debug("escalation encoder keeps the loop's priority: %s", exc)
