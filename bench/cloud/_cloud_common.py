"""What the cloud-service benches share: a frame stream that keeps a window of frames in flight."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub

RPC_TIMEOUT_S = 600.0

Answer = tuple[float, float, pb.FrameResult]  # (sent, received, result), perf_counter seconds


def windowed_stream(
    stub: InferenceServiceStub,
    jpegs: list[bytes],
    frames: int,
    window: int,
    sink: list[Answer],
    lock: threading.Lock,
    *,
    agent: str = "bench",
    camera: str = "cam",
    offset: int = 0,
) -> None:
    """One bidi stream of `frames` frames (`jpegs` in turn from `offset`), at most `window`
    unanswered; (sent, received, result) per frame into `sink` under `lock`."""
    slots = threading.Semaphore(window)
    sent: dict[int, float] = {}

    def requests() -> Iterator[pb.FrameRequest]:
        for frame in range(frames):
            slots.acquire()
            sent[frame] = time.perf_counter()
            yield pb.FrameRequest(
                agent_id=agent,
                camera_id=camera,
                frame_id=frame,
                request_id=f"{agent}/{camera}/{frame}",
                jpeg=jpegs[(offset + frame) % len(jpegs)],
            )

    for result in stub.StreamFrames(requests(), timeout=RPC_TIMEOUT_S):
        received = time.perf_counter()
        slots.release()
        with lock:
            sink.append((sent[result.frame_id], received, result))
