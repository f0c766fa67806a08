"""Escalation budget: token buckets per camera and per agent, scaled by an AIMD back-off, and
a window on the frames in flight that starts small on each stream (slow start).

Pure: every method takes the current time (`now`, seconds on a monotonic clock) from the caller.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from edge_agent.config.escalation import EscalationBackoffConfig, EscalationConfig

logger = logging.getLogger(__name__)


class TokenBucket:
    """`rate_per_s` tokens per second up to `capacity`; starts full.

    A cost larger than the capacity passes when the bucket is full and leaves it in debt, so a
    frame bigger than the burst is not refused for ever while the long-run rate still holds.
    """

    def __init__(self, rate_per_s: float, capacity: float, now: float) -> None:
        if rate_per_s <= 0.0:
            raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
        if capacity <= 0.0:
            raise ValueError(f"capacity must be > 0, got {capacity}")
        self.rate_per_s = rate_per_s
        self.capacity = capacity
        self._tokens = capacity
        self._last = now

    def refill(self, now: float, rate_scale: float = 1.0) -> None:
        """Add the tokens earned since the last refill at `rate_scale` times the rate."""
        elapsed = max(0.0, now - self._last)
        self._tokens = min(self.capacity, self._tokens + elapsed * self.rate_per_s * rate_scale)
        self._last = max(self._last, now)

    def tokens(self) -> float:
        """Tokens available after the last refill (negative while in debt)."""
        return self._tokens

    def allows(self, cost: float) -> bool:
        """Whether `cost` can be taken now (call `refill` first)."""
        return self._tokens >= min(cost, self.capacity)

    def take(self, cost: float) -> None:
        """Spend `cost` tokens (may go into debt)."""
        self._tokens -= cost

    def clamp(self, fraction: float) -> None:
        """Cap the tokens at `fraction` of the capacity (so a back-off also cuts the burst)."""
        self._tokens = min(self._tokens, self.capacity * fraction)


class AimdBackoff:
    """A rate multiplier in [min_rate_fraction, 1]: cut by `decrease_factor` on congestion,
    regained by `recover_per_s` per second; congestion within `hold_ms` of a cut is ignored,
    so one slow spell (many late answers at once) costs a single cut."""

    def __init__(self, config: EscalationBackoffConfig, now: float) -> None:
        self._config = config
        self._multiplier = 1.0
        self._last = now
        self._hold_until = now
        self.decreases = 0

    def multiplier(self, now: float) -> float:
        """The multiplier at `now`, after additive recovery."""
        self._recover(now)
        return self._multiplier

    def congested(self, now: float) -> bool:
        """Record a congestion signal; True when it cut the rate (not held)."""
        self._recover(now)
        if now < self._hold_until:
            return False
        floor = self._config.min_rate_fraction
        self._multiplier = max(floor, self._multiplier * self._config.decrease_factor)
        self._hold_until = now + self._config.hold_ms / 1000.0
        self.decreases += 1
        return True

    def is_congestion(
        self, rtt_s: float | None, queue_time_ms: float | None, overloaded: bool
    ) -> bool:
        """Whether an answer's round trip, queue time or status says the cloud is congested."""
        if overloaded:
            return True
        if rtt_s is not None and rtt_s * 1000.0 > self._config.max_rtt_ms:
            return True
        return queue_time_ms is not None and queue_time_ms > self._config.max_queue_time_ms

    def _recover(self, now: float) -> None:
        elapsed = max(0.0, now - self._last)
        self._last = max(self._last, now)
        self._multiplier = min(1.0, self._multiplier + elapsed * self._config.recover_per_s)


