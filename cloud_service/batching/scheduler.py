"""Pure scheduling state of the dynamic batcher: admission, per-stream queues, batch formation.

No threads and no I/O: time comes from an injected clock (monotonic seconds), so every decision
is tested with a fake clock. Not thread-safe; `DynamicBatcher` holds a lock around it.

Fairness is per stream key `(agent_id, camera_id)`: one gRPC stream carries the frames of all the
cameras of an agent, and every camera gets its own bounded queue. A batch takes one frame from
each non-empty queue in turn, and the turn carries over from one batch to the next, so a camera
that floods the server fills only its own queue (and then gets RESOURCE_EXHAUSTED) and delays the
frames of the other cameras by at most about one batch.

Deadlines count the work still ahead: the scheduler keeps a moving average of the time per frame
of a batch and of its deviation (`observe_batch`, fed by the batcher), and plans with the average
plus twice the deviation, as TCP plans its retransmission timeout. A batch is cut to the size
that can finish before the earliest deadline queued, and a frame whose deadline comes before even
a batch of one could finish is answered DEADLINE_EXCEEDED at once instead of being run and
answered late. On a CPU a batch of 4 frames of the cloud model takes over half a second;
without this, frames admitted with time left came back after their 0.5 s deadline (p99 1.46 s in
`bench/cloud/fleet_load.py`), and expiring by whole-batch time alone left almost nothing to answer.
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from cloud_service.config import BatchingConfig

T = TypeVar("T")
StreamKey = tuple[str, str]
"""`(agent_id, camera_id)`: the unit of fairness and of the per-stream queue bound."""


class Admission(enum.Enum):
    """What `BatchScheduler.admit` decided for one frame; the value names the metric reason."""

    ADMITTED = "admitted"
    STREAM_QUEUE_FULL = "stream_queue_full"
    QUEUE_FULL = "queue_full"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    DRAINING = "draining"


@dataclass(frozen=True)
class SchedulerLimits:
    """Batch sizes, queue bounds and the longest wait for a fuller batch."""

    max_batch_size: int
    max_queue_delay_s: float
    max_queue_frames: int
    per_stream_queue_frames: int
    preferred_batch_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not 0.0 <= self.max_queue_delay_s < math.inf:
            raise ValueError(f"max_queue_delay_s must be >= 0, got {self.max_queue_delay_s}")
        if not 1 <= self.per_stream_queue_frames <= self.max_queue_frames:
            raise ValueError(
                f"need 1 <= per_stream_queue_frames ({self.per_stream_queue_frames}) <= "
                f"max_queue_frames ({self.max_queue_frames})"
            )
        sizes = self.preferred_batch_sizes
        if any(not 1 <= s <= self.max_batch_size for s in sizes) or list(sizes) != sorted(
            set(sizes)
        ):
            raise ValueError(
                f"preferred_batch_sizes must increase strictly within 1..{self.max_batch_size}, "
                f"got {sizes}"
            )

    @classmethod
    def from_config(cls, config: BatchingConfig) -> SchedulerLimits:
        """The limits of the `batching` config section."""
        return cls(
            max_batch_size=config.max_batch_size,
            max_queue_delay_s=config.max_queue_delay_ms / 1000.0,
            max_queue_frames=config.max_queue_frames,
            per_stream_queue_frames=config.per_stream_queue_frames,
            preferred_batch_sizes=tuple(config.preferred_batch_sizes),
        )

    @property
    def full_batch_size(self) -> int:
        """A batch this large runs at once: the largest preferred size, else the maximum."""
        return self.preferred_batch_sizes[-1] if self.preferred_batch_sizes else self.max_batch_size

    def batch_size_for(self, queued: int) -> int:
        """How many of `queued` frames to run now: the largest preferred size that fits, else all
        of them up to the maximum (a frame must not wait forever for a preferred size)."""
        fitting = [size for size in self.preferred_batch_sizes if size <= queued]
        return fitting[-1] if fitting else min(queued, self.max_batch_size)


@dataclass(frozen=True)
class Queued(Generic[T]):
    """One admitted frame: the caller's item, its stream, arrival time and deadline (seconds)."""

    item: T
    key: StreamKey
    arrival_s: float
    deadline_s: float


@dataclass(frozen=True)
class Step(Generic[T]):
    """What to do now: a batch to run (may be empty), frames that expired while queued, and how
    long until the next batch is due (`None`: nothing is queued, wait for a frame)."""

    batch: list[Queued[T]]
    expired: list[Queued[T]]
    wait_s: float | None


