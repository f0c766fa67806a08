"""Thin gRPC servicer: submits frames to the dynamic batcher and sends back one result per frame."""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import grpc

from cloud_service.batching.batcher import DynamicBatcher, ResultCallback
from cloud_service.batching.batcher import FrameProcessor as FrameProcessor
from cloud_service.config import BatchingConfig
from cloud_service.convert import status_to_proto
from cloud_service.decoders.video import UPLINK_CODECS_METADATA_KEY
from cloud_service.handlers import MalformedRequest
from cloud_service.metrics import ServiceMetrics
from configkit.log_limit import RateLimitedLog
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceServicer

logger = logging.getLogger(__name__)

_POLL_S = 0.2
# refusals and malformed frames are client-driven: one line per kind per interval, counted
_REPEAT_LOG_INTERVAL_S = 10.0
# grpc reports a huge time_remaining for calls without a deadline.
_NO_DEADLINE_S = 365 * 24 * 3600.0


@runtime_checkable
class FrameSubmitter(Protocol):
    """Takes frames and calls back exactly once per frame (`DynamicBatcher`)."""

    def submit(
        self,
        request: pb.FrameRequest,
        on_result: ResultCallback,
        *,
        time_remaining_s: float | None = None,
    ) -> None:
        """Queue `request`; `on_result` receives its one result."""
        ...


@dataclass(frozen=True)
class _StreamEnd:
    """Marks the end of the request side after `submitted` frames."""

    submitted: int


