"""Admission control and dynamic batching across streams (pure scheduler + threaded batcher)."""

from cloud_service.batching.batcher import DynamicBatcher, FrameProcessor, ResultCallback
from cloud_service.batching.scheduler import Admission, BatchScheduler, SchedulerLimits, StreamKey

__all__ = [
    "Admission",
    "BatchScheduler",
    "DynamicBatcher",
    "FrameProcessor",
    "ResultCallback",
    "SchedulerLimits",
    "StreamKey",
]