class SendWindow:
    """Frames in flight allowed for the agent: TCP's slow start and multiplicative decrease.

    Starts at `initial`, grows by one for each answer that came back uncongested, up to
    `maximum`; halves (not below 1) when the rate backs off; back to `initial` on a new stream
    (another replica may be behind it). The frame budget bounds frames per second; this bounds
    what one agent has queued at the cloud at once, before the first answers tell how fast the
    cloud is.
    """

    def __init__(self, initial: int, maximum: int) -> None:
        if not 1 <= initial <= maximum:
            raise ValueError(f"need 1 <= initial ({initial}) <= maximum ({maximum})")
        self._initial = initial
        self._maximum = maximum
        self._size = initial

    @property
    def size(self) -> int:
        """Frames that may be in flight now."""
        return self._size

    def allows(self, in_flight: int) -> bool:
        """Whether one more frame may go with `in_flight` frames unanswered."""
        return in_flight < self._size

    def grow(self) -> None:
        """An answer came back uncongested."""
        self._size = min(self._maximum, self._size + 1)

    def cut(self) -> None:
        """The cloud is congested."""
        self._size = max(1, self._size // 2)

    def restart(self) -> None:
        """A new stream: slow start again."""
        self._size = self._initial


@dataclass(frozen=True)
class BudgetStats:
    """Counters of an `EscalationBudget`, for metrics and status."""

    granted: int
    refused_camera: int
    refused_agent: int
    backoffs: int
    rate_multiplier: float
    refused_window: int = 0
    window: int = 0  # frames in flight allowed now (0: no window)


@dataclass(frozen=True)
class Rates:
    """A budget's refill rates: frames and bytes per second."""

    frames_per_s: float
    bytes_per_s: float


@dataclass
class _CameraBuckets:
    frames: TokenBucket
    bytes: TokenBucket


class EscalationBudget:
    """Frames/s and bytes/s token buckets per camera and for the whole agent.

    `try_acquire` takes from all four buckets only when all of them allow. Refill rates are
    scaled by the AIMD multiplier that `observe` drives from the cloud's answers. With a
    `window`, `refuses_frame` also refuses while the frames in flight fill it.
    """

    def __init__(
        self,
        backoff: EscalationBackoffConfig,
        camera_rates: Rates,
        agent_rates: Rates,
        burst_s: float,
        now: float,
        window: SendWindow | None = None,
    ) -> None:
        self._backoff = AimdBackoff(backoff, now)
        self._window = window
        self._stream = 0  # the client's stream the window was last started on
        self._refused_window = 0
        self._camera_rates = camera_rates
        self._burst_s = burst_s
        self._agent = self._buckets(agent_rates, now)
        self._cameras: dict[str, _CameraBuckets] = {}
        self._granted = 0
        self._refused_camera = 0
        self._refused_agent = 0

    @classmethod
    def from_config(cls, config: EscalationConfig, now: float) -> EscalationBudget:
        """The budget of the `escalation:` settings (its rates, burst and back-off)."""
        return cls(
            config.backoff,
            Rates(config.per_camera_frames_per_s, config.per_camera_bytes_per_s),
            Rates(config.per_agent_frames_per_s, config.per_agent_bytes_per_s),
            config.burst_s,
            now,
            SendWindow(config.initial_in_flight, config.max_in_flight),
        )

    def _buckets(self, rates: Rates, now: float) -> _CameraBuckets:
        burst = self._burst_s
        return _CameraBuckets(
            frames=TokenBucket(rates.frames_per_s, max(1.0, rates.frames_per_s * burst), now),
            bytes=TokenBucket(rates.bytes_per_s, rates.bytes_per_s * burst, now),
        )

    def _camera(self, camera: str, now: float) -> _CameraBuckets:
        buckets = self._cameras.get(camera)
        if buckets is None:
            buckets = self._buckets(self._camera_rates, now)
            self._cameras[camera] = buckets
        return buckets

    def _all_buckets(self, camera: _CameraBuckets) -> tuple[TokenBucket, ...]:
        return (camera.frames, camera.bytes, self._agent.frames, self._agent.bytes)

    def try_acquire(self, camera: str, n_bytes: int, now: float) -> bool:
        """Spend one frame and `n_bytes` from `camera`'s and the agent's buckets if all allow."""
        scale = self._backoff.multiplier(now)
        own = self._camera(camera, now)
        for bucket in self._all_buckets(own):
            bucket.refill(now, scale)
        if not (own.frames.allows(1.0) and own.bytes.allows(n_bytes)):
            self._refused_camera += 1
            return False
        if not (self._agent.frames.allows(1.0) and self._agent.bytes.allows(n_bytes)):
            self._refused_agent += 1
            return False
        for bucket, cost in zip(self._all_buckets(own), (1.0, n_bytes, 1.0, n_bytes), strict=True):
            bucket.take(cost)
        self._granted += 1
        return True

    def affords(self, camera: str, n_bytes: int, now: float) -> bool:
        """Whether `camera`'s and the agent's byte buckets hold `n_bytes` now (nothing is
        spent or counted): lets the policy send crops where the whole frame is too dear."""
        scale = self._backoff.multiplier(now)
        own = self._camera(camera, now)
        own.bytes.refill(now, scale)
        self._agent.bytes.refill(now, scale)
        return own.bytes.allows(n_bytes) and self._agent.bytes.allows(n_bytes)

    def refuses_frame(self, camera: str, now: float, in_flight: int = 0) -> bool:
        """Whether a frame of `camera` is refused now for want of frame tokens, or because
        `in_flight` frames (sent or being encoded, unanswered) fill the window, before its size
        is known (counted as a refusal when so): spares working out what would be sent."""
        if self._window is not None and not self._window.allows(in_flight):
            self._refused_window += 1
            return True
        scale = self._backoff.multiplier(now)
        own = self._camera(camera, now)
        own.frames.refill(now, scale)
        self._agent.frames.refill(now, scale)
        if not own.frames.allows(1.0):
            self._refused_camera += 1
            return True
        if not self._agent.frames.allows(1.0):
            self._refused_agent += 1
            return True
        return False

    def adjust_bytes(self, camera: str, delta_bytes: int) -> None:
        """Correct a grant made on an estimate once the real size is known (`actual - estimate`)."""
        own = self._cameras.get(camera)
        if own is not None:
            own.bytes.take(delta_bytes)
        self._agent.bytes.take(delta_bytes)

    def observe(
        self,
        now: float,
        *,
        rtt_s: float | None = None,
        queue_time_ms: float | None = None,
        overloaded: bool = False,
        answered: bool = False,
    ) -> None:
        """Feed back one cloud answer: its round trip, the cloud's queue time, whether it
        was refused for load (RESOURCE_EXHAUSTED / UNAVAILABLE) and whether it `answered` with
        detections. Congestion cuts the rate and the window; an uncongested answer grows the
        window."""
        if not self._backoff.is_congestion(rtt_s, queue_time_ms, overloaded):
            if answered and self._window is not None:
                self._window.grow()
            return
        # Earn the tokens due at the old rate before the rate changes.
        scale = self._backoff.multiplier(now)
        buckets = [b for c in self._cameras.values() for b in (c.frames, c.bytes)]
        buckets += [self._agent.frames, self._agent.bytes]
        for bucket in buckets:
            bucket.refill(now, scale)
        if self._backoff.congested(now):
            multiplier = self._backoff.multiplier(now)
            for bucket in buckets:
                bucket.clamp(multiplier)
            if self._window is not None:
                self._window.cut()
            logger.info(
                "escalation backs off to %.2f of its budget (rtt %s s, queue %s ms, overloaded %s)",
                multiplier,
                rtt_s,
                queue_time_ms,
                overloaded,
            )

    def rate_multiplier(self, now: float) -> float:
        """The fraction of the configured rates currently allowed."""
        return self._backoff.multiplier(now)

    def stats(self, now: float) -> BudgetStats:
        """Counters so far and the current rate multiplier."""
        return BudgetStats(
            granted=self._granted,
            refused_camera=self._refused_camera,
            refused_agent=self._refused_agent,
            backoffs=self._backoff.decreases,
            rate_multiplier=self._backoff.multiplier(now),
            refused_window=self._refused_window,
            window=0 if self._window is None else self._window.size,
        )

    def follow_stream(self, stream_id: int) -> None:
        """The client's current stream (`EscalationClient.stream_id`): a new one, maybe to
        another replica, starts the window small again."""
        if stream_id != self._stream:
            self._stream = stream_id
            if self._window is not None:
                self._window.restart()
