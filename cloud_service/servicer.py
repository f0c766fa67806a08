"""Thin gRPC servicer: hands frames to an injected `FrameProcessor`, one result per frame."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Protocol

import grpc

from cloud_service.processor import error_result
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceServicer

logger = logging.getLogger(__name__)

_QUEUE_POLL_S = 0.2


class FrameProcessor(Protocol):
    """Processes a batch of requests: exactly one result per request, in the same order.

    Per-frame failures go into `FrameResult.status`; an exception means the whole call failed.
    """

    def process(self, requests: Sequence[pb.FrameRequest]) -> list[pb.FrameResult]:
        """One `FrameResult` per request."""
        ...


class InferenceServicer(InferenceServiceServicer):
    """`analytics.v1.InferenceService` on top of a `FrameProcessor`.

    The stream reads requests in a background thread into a bounded backlog (a full backlog stops
    reading, so HTTP/2 flow control slows the sender) and hands whatever is waiting, up to
    `max_stream_batch_frames`, to the processor in one call. Results may come back in any order;
    every frame gets exactly one.
    """

    def __init__(
        self,
        processor: FrameProcessor,
        *,
        max_stream_batch_frames: int = 32,
        max_stream_backlog_frames: int = 64,
    ) -> None:
        if max_stream_batch_frames < 1:
            raise ValueError(f"max_stream_batch_frames must be >= 1, got {max_stream_batch_frames}")
        if max_stream_backlog_frames < 1:
            raise ValueError(
                f"max_stream_backlog_frames must be >= 1, got {max_stream_backlog_frames}"
            )
        self._processor = processor
        self._max_batch = max_stream_batch_frames
        self._max_backlog = max_stream_backlog_frames

    def DetectFrame(  # noqa: N802 - gRPC method name
        self, request: pb.FrameRequest, context: grpc.ServicerContext
    ) -> pb.FrameResult:
        """Process one frame."""
        return self._process([request])[0]

    def StreamFrames(  # noqa: N802 - gRPC method name
        self, request_iterator: Iterator[pb.FrameRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.FrameResult]:
        """Process the frames of one edge agent's stream as they arrive."""
        backlog: queue.Queue[pb.FrameRequest | None] = queue.Queue(maxsize=self._max_backlog)
        stop = threading.Event()
        reader = threading.Thread(
            target=_read_requests,
            args=(request_iterator, backlog, stop),
            name=f"frames-reader-{context.peer()}",
            daemon=True,
        )
        reader.start()
        try:
            ended = False
            while not ended:
                first = backlog.get()
                if first is None:
                    break
                batch = [first]
                while len(batch) < self._max_batch:
                    try:
                        item = backlog.get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        ended = True
                        break
                    batch.append(item)
                yield from self._process(batch)
        finally:
            stop.set()

    def _process(self, batch: Sequence[pb.FrameRequest]) -> list[pb.FrameResult]:
        """Call the processor; turn its failure into one INTERNAL result per frame."""
        try:
            results = self._processor.process(batch)
        except Exception:
            logger.exception("frame processor failed on %s frames", len(batch))
            return [error_result(r, grpc.StatusCode.INTERNAL, "processing failed") for r in batch]
        if len(results) != len(batch):
            logger.error(
                "frame processor returned %s results for %s frames", len(results), len(batch)
            )
            return [error_result(r, grpc.StatusCode.INTERNAL, "processing failed") for r in batch]
        return results


def _put(
    backlog: queue.Queue[pb.FrameRequest | None],
    item: pb.FrameRequest | None,
    stop: threading.Event,
) -> bool:
    """Put unless the stream handler has finished; False when it has."""
    while not stop.is_set():
        try:
            backlog.put(item, timeout=_QUEUE_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _read_requests(
    requests: Iterator[pb.FrameRequest],
    backlog: queue.Queue[pb.FrameRequest | None],
    stop: threading.Event,
) -> None:
    """Move requests into the backlog; `None` marks the end (client half-close or cancel)."""
    try:
        for request in requests:
            if not _put(backlog, request, stop):
                return
    except Exception as exc:  # the iterator raises when the RPC is cancelled
        logger.debug("frame stream ended: %r", exc)
    _put(backlog, None, stop)
