"""Exponential reconnect back-off with jitter: pure, with an injected random source."""

from __future__ import annotations

import random
from collections.abc import Callable

from edge_agent.config.camera import CaptureConfig

_MS_PER_S = 1000.0


class Backoff:
    """Waits of `min_s * 2**attempt`, capped at `max_s`, spread by +-`jitter_fraction`.

    `rng` returns a float in [0, 1); 0.5 gives the un-jittered wait. The jittered wait is clamped
    to [0, max_s]. `reset()` (after a success) starts again at `min_s`.
    """

    def __init__(
        self,
        min_s: float,
        max_s: float,
        jitter_fraction: float,
        rng: Callable[[], float] | None = None,
    ) -> None:
        if min_s < 0 or max_s < min_s:
            raise ValueError(f"need 0 <= min_s <= max_s, got min_s={min_s}, max_s={max_s}")
        if not 0.0 <= jitter_fraction <= 1.0:
            raise ValueError(f"jitter_fraction must be in [0, 1], got {jitter_fraction}")
        self.min_s = min_s
        self.max_s = max_s
        self.jitter_fraction = jitter_fraction
        self._rng: Callable[[], float] = rng if rng is not None else random.random
        self._attempt = 0

    @classmethod
    def from_config(cls, config: CaptureConfig, rng: Callable[[], float] | None = None) -> Backoff:
        """The back-off a camera's `capture:` section describes."""
        return cls(
            config.reconnect_min_backoff_ms / _MS_PER_S,
            config.reconnect_max_backoff_ms / _MS_PER_S,
            config.reconnect_jitter_fraction,
            rng,
        )

    @property
    def attempt(self) -> int:
        """Waits handed out since the last reset."""
        return self._attempt

    def base_delay_s(self, attempt: int) -> float:
        """The un-jittered wait before retry number `attempt` (0-based)."""
        # Cap the exponent: 2**64 times any sane minimum is far past any maximum.
        return min(self.max_s, self.min_s * 2.0 ** min(attempt, 64))

    def next_delay_s(self) -> float:
        """The next wait in seconds; each call doubles the base up to `max_s`."""
        base = self.base_delay_s(self._attempt)
        self._attempt += 1
        spread = self.jitter_fraction * (2.0 * self._rng() - 1.0)
        return min(self.max_s, max(0.0, base * (1.0 + spread)))

    def reset(self) -> None:
        """Start again from `min_s` (call after a successful connection)."""
        self._attempt = 0