class InferenceServicer(InferenceServiceServicer):
    """`analytics.v1.InferenceService` on top of a `FrameSubmitter`.

    Every frame, unary or streamed, goes through the submitter (the shared batcher), so frames of
    all streams and cameras batch together. A stream reads requests in a background thread and
    yields results as soon as they are ready, in any order; at most `max_stream_inflight_frames`
    of its frames are unanswered at once (then it stops reading: HTTP/2 flow control). Given a
    bare `FrameProcessor` (tools, tests), the servicer wraps it in a default `DynamicBatcher`.
    `uplink_codecs` are announced in each stream's initial metadata (the video uplink).
    """

    def __init__(
        self,
        frames: FrameSubmitter | FrameProcessor,
        *,
        max_stream_inflight_frames: int = 256,
        max_streams: int | None = None,
        metrics: ServiceMetrics | None = None,
        uplink_codecs: Sequence[str] = (),
    ) -> None:
        if max_stream_inflight_frames < 1:
            raise ValueError(
                f"max_stream_inflight_frames must be >= 1, got {max_stream_inflight_frames}"
            )
        if isinstance(frames, FrameSubmitter):
            self._frames: FrameSubmitter = frames
        else:
            batcher = DynamicBatcher(frames, BatchingConfig())
            batcher.start()
            self._frames = batcher
        self._max_inflight = max_stream_inflight_frames
        self._max_streams = max_streams
        self._streams = 0
        self._streams_lock = threading.Lock()
        self._metrics = metrics
        self._uplink_metadata = (
            ((UPLINK_CODECS_METADATA_KEY, ",".join(uplink_codecs)),) if uplink_codecs else ()
        )
        if metrics is not None:
            metrics.frame_streams_limit.set(max_streams or 0)
        self._refusal_log = self._repeat_log("stream_refused")
        self._malformed_log = self._repeat_log("malformed_request")

    def _repeat_log(self, event: str) -> RateLimitedLog:
        metrics = self._metrics
        suppressed = (
            None if metrics is None else metrics.log_lines_suppressed.labels(event=event).inc
        )
        return RateLimitedLog(logger, interval_s=_REPEAT_LOG_INTERVAL_S, on_suppressed=suppressed)

    def DetectFrame(  # noqa: N802 - gRPC method name
        self, request: pb.FrameRequest | MalformedRequest, context: grpc.ServicerContext
    ) -> pb.FrameResult:
        """Process one frame through the batcher."""
        if isinstance(request, MalformedRequest):
            self._malformed_log.log("DetectFrame from %s: %s", context.peer(), request.message)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        done: Future[pb.FrameResult] = Future()
        self._frames.submit(request, done.set_result, time_remaining_s=_remaining_s(context))
        return done.result()

    def StreamFrames(  # noqa: N802 - gRPC method name
        self,
        request_iterator: Iterator[pb.FrameRequest | MalformedRequest],
        context: grpc.ServicerContext,
    ) -> Iterator[pb.FrameResult]:
        """Submit the frames of one edge agent's stream; yield each result when it is ready.

        Beyond `max_streams` open streams the call is refused RESOURCE_EXHAUSTED at once: every
        stream holds a server thread for its life, and the threads kept back must stay free for
        health checks (a replica that cannot answer them is dropped by its balancer, streams and
        all) and for unary calls.
        """
        peer = context.peer() or "an unknown peer"  # gRPC forgets it once a call is cancelled
        with self._streams_lock:
            full = self._max_streams is not None and self._streams >= self._max_streams
            if not full:
                self._streams += 1
            self._count_streams(refused=full)
        if full:
            self._refusal_log.log(
                "frame stream from %s refused: this replica serves its maximum of %s streams "
                "(all refusals: cloud_service_frame_streams_refused_total)",
                peer,
                self._max_streams,
            )
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this replica serves its maximum of {self._max_streams} frame streams "
                "(server.worker_threads - server.reserved_threads); try another replica",
            )
        if self._uplink_metadata:
            # at once, not with the first answer: the edge picks the frames' encoding from it
            context.send_initial_metadata(self._uplink_metadata)
        try:
            yield from self._stream(request_iterator, context, peer)
        finally:
            with self._streams_lock:
                self._streams -= 1
                self._count_streams(refused=False)

    def _count_streams(self, *, refused: bool) -> None:
        """Lock held: export the open streams (and a refusal)."""
        if self._metrics is None:
            return
        self._metrics.frame_streams.set(self._streams)
        if refused:
            self._metrics.frame_streams_refused.inc()

    def _stream(
        self,
        request_iterator: Iterator[pb.FrameRequest | MalformedRequest],
        context: grpc.ServicerContext,
        peer: str,
    ) -> Iterator[pb.FrameResult]:
        results: queue.Queue[pb.FrameResult | _StreamEnd] = queue.Queue()
        slots = threading.Semaphore(self._max_inflight)
        stop = threading.Event()
        reader = threading.Thread(
            target=self._read_requests,
            args=(request_iterator, context, results, slots, stop, peer),
            name=f"frames-reader-{peer}",
            daemon=True,
        )
        reader.start()
        logger.info("frame stream from %s opened", peer)
        answered, expected = 0, math.inf
        try:
            while answered < expected:
                try:
                    item = results.get(timeout=_POLL_S)
                except queue.Empty:
                    if not context.is_active():
                        return
                    continue
                if isinstance(item, _StreamEnd):
                    expected = item.submitted
                    continue
                answered += 1
                slots.release()
                yield item
        finally:
            stop.set()
            logger.info("frame stream from %s closed after %s results", peer, answered)

    def _read_requests(
        self,
        requests: Iterator[pb.FrameRequest | MalformedRequest],
        context: grpc.ServicerContext,
        results: queue.Queue[pb.FrameResult | _StreamEnd],
        slots: threading.Semaphore,
        stop: threading.Event,
        peer: str,
    ) -> None:
        """Submit requests while slots are free; end with `_StreamEnd` (half-close or cancel)."""
        submitted = 0
        try:
            for request in requests:
                while not slots.acquire(timeout=_POLL_S):
                    if stop.is_set():
                        return
                submitted += 1
                if isinstance(request, MalformedRequest):  # answered here; the stream goes on
                    self._malformed_log.log("frame stream from %s: %s", peer, request.message)
                    results.put(
                        pb.FrameResult(
                            status=status_to_proto(
                                grpc.StatusCode.INVALID_ARGUMENT, request.message
                            )
                        )
                    )
                    continue
                self._frames.submit(request, results.put, time_remaining_s=_remaining_s(context))
        except Exception as exc:  # the iterator raises when the RPC is cancelled
            logger.debug("frame stream ended: %r", exc)
        results.put(_StreamEnd(submitted))


def _remaining_s(context: grpc.ServicerContext) -> float | None:
    """Seconds left before the RPC's deadline; None when it has none."""
    try:
        remaining = context.time_remaining()
    except TypeError:  # some grpc versions fail on calls without a deadline
        return None
    if remaining is None or remaining > _NO_DEADLINE_S:
        return None
    return float(remaining)