class BatchScheduler(Generic[T]):
    """Bounded per-stream queues served round-robin into batches; see the module docstring.

    A batch is due when `full_batch_size` frames are queued, when the oldest frame has waited
    `max_queue_delay_s`, or at once while draining. Its size is cut so that it can finish before
    the earliest deadline queued (`expected_frame_s` per frame). Frames whose deadline comes
    before a batch of one could finish are taken out (and returned as expired) whenever a step
    is computed, so they never reach a batch.
    """

    FRAME_TIME_WEIGHT = 0.3  # weight of the newest batch in the moving average

    def __init__(self, limits: SchedulerLimits, clock: Callable[[], float]) -> None:
        self._limits = limits
        self._clock = clock
        self._queues: OrderedDict[StreamKey, deque[Queued[T]]] = OrderedDict()
        self._depth = 0
        self._draining = False
        self._frame_mean_s = 0.0
        self._frame_dev_s = 0.0

    @property
    def limits(self) -> SchedulerLimits:
        """The limits this scheduler enforces."""
        return self._limits

    @property
    def depth(self) -> int:
        """Frames queued across all streams."""
        return self._depth

    @property
    def draining(self) -> bool:
        """True once `start_draining` was called: no admission, batches run without waiting."""
        return self._draining

    @property
    def expected_frame_s(self) -> float:
        """Batch time per frame to plan with: moving average + 2 deviations (0 until the first
        `observe_batch`)."""
        return self._frame_mean_s + 2.0 * self._frame_dev_s

    def observe_batch(self, seconds: float, frames: int) -> None:
        """Record how long the latest batch of `frames` took, from its formation to its answers."""
        if frames < 1 or seconds < 0.0 or math.isnan(seconds):
            return
        per_frame = seconds / frames
        if self._frame_mean_s == 0.0:
            self._frame_mean_s = per_frame
            return
        weight = self.FRAME_TIME_WEIGHT
        error = per_frame - self._frame_mean_s
        self._frame_mean_s += weight * error
        self._frame_dev_s += weight * (abs(error) - self._frame_dev_s)

    def stream_depth(self, key: StreamKey) -> int:
        """Frames queued for one stream."""
        queue = self._queues.get(key)
        return len(queue) if queue else 0

    def admit(self, item: T, key: StreamKey, deadline_s: float = math.inf) -> Admission:
        """Queue `item` unless draining, already late, or its stream or the total queue is full."""
        now = self._clock()
        if self._draining:
            return Admission.DRAINING
        if deadline_s <= now:
            return Admission.DEADLINE_EXCEEDED
        if self.stream_depth(key) >= self._limits.per_stream_queue_frames:
            return Admission.STREAM_QUEUE_FULL
        if self._depth >= self._limits.max_queue_frames:
            return Admission.QUEUE_FULL
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        queue.append(Queued(item, key, now, deadline_s))
        self._depth += 1
        return Admission.ADMITTED

    def next_step(self) -> Step[T]:
        """Expire late frames, then form the next batch if one is due."""
        now = self._clock()
        expired = self._expire(now + self.expected_frame_s)
        if not self._depth:
            return Step([], expired, None)
        due_in_s = self._due_at() - now
        if due_in_s > 0.0:
            return Step([], expired, due_in_s)
        batch = self._take(self._limits.batch_size_for(min(self._depth, self._fitting(now))))
        return Step(batch, expired, 0.0 if self._depth else None)

    def start_draining(self) -> None:
        """Refuse new frames from now on; queued frames become due at once."""
        self._draining = True

    def take_all(self) -> list[Queued[T]]:
        """Remove and return every queued frame (oldest stream first), e.g. when a drain ends."""
        taken = [queued for queue in self._queues.values() for queued in queue]
        self._queues.clear()
        self._depth = 0
        return taken

    def _fitting(self, now: float) -> int:
        """Frames a batch formed now may hold and still finish before the earliest deadline."""
        if self.expected_frame_s <= 0.0:
            return self._depth
        earliest = min(queued.deadline_s for queue in self._queues.values() for queued in queue)
        return max(1, math.floor((earliest - now) / self.expected_frame_s))

    def _due_at(self) -> float:
        if self._draining or self._depth >= self._limits.full_batch_size:
            return -math.inf
        oldest = min(queue[0].arrival_s for queue in self._queues.values())
        return oldest + self._limits.max_queue_delay_s

    def _expire(self, now: float) -> list[Queued[T]]:
        """Take out the frames whose deadline is at or before `now` (the time a batch formed
        now would finish, when called from `next_step`)."""
        expired: list[Queued[T]] = []
        for key in list(self._queues):
            queue = self._queues[key]
            if all(queued.deadline_s > now for queued in queue):
                continue
            expired.extend(queued for queued in queue if queued.deadline_s <= now)
            kept = deque(queued for queued in queue if queued.deadline_s > now)
            if kept:
                self._queues[key] = kept
            else:
                del self._queues[key]
        self._depth -= len(expired)
        return expired

    def _take(self, size: int) -> list[Queued[T]]:
        """Round-robin: one frame from the first stream in turn, which then goes to the back."""
        batch: list[Queued[T]] = []
        while len(batch) < size and self._queues:
            key, queue = next(iter(self._queues.items()))
            batch.append(queue.popleft())
            if queue:
                self._queues.move_to_end(key)
            else:
                del self._queues[key]
        self._depth -= len(batch)
        return batch
