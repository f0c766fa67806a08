"""`DynamicBatcher`: one worker thread that batches frames from every stream for the processor.

Stream handlers `submit` frames with a callback; the callback is called exactly once per frame:
with the processor's result, or at once with RESOURCE_EXHAUSTED (queue full), DEADLINE_EXCEEDED
(late at admission or while queued), UNAVAILABLE (draining) or INTERNAL (processor failure).
Scheduling decisions live in the pure `BatchScheduler`; this module adds the lock, the thread, the
clocks, the replies and the metrics.

A video uplink packet that expires in the queue is still decoded (`KeepsReferences.skip`, before
the batch that follows it) and answered DEADLINE_EXCEEDED without `keyframe_required`: the next
packets of its session reference it, and one frame the server had no time for would otherwise
cost every packet the edge sent before it heard, and a keyframe. A packet refused at admission
(queue full, deadline already passed) is not decoded (packets of its stream may still be queued
before it) and asks for a keyframe.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import grpc

from cloud_service.batching.scheduler import (
    Admission,
    BatchScheduler,
    Queued,
    SchedulerLimits,
    StreamKey,
)
from cloud_service.config import BatchingConfig
from cloud_service.convert import status_code_from_proto
from cloud_service.identity import request_problem
from cloud_service.metrics import ServiceMetrics
from cloud_service.processor import error_result
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.timestamps import timestamp_to_seconds

logger = logging.getLogger(__name__)

ResultCallback = Callable[[pb.FrameResult], None]

_REJECTIONS: dict[Admission, tuple[grpc.StatusCode, str]] = {
    Admission.STREAM_QUEUE_FULL: (grpc.StatusCode.RESOURCE_EXHAUSTED, "stream queue full"),
    Admission.QUEUE_FULL: (grpc.StatusCode.RESOURCE_EXHAUSTED, "server queue full"),
    Admission.DEADLINE_EXCEEDED: (grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed"),
    Admission.DRAINING: (grpc.StatusCode.UNAVAILABLE, "server shutting down"),
}


class FrameProcessor(Protocol):
    """Processes a batch of requests: exactly one result per request, in the same order.

    Per-frame failures go into `FrameResult.status`; an exception means the whole call failed.
    """

    def process(self, requests: Sequence[pb.FrameRequest]) -> list[pb.FrameResult]:
        """One `FrameResult` per request."""
        ...


@runtime_checkable
class KeepsReferences(Protocol):
    """A processor that decodes the video uplink: frames that expire in the queue go through
    `skip` before their answer, so the session each belongs to is not broken by the one frame
    the server had no time for (its next packets reference it)."""

    def skip(self, requests: Sequence[pb.FrameRequest]) -> list[bool]:
        """Decode what later frames need; per request, whether its session needs a keyframe."""
        ...


@dataclass(frozen=True)
class _Ticket:
    """A submitted frame and where its one answer goes."""

    request: pb.FrameRequest
    on_result: ResultCallback


@dataclass(frozen=True)
class _Work:
    """What the worker got from one wait: a batch, late frames, abandoned frames, or the end."""

    batch: list[Queued[_Ticket]]
    expired: list[Queued[_Ticket]]
    abandoned: list[Queued[_Ticket]]
    finished: bool


def stream_key(request: pb.FrameRequest) -> StreamKey:
    """The fairness key of a frame: `(agent_id, camera_id)`."""
    return (request.agent_id, request.camera_id)


class DynamicBatcher:
    """Admission, fair dynamic batching and replies for frames from many streams.

    `clock` (monotonic seconds) drives queueing; `wall_clock` (POSIX seconds) converts the
    wall-clock `FrameRequest.deadline` into the monotonic one the scheduler uses. A frame without
    a deadline gets `default_deadline_ms`; `time_remaining_s` of the RPC caps every deadline.
    """

    def __init__(
        self,
        processor: FrameProcessor,
        config: BatchingConfig,
        *,
        metrics: ServiceMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._processor = processor
        self._metrics = metrics if metrics is not None else ServiceMetrics()
        self._clock = clock
        self._wall_clock = wall_clock
        self._default_deadline_s = config.default_deadline_ms / 1000.0
        self._scheduler: BatchScheduler[_Ticket] = BatchScheduler(
            SchedulerLimits.from_config(config), clock
        )
        self._cond = threading.Condition()
        self._drain_until_s: float | None = None
        self._worker = threading.Thread(target=self._run, name="dynamic-batcher", daemon=True)

    @property
    def depth(self) -> int:
        """Frames waiting for a batch."""
        with self._cond:
            return self._scheduler.depth

    def start(self) -> None:
        """Start the worker thread."""
        self._worker.start()

    def submit(
        self,
        request: pb.FrameRequest,
        on_result: ResultCallback,
        *,
        time_remaining_s: float | None = None,
    ) -> None:
        """Queue `request`; `on_result` gets its one result (at once when the frame is refused).

        The callback runs on the batcher's thread or the caller's: keep it short (e.g. a put).
        """
        ticket = _Ticket(request, on_result)
        problem = request_problem(request)
        if problem is not None:
            self._reject(
                ticket, "invalid_identity", grpc.StatusCode.INVALID_ARGUMENT, problem,
                admitted=False,
            )  # fmt: skip
            return
        with self._cond:
            deadline_s = self._deadline_s(request, time_remaining_s)
            decision = self._scheduler.admit(ticket, stream_key(request), deadline_s)
            depth = self._scheduler.depth
            if decision is Admission.ADMITTED and (
                depth == 1 or depth >= self._scheduler.limits.full_batch_size
            ):
                self._cond.notify()
        self._metrics.queue_depth.set(depth)
        if decision is Admission.ADMITTED:
            self._metrics.in_flight.inc()
            return
        code, message = _REJECTIONS[decision]
        self._reject(ticket, decision.value, code, message, depth, admitted=False)

    def begin_drain(self, grace_s: float) -> None:
        """Stop admitting (UNAVAILABLE); run queued frames for up to `grace_s`, then answer the
        rest UNAVAILABLE. Returns at once."""
        with self._cond:
            again = self._scheduler.draining  # e.g. `close` after the server's drain: no new line
            self._scheduler.start_draining()
            until = self._clock() + max(grace_s, 0.0)
            if self._drain_until_s is None or until < self._drain_until_s:
                self._drain_until_s = until
            self._cond.notify()
        if not again:
            logger.info("batcher draining %s queued frames for up to %.1f s", self.depth, grace_s)

    def stop(self, grace_s: float) -> None:
        """`begin_drain(grace_s)` and wait for the worker to finish (the batch running at the end
        of the grace period completes first)."""
        self.begin_drain(grace_s)
        if self._worker.ident is None:  # never started: nobody else will answer the queue
            with self._cond:
                abandoned = self._scheduler.take_all()
            for queued in abandoned:
                code = grpc.StatusCode.UNAVAILABLE
                self._drop(queued, "drain_timeout", code, "server shut down before it")
        elif self._worker.is_alive():
            self._worker.join()

    def _deadline_s(self, request: pb.FrameRequest, time_remaining_s: float | None) -> float:
        now = self._clock()
        remaining = [self._default_deadline_s]
        if request.HasField("deadline"):
            remaining = [timestamp_to_seconds(request.deadline) - self._wall_clock()]
        if time_remaining_s is not None:
            remaining.append(time_remaining_s)
        return now + min(remaining)

    def _run(self) -> None:
        while True:
            work = self._next_work()
            keyframes = self._skip([queued.item.request for queued in work.expired])
            for queued, keyframe in zip(work.expired, keyframes, strict=True):
                code = grpc.StatusCode.DEADLINE_EXCEEDED
                message = "deadline passed in queue, or would pass before its batch finished"
                self._drop(queued, "deadline_in_queue", code, message, keyframe_required=keyframe)
            for queued in work.abandoned:
                code = grpc.StatusCode.UNAVAILABLE
                self._drop(queued, "drain_timeout", code, "server shut down before it")
            if work.batch:
                self._run_batch(work.batch)
            if work.finished:
                logger.info("batcher stopped")
                return

    def _next_work(self) -> _Work:
        """Block until there is something to do."""
        with self._cond:
            while True:
                now = self._clock()
                if self._drain_until_s is not None and now >= self._drain_until_s:
                    return _Work([], [], self._scheduler.take_all(), finished=True)
                step = self._scheduler.next_step()
                if step.batch or step.expired:
                    return _Work(step.batch, step.expired, [], finished=False)
                if self._scheduler.draining and not self._scheduler.depth:
                    return _Work([], [], [], finished=True)
                wait_s = math.inf if step.wait_s is None else step.wait_s
                if self._drain_until_s is not None:
                    wait_s = min(wait_s, self._drain_until_s - now)
                self._cond.wait(None if math.isinf(wait_s) else wait_s)

    def _run_batch(self, batch: list[Queued[_Ticket]]) -> None:
        started_s = self._clock()
        requests = [queued.item.request for queued in batch]
        results = self._process(requests)
        finished_s = self._clock()
        with self._cond:
            self._scheduler.observe_batch(finished_s - started_s, len(batch))
        depth = self.depth
        self._metrics.batch_size.observe(len(batch))
        self._metrics.queue_depth.set(depth)
        # Both are per batch: every frame of the batch carries the same batch-wide figure.
        inference_ms = max((r.timings.inference_time_ms for r in results), default=0.0)
        if inference_ms > 0.0:
            self._metrics.inference_time.observe(inference_ms / 1000.0)
        decode_ms = max((r.timings.decode_time_ms for r in results), default=0.0)
        if decode_ms > 0.0:
            self._metrics.decode_time.observe(decode_ms / 1000.0)
        for queued, result in zip(batch, results, strict=True):
            queue_s = started_s - queued.arrival_s
            result.timings.queue_time_ms = queue_s * 1000.0
            result.timings.total_time_ms = (finished_s - queued.arrival_s) * 1000.0
            result.queue_depth = depth
            self._metrics.queue_time.observe(queue_s)
            self._deliver(queued.item, result, admitted=True)

    def _skip(self, requests: Sequence[pb.FrameRequest]) -> list[bool]:
        """Frames expired in the queue, before the batch that follows them (a stream's frames
        leave its queue in order, so their video packets decode in order): the processor's
        `skip` where it has one; per request, whether its video session needs a keyframe."""
        unkept = [request.HasField("video") for request in requests]
        if not any(unkept) or not isinstance(self._processor, KeepsReferences):
            return unkept
        try:
            keyframes = self._processor.skip(requests)
            if len(keyframes) != len(requests):
                raise RuntimeError(f"{len(keyframes)} answers for {len(requests)} frames")
        except Exception:
            logger.exception("frame processor failed to keep the references of expired frames")
            return unkept
        return [bool(k) and video for k, video in zip(keyframes, unkept, strict=True)]

    def _process(self, requests: Sequence[pb.FrameRequest]) -> list[pb.FrameResult]:
        """Call the processor; its failure becomes one INTERNAL result per frame."""
        try:
            results = self._processor.process(requests)
            if len(results) != len(requests):
                raise RuntimeError(f"{len(results)} results for {len(requests)} frames")
        except Exception:
            logger.exception(
                "frame processor failed on a batch of %s frames (request ids %s)",
                len(requests),
                [r.request_id for r in requests],
            )
            for _ in requests:
                self._metrics.observe_rejection("processing_failed")
            code = grpc.StatusCode.INTERNAL
            return [error_result(r, code, "processing failed") for r in requests]
        return results

    def _drop(
        self,
        queued: Queued[_Ticket],
        reason: str,
        code: grpc.StatusCode,
        message: str,
        *,
        keyframe_required: bool | None = None,
    ) -> None:
        """Answer a queued frame with an error, reporting how long it waited."""
        waited_ms = (self._clock() - queued.arrival_s) * 1000.0
        self._reject(
            queued.item, reason, code, message,
            waited_ms=waited_ms, keyframe_required=keyframe_required,
        )  # fmt: skip

    def _reject(
        self,
        ticket: _Ticket,
        reason: str,
        code: grpc.StatusCode,
        message: str,
        depth: int | None = None,
        *,
        admitted: bool = True,
        waited_ms: float = 0.0,
        keyframe_required: bool | None = None,
    ) -> None:
        """Answer `ticket` with an error. A video packet answered here was never decoded, so its
        session needs a keyframe, unless the caller says otherwise (`keyframe_required`: the
        processor decoded it all the same)."""
        request = ticket.request
        logger.debug(
            "frame %s/%s/%s (request id %s) answered %s: %s",
            request.agent_id,
            request.camera_id,
            request.frame_id,
            request.request_id,
            code.name,
            reason,
            extra={"request_id": request.request_id, "reason": reason},
        )
        self._metrics.observe_rejection(reason)
        result = error_result(request, code, message)
        if keyframe_required is None:
            keyframe_required = request.HasField("video")
        result.keyframe_required = keyframe_required
        result.queue_depth = self.depth if depth is None else depth
        result.timings.queue_time_ms = result.timings.total_time_ms = waited_ms
        self._deliver(ticket, result, admitted=admitted)

    def _deliver(self, ticket: _Ticket, result: pb.FrameResult, *, admitted: bool) -> None:
        if admitted:
            self._metrics.in_flight.dec()
        code = status_code_from_proto(result.status).name
        model = (result.model_name, result.model_version) if result.model_version else None
        self._metrics.observe_answer(result.agent_id, result.camera_id, code, model)
        try:
            ticket.on_result(result)
        except Exception:
            logger.exception("result callback failed for request id %s", ticket.request.request_id)
