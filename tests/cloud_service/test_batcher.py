"""`DynamicBatcher` with real threads and fake processors (no gRPC): one reply per frame."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import grpc
import pytest

from cloud_service.batching import DynamicBatcher
from cloud_service.config import BatchingConfig
from cloud_service.convert import status_code_from_proto
from cloud_service.metrics import ServiceMetrics
from cloud_service.processor import empty_result
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.timestamps import timestamp_from_seconds

WAIT_S = 10.0
MakeBatcher = Callable[..., DynamicBatcher]


class GatedProcessor:
    """Echoes OK results; while `gate` is clear, blocks inside `process` (a slow engine)."""

    def __init__(self, *, open_gate: bool = True, fail: str = "") -> None:
        self.gate = threading.Event()
        if open_gate:
            self.gate.set()
        self.entered = threading.Event()
        self.fail = fail
        self.batches: list[list[str]] = []
        self._lock = threading.Lock()

    def process(self, requests: Sequence[pb.FrameRequest]) -> list[pb.FrameResult]:
        with self._lock:
            self.batches.append([r.request_id for r in requests])
        self.entered.set()
        assert self.gate.wait(WAIT_S)
        if self.fail == "raise":
            raise RuntimeError("engine fell over")
        results = [empty_result(r) for r in requests]
        for result in results:
            result.timings.decode_time_ms = 1.0
            result.timings.inference_time_ms = 2.0
        return results[:-1] if self.fail == "short" else results

    @property
    def processed(self) -> list[str]:
        with self._lock:
            return [rid for batch in self.batches for rid in batch]


class Replies:
    """Collects results from callbacks; `wait(n)` blocks until n arrived."""

    def __init__(self) -> None:
        self.results: list[pb.FrameResult] = []
        self._cond = threading.Condition()

    def __call__(self, result: pb.FrameResult) -> None:
        with self._cond:
            self.results.append(result)
            self._cond.notify_all()

    def wait(self, count: int) -> list[pb.FrameResult]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.results) >= count, WAIT_S)
            return list(self.results)

    def codes(self) -> dict[str, grpc.StatusCode]:
        with self._cond:
            return {r.request_id: status_code_from_proto(r.status) for r in self.results}


def _request(camera: str, frame: int, agent: str = "agent-1", **fields: object) -> pb.FrameRequest:
    return pb.FrameRequest(
        agent_id=agent,
        camera_id=camera,
        frame_id=frame,
        request_id=f"{agent}/{camera}/{frame}",
        **fields,  # type: ignore[arg-type]
    )


@pytest.fixture
def make_batcher() -> Iterator[MakeBatcher]:
    started: list[DynamicBatcher] = []

    def make(processor: GatedProcessor, **config: object) -> DynamicBatcher:
        fields: dict[str, object] = {"max_queue_delay_ms": 1.0, **config}
        batcher = DynamicBatcher(processor, BatchingConfig(**fields))  # type: ignore[arg-type]
        batcher.start()
        started.append(batcher)
        return batcher

    yield make
    for batcher in started:
        batcher.stop(grace_s=0.0)


def test_many_submitters_get_exactly_one_reply_each(make_batcher: MakeBatcher) -> None:
    processor = GatedProcessor()
    batcher = make_batcher(processor, max_batch_size=8)
    replies = Replies()
    streams, frames = 8, 25

    def send(stream: int) -> None:
        for frame in range(frames):
            batcher.submit(_request(f"cam-{stream}", frame), replies)

    threads = [threading.Thread(target=send, args=(s,)) for s in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results = replies.wait(streams * frames)
    time.sleep(0.05)  # no late duplicates

    assert len(replies.results) == streams * frames
    expected = {f"agent-1/cam-{s}/{f}" for s in range(streams) for f in range(frames)}
    assert Counter(r.request_id for r in results) == Counter(expected)
    assert all(r.status.code == 0 for r in results)
    assert all(1 <= len(batch) <= 8 for batch in processor.batches)
    assert sorted(processor.processed) == sorted(expected)


def test_results_carry_queue_time_queue_depth_and_total_time(make_batcher: MakeBatcher) -> None:
    processor = GatedProcessor(open_gate=False)
    batcher = make_batcher(processor, max_batch_size=2)
    replies = Replies()
    for frame in range(5):
        batcher.submit(_request("cam", frame), replies)
    assert processor.entered.wait(WAIT_S)
    time.sleep(0.05)
    processor.gate.set()

    results = replies.wait(5)

    later = [r for r in results if r.frame_id >= 2]
    assert all(r.timings.queue_time_ms >= 40.0 for r in later)
    assert all(r.timings.total_time_ms >= r.timings.queue_time_ms for r in results)
    assert max(r.queue_depth for r in results) >= 1
    assert results[-1].queue_depth == 0


def test_overload_is_resource_exhausted_at_once_with_the_queue_depth(
    make_batcher: MakeBatcher,
) -> None:
    processor = GatedProcessor(open_gate=False)
    batcher = make_batcher(
        processor, max_batch_size=1, per_stream_queue_frames=2, max_queue_frames=3
    )
    replies = Replies()
    batcher.submit(_request("a", 0), replies)
    assert processor.entered.wait(WAIT_S)  # a-0 is running; the queue is empty again
    for frame in range(1, 4):
        batcher.submit(_request("a", frame), replies)  # a-3: its camera's queue is full
    batcher.submit(_request("b", 0), replies)  # b-0 fills the total
    batcher.submit(_request("c", 0), replies)  # c-0: total full

    rejected = replies.wait(2)
    codes = replies.codes()

    assert codes == {
        "agent-1/a/3": grpc.StatusCode.RESOURCE_EXHAUSTED,
        "agent-1/c/0": grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
    assert [r.queue_depth for r in rejected] == [2, 3]
    assert "stream queue full" in rejected[0].status.message
    processor.gate.set()
    replies.wait(6)
    assert set(replies.codes().values()) == {
        grpc.StatusCode.OK,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }


def test_deadlines_at_admission_and_in_the_queue(make_batcher: MakeBatcher) -> None:
    processor = GatedProcessor(open_gate=False)
    batcher = make_batcher(processor, max_batch_size=1)
    replies = Replies()
    now = time.time()
    batcher.submit(_request("cam", 0), replies)
    assert processor.entered.wait(WAIT_S)

    batcher.submit(_request("cam", 1, deadline=timestamp_from_seconds(now - 1.0)), replies)
    assert replies.codes() == {"agent-1/cam/1": grpc.StatusCode.DEADLINE_EXCEEDED}
    batcher.submit(_request("cam", 2, deadline=timestamp_from_seconds(now + 0.05)), replies)
    batcher.submit(_request("cam", 3), replies, time_remaining_s=0.05)
    batcher.submit(_request("cam", 4), replies)
    time.sleep(0.1)
    processor.gate.set()
    replies.wait(5)

    codes = replies.codes()
    assert codes["agent-1/cam/2"] == codes["agent-1/cam/3"] == grpc.StatusCode.DEADLINE_EXCEEDED
    expired = [r for r in replies.results if r.frame_id in (2, 3)]
    assert all(r.timings.queue_time_ms >= 50.0 for r in expired)  # they did wait
    assert codes["agent-1/cam/4"] == grpc.StatusCode.OK
    assert processor.processed == ["agent-1/cam/0", "agent-1/cam/4"]


def test_frames_without_deadline_get_the_default(make_batcher: MakeBatcher) -> None:
    processor = GatedProcessor(open_gate=False)
    batcher = make_batcher(processor, max_batch_size=1, default_deadline_ms=50)
    replies = Replies()
    batcher.submit(_request("cam", 0), replies)
    assert processor.entered.wait(WAIT_S)
    batcher.submit(_request("cam", 1), replies)
    time.sleep(0.1)
    processor.gate.set()

    replies.wait(2)

    assert replies.codes()["agent-1/cam/1"] == grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize("fail", ["raise", "short"])
def test_processor_failure_is_internal_for_each_frame_of_the_batch(
    make_batcher: MakeBatcher, fail: str
) -> None:
    batcher = make_batcher(GatedProcessor(fail=fail), max_batch_size=4)
    replies = Replies()
    for frame in range(3):
        batcher.submit(_request("cam", frame), replies)

    replies.wait(3)
    batcher.submit(_request("cam", 9), replies)  # the worker survived
    replies.wait(4)

    assert set(replies.codes().values()) == {grpc.StatusCode.INTERNAL}


def test_a_failing_callback_does_not_stop_the_worker(make_batcher: MakeBatcher) -> None:
    batcher = make_batcher(GatedProcessor())
    replies = Replies()

    def explode(_result: pb.FrameResult) -> None:
        raise RuntimeError("client gone")

    batcher.submit(_request("cam", 0), explode)
    batcher.submit(_request("cam", 1), replies)

    assert [r.frame_id for r in replies.wait(1)] == [1]


def test_drain_finishes_queued_frames_and_refuses_new_ones() -> None:
    processor = GatedProcessor(open_gate=False)
    batcher = DynamicBatcher(processor, BatchingConfig(max_batch_size=2, max_queue_delay_ms=1000))
    batcher.start()
    replies = Replies()
    for frame in range(3):
        batcher.submit(_request("cam", frame), replies)
    assert processor.entered.wait(WAIT_S)

    batcher.begin_drain(grace_s=WAIT_S)
    batcher.submit(_request("cam", 99), replies)
    assert replies.codes() == {"agent-1/cam/99": grpc.StatusCode.UNAVAILABLE}
    processor.gate.set()
    batcher.stop(grace_s=WAIT_S)

    codes = replies.codes()
    assert [codes[f"agent-1/cam/{f}"] for f in range(3)] == [grpc.StatusCode.OK] * 3


def test_drain_past_the_grace_period_answers_the_rest_unavailable() -> None:
    processor = GatedProcessor(open_gate=False)
    batcher = DynamicBatcher(processor, BatchingConfig(max_batch_size=1, max_queue_delay_ms=0))
    batcher.start()
    replies = Replies()
    for frame in range(3):
        batcher.submit(_request("cam", frame), replies)
    assert processor.entered.wait(WAIT_S)

    stopper = threading.Thread(target=batcher.stop, kwargs={"grace_s": 0.05})
    stopper.start()
    time.sleep(0.1)
    processor.gate.set()  # the running batch completes after the grace period
    stopper.join(WAIT_S)

    codes = replies.codes()
    assert codes["agent-1/cam/0"] == grpc.StatusCode.OK
    assert codes["agent-1/cam/1"] == codes["agent-1/cam/2"] == grpc.StatusCode.UNAVAILABLE
    assert processor.processed == ["agent-1/cam/0"]


def test_metrics_count_batches_rejections_and_answers() -> None:
    metrics = ServiceMetrics()
    processor = GatedProcessor(open_gate=False)
    config = BatchingConfig(
        max_batch_size=2, max_queue_delay_ms=0, per_stream_queue_frames=1, max_queue_frames=4
    )
    batcher = DynamicBatcher(processor, config, metrics=metrics)
    batcher.start()
    replies = Replies()
    batcher.submit(_request("cam", 0), replies)
    assert processor.entered.wait(WAIT_S)
    batcher.submit(_request("cam", 1), replies)
    batcher.submit(_request("cam", 2), replies)  # stream queue full
    assert metrics.registry.get_sample_value("cloud_service_frames_in_flight") == 2
    processor.gate.set()
    replies.wait(3)
    batcher.stop(grace_s=1.0)

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert sample("cloud_service_batch_size_frames_count") == 2
    assert sample("cloud_service_frames_rejected_total", reason="stream_queue_full") == 1
    assert sample("cloud_service_frames_total", agent_id="agent-1", camera_id="cam", code="OK") == 2
    assert sample("cloud_service_queue_time_seconds_count") == 2
    assert sample("cloud_service_decode_time_seconds_count") == 2
    assert sample("cloud_service_inference_time_seconds_count") == 2
    assert sample("cloud_service_frames_in_flight") == 0
    assert sample("cloud_service_queue_depth_frames") == 0


def test_stop_without_start_answers_the_queue_unavailable() -> None:
    batcher = DynamicBatcher(GatedProcessor(), BatchingConfig())
    replies = Replies()
    batcher.submit(_request("cam", 0), replies)

    batcher.stop(grace_s=1.0)

    assert replies.codes() == {"agent-1/cam/0": grpc.StatusCode.UNAVAILABLE}


def test_stream_labels_are_bounded_and_odd_ids_never_become_labels() -> None:
    metrics = ServiceMetrics(max_stream_labels=2)
    assert metrics.stream_labels("agent-1", "cam-1") == ("agent-1", "cam-1")
    assert metrics.stream_labels("agent-1", "cam-2") == ("agent-1", "cam-2")
    assert metrics.stream_labels("agent-1", "cam-3") == ("other", "other")  # past the cap
    assert metrics.stream_labels("agent-1", "cam-1") == ("agent-1", "cam-1")  # still known
    assert metrics.stream_labels("", "cam-1") == ("invalid", "invalid")
    assert metrics.stream_labels("agent-1", 'cam"}\n') == ("invalid", "invalid")


class SkippingProcessor(GatedProcessor):
    """A processor that keeps video references: records what `skip` got, answers `verdict`."""

    def __init__(self, verdict: bool | str) -> None:
        super().__init__(open_gate=False)
        self.verdict = verdict
        self.skipped: list[list[str]] = []

    def skip(self, requests: Sequence[pb.FrameRequest]) -> list[bool]:
        self.skipped.append([r.request_id for r in requests])
        if self.verdict == "raise":
            raise RuntimeError("decoder fell over")
        return [bool(self.verdict)] * len(requests)


@pytest.mark.parametrize(("verdict", "keyframe"), [(False, False), (True, True), ("raise", True)])
def test_frames_expired_in_the_queue_go_through_skip_first(
    make_batcher: MakeBatcher, verdict: bool | str, keyframe: bool
) -> None:
    """Expired video packets are handed to `skip` (decoded there, so the session holds) and
    answered with its verdict; a failing `skip` falls back to asking for a keyframe."""
    processor = SkippingProcessor(verdict)
    batcher = make_batcher(processor, max_batch_size=1)
    replies = Replies()
    batcher.submit(_request("cam", 0), replies)
    assert processor.entered.wait(WAIT_S)
    video = pb.VideoPacket(codec="h264", session="s", sequence=1, data=b"\0")
    batcher.submit(_request("cam", 1, video=video), replies, time_remaining_s=0.05)
    batcher.submit(_request("cam", 2), replies, time_remaining_s=0.05)  # JPEG: no keyframe
    time.sleep(0.1)
    processor.gate.set()
    replies.wait(3)
    late = {r.frame_id: r for r in replies.results if r.frame_id in (1, 2)}
    assert all(r.status.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0] for r in late.values())
    assert late[1].keyframe_required is keyframe
    assert late[2].keyframe_required is False
    assert processor.skipped == [["agent-1/cam/1", "agent-1/cam/2"]]
