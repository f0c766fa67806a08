"""`BatchScheduler`: admission, batch formation, preferred sizes, round-robin and deadlines."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from cloud_service.batching.scheduler import (
    Admission,
    BatchScheduler,
    SchedulerLimits,
    StreamKey,
)
from cloud_service.config import BatchingConfig

A: StreamKey = ("agent-1", "cam-a")
B: StreamKey = ("agent-1", "cam-b")
C: StreamKey = ("agent-2", "cam-a")


@dataclass
class FakeClock:
    """Seconds that move only when a test says so."""

    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def _scheduler(
    clock: FakeClock,
    *,
    max_batch: int = 4,
    delay_s: float = 0.010,
    total: int = 8,
    per_stream: int = 4,
    preferred: tuple[int, ...] = (),
) -> BatchScheduler[str]:
    limits = SchedulerLimits(max_batch, delay_s, total, per_stream, preferred)
    return BatchScheduler(limits, clock)


def _fill(scheduler: BatchScheduler[str], key: StreamKey, count: int, tag: str = "") -> None:
    for i in range(count):
        assert scheduler.admit(f"{tag or key[1]}-{i}", key) is Admission.ADMITTED


# (queued per stream, max batch, total bound, per-stream bound, stream to add to, expected)
ADMISSION_CASES = [
    pytest.param({}, 4, 8, 4, A, Admission.ADMITTED, id="empty"),
    pytest.param({A: 3}, 4, 8, 4, A, Admission.ADMITTED, id="stream-one-below-bound"),
    pytest.param({A: 4}, 4, 8, 4, A, Admission.STREAM_QUEUE_FULL, id="stream-at-bound"),
    pytest.param({A: 4}, 4, 8, 4, B, Admission.ADMITTED, id="other-stream-unaffected"),
    pytest.param({A: 4, B: 4}, 4, 8, 4, C, Admission.QUEUE_FULL, id="total-at-bound"),
    pytest.param({A: 4, B: 3}, 4, 8, 4, C, Admission.ADMITTED, id="total-one-below-bound"),
]


@pytest.mark.parametrize(
    ("queued", "max_batch", "total", "per_stream", "key", "expected"), ADMISSION_CASES
)
def test_admission_bounds(
    queued: dict[StreamKey, int],
    max_batch: int,
    total: int,
    per_stream: int,
    key: StreamKey,
    expected: Admission,
) -> None:
    clock = FakeClock()
    scheduler = _scheduler(clock, max_batch=max_batch, total=total, per_stream=per_stream)
    for stream, count in queued.items():
        _fill(scheduler, stream, count)
    depth = scheduler.depth

    assert scheduler.admit("new", key) is expected
    assert scheduler.depth == depth + (expected is Admission.ADMITTED)


@pytest.mark.parametrize(
    ("deadline_offset_s", "expected"),
    [
        (-1.0, Admission.DEADLINE_EXCEEDED),
        (0.0, Admission.DEADLINE_EXCEEDED),
        (0.001, Admission.ADMITTED),
        (math.inf, Admission.ADMITTED),
    ],
)
def test_admission_checks_the_deadline(deadline_offset_s: float, expected: Admission) -> None:
    clock = FakeClock()
    scheduler = _scheduler(clock)

    assert scheduler.admit("f", A, clock.now + deadline_offset_s) is expected


def test_draining_refuses_frames_and_runs_the_queue_without_waiting() -> None:
    clock = FakeClock()
    scheduler = _scheduler(clock, delay_s=10.0)
    _fill(scheduler, A, 2)

    scheduler.start_draining()

    assert scheduler.admit("late", B) is Admission.DRAINING
    assert [q.item for q in scheduler.next_step().batch] == ["cam-a-0", "cam-a-1"]


# (frames queued, seconds since the first arrived, preferred sizes, expected batch size or the
# seconds to wait when none is due yet)
FORMATION_CASES = [
    pytest.param(0, 0.0, (), ("wait", None), id="empty-waits-for-a-frame"),
    pytest.param(1, 0.0, (), ("wait", 0.010), id="one-frame-waits-the-delay"),
    pytest.param(1, 0.004, (), ("wait", 0.006), id="waits-the-rest-of-the-delay"),
    pytest.param(1, 0.010, (), ("run", 1), id="delay-over-runs-what-is-there"),
    pytest.param(3, 0.0, (), ("wait", 0.010), id="below-max-waits"),
    pytest.param(4, 0.0, (), ("run", 4), id="max-batch-runs-at-once"),
    pytest.param(7, 0.0, (), ("run", 4), id="more-than-max-runs-max"),
    pytest.param(3, 0.010, (1, 2, 4), ("run", 2), id="preferred-largest-that-fits"),
    pytest.param(2, 0.0, (1, 2), ("run", 2), id="largest-preferred-runs-at-once"),
    pytest.param(1, 0.0, (2, 4), ("wait", 0.010), id="below-preferred-waits"),
    pytest.param(1, 0.010, (2, 4), ("run", 1), id="below-preferred-runs-after-delay"),
    pytest.param(7, 0.0, (2, 4), ("run", 4), id="preferred-caps-the-batch"),
]


@pytest.mark.parametrize(("queued", "waited_s", "preferred", "expected"), FORMATION_CASES)
def test_batch_formation(
    queued: int,
    waited_s: float,
    preferred: tuple[int, ...],
    expected: tuple[str, float | int | None],
) -> None:
    clock = FakeClock()
    scheduler = _scheduler(clock, max_batch=4, delay_s=0.010, preferred=preferred)
    for i in range(queued):
        scheduler.admit(f"f{i}", (f"agent-{i}", "cam"))
    clock.now += waited_s

    step = scheduler.next_step()

    kind, value = expected
    if kind == "wait":
        assert step.batch == []
        assert step.wait_s == (None if value is None else pytest.approx(value))
    else:
        assert len(step.batch) == value
        assert scheduler.depth == queued - len(step.batch)
        assert step.wait_s == (0.0 if scheduler.depth else None)


def test_round_robin_across_streams_carries_over_between_batches() -> None:
    clock = FakeClock()
    scheduler = _scheduler(clock, max_batch=3, total=32, per_stream=8)
    _fill(scheduler, A, 6, "a")  # the flooding camera
    _fill(scheduler, B, 2, "b")
    _fill(scheduler, C, 1, "c")

    batches = [[q.item for q in scheduler.next_step().batch] for _ in range(3)]

    assert batches == [
        ["a-0", "b-0", "c-0"],
        ["a-1", "b-1", "a-2"],
        ["a-3", "a-4", "a-5"],
    ]


def test_a_quiet_stream_waits_at_most_one_batch_behind_a_flood() -> None:
    clock = FakeClock()
    scheduler = _scheduler(clock, max_batch=4, total=64, per_stream=32)
    _fill(scheduler, A, 32, "flood")
    scheduler.next_step()  # the flood's first batch is already running
    assert scheduler.admit("quiet", B) is Admission.ADMITTED

    second = [q.item for q in scheduler.next_step().batch]

    assert "quiet" in second


def test_order_within_a_stream_is_kept() -> None:
    clock = FakeClock()
    scheduler = _scheduler(clock, max_batch=4, total=16, per_stream=16)
    _fill(scheduler, A, 10, "a")
    clock.now += 1.0  # past the queue delay: the last two run without waiting for more

    items = [q.item for _ in range(3) for q in scheduler.next_step().batch]

    assert items == [f"a-{i}" for i in range(10)]


def test_expired_frames_are_taken_out_when_a_batch_is_formed() -> None:
    clock = FakeClock()
    scheduler = _scheduler(clock, max_batch=4)
    scheduler.admit("short", A, clock.now + 0.005)
    scheduler.admit("long", A, clock.now + 1.0)
    scheduler.admit("other-short", B, clock.now + 0.005)
    clock.now += 0.010

    step = scheduler.next_step()

    assert sorted(q.item for q in step.expired) == ["other-short", "short"]
    assert [q.item for q in step.batch] == ["long"]
    assert scheduler.depth == 0
    assert scheduler.stream_depth(B) == 0


def test_expiry_alone_is_reported_while_the_rest_waits() -> None:
    clock = FakeClock()
    scheduler = _scheduler(clock, delay_s=1.0)
    scheduler.admit("late", A, clock.now + 0.001)
    scheduler.admit("ok", A, math.inf)
    clock.now += 0.5

    step = scheduler.next_step()

    assert [q.item for q in step.expired] == ["late"]
    assert step.batch == [] and step.wait_s == pytest.approx(0.5)


def test_queued_frames_carry_arrival_time_and_key() -> None:
    clock = FakeClock(now=5.0)
    scheduler = _scheduler(clock, max_batch=1)
    scheduler.admit("f", C, 9.0)

    (queued,) = scheduler.next_step().batch

    assert (queued.item, queued.key, queued.arrival_s, queued.deadline_s) == ("f", C, 5.0, 9.0)


def test_take_all_empties_every_queue() -> None:
    clock = FakeClock()
    scheduler = _scheduler(clock)
    _fill(scheduler, A, 2)
    _fill(scheduler, B, 1)

    assert len(scheduler.take_all()) == 3
    assert scheduler.depth == 0 and scheduler.next_step().wait_s is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_queue_delay_s": -1.0}, "max_queue_delay_s"),
        ({"per_stream_queue_frames": 9}, "per_stream_queue_frames"),
        ({"preferred_batch_sizes": (4, 2)}, "preferred_batch_sizes"),
        ({"preferred_batch_sizes": (8,)}, "preferred_batch_sizes"),
    ],
)
def test_limits_are_validated(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {
        "max_batch_size": 4,
        "max_queue_delay_s": 0.01,
        "max_queue_frames": 8,
        "per_stream_queue_frames": 4,
        **kwargs,
    }
    with pytest.raises(ValueError, match=message):
        SchedulerLimits(**fields)  # type: ignore[arg-type]


def test_limits_from_config() -> None:
    config = BatchingConfig(
        max_batch_size=8, preferred_batch_sizes=[4, 8], max_queue_delay_ms=20, max_queue_frames=100
    )

    limits = SchedulerLimits.from_config(config)

    assert limits.max_queue_delay_s == pytest.approx(0.020)
    assert limits.preferred_batch_sizes == (4, 8)
    assert (limits.max_batch_size, limits.max_queue_frames) == (8, 100)
    assert limits.full_batch_size == 8


def test_frames_that_cannot_finish_before_their_deadline_expire_at_once() -> None:
    clock = FakeClock()
    scheduler = _scheduler(clock, max_batch=2, delay_s=0.0)
    scheduler.observe_batch(1.0, 2)  # half a second per frame here
    assert scheduler.expected_frame_s == pytest.approx(0.5)
    assert scheduler.admit("tight", A, clock.now + 0.3) is Admission.ADMITTED
    assert scheduler.admit("roomy", A, clock.now + 0.8) is Admission.ADMITTED

    step = scheduler.next_step()

    assert [q.item for q in step.expired] == ["tight"]  # would be answered 0.2 s late
    assert [q.item for q in step.batch] == ["roomy"]


def test_batches_are_cut_to_what_finishes_before_the_earliest_deadline() -> None:
    clock = FakeClock()
    scheduler = _scheduler(clock, max_batch=4, delay_s=0.0)
    scheduler.observe_batch(0.8, 4)  # 0.2 s per frame
    for i in range(4):
        assert scheduler.admit(f"f{i}", A, clock.now + 0.5) is Admission.ADMITTED

    first = scheduler.next_step()
    assert [q.item for q in first.batch] == ["f0", "f1"]  # 2 x 0.2 s fits in 0.5 s, 3 would not
    assert not first.expired
    clock.now += 0.4
    second = scheduler.next_step()
    assert [q.item for q in second.expired] == ["f2", "f3"]  # 0.1 s left: not even one fits


def test_frame_time_is_a_moving_average_that_ignores_nonsense() -> None:
    scheduler = _scheduler(FakeClock())
    assert scheduler.expected_frame_s == 0.0  # no estimate: only passed deadlines expire
    scheduler.observe_batch(2.0, 2)  # 1 s per frame
    assert scheduler.expected_frame_s == pytest.approx(1.0)
    scheduler.observe_batch(0.0, 4)  # mean 0.7, deviation 0.3: plans with 0.7 + 2 x 0.3
    weight = BatchScheduler.FRAME_TIME_WEIGHT
    assert scheduler.expected_frame_s == pytest.approx((1.0 - weight) + 2 * weight)
    scheduler.observe_batch(-1.0, 1)
    scheduler.observe_batch(math.nan, 1)
    scheduler.observe_batch(1.0, 0)
    assert scheduler.expected_frame_s == pytest.approx(1.3)
