"""`RateLimitedLog`: one log line per interval for an event a client can repeat at will.

A refused stream, a malformed frame or a bad request is worth a line, but a client that repeats
it 200 times must not write 200 lines (the probe of issue 32: 140 WARNING lines for 200
refused streams). The first occurrence is logged at once; further ones within `interval_s` are
counted, and the next line that is logged says how many were left out. A counter next to it
(the caller's metric) keeps the full count.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """At most one line per `interval_s` through `logger` at `level` (module docstring).

    `on_suppressed` is called for every occurrence left out (e.g. a Prometheus counter's `inc`).
    Thread-safe.
    """

    def __init__(
        self,
        logger: logging.Logger,
        level: int = logging.WARNING,
        *,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        on_suppressed: Callable[[], object] | None = None,
    ) -> None:
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s}")
        self._logger = logger
        self._level = level
        self.interval_s = interval_s
        self._clock = clock
        self._on_suppressed = on_suppressed
        self._lock = threading.Lock()
        self._next_at: float | None = None
        self._suppressed = 0
        self.suppressed_total = 0

    def log(self, message: str, *args: object) -> bool:
        """Log `message % args` unless a line went out less than `interval_s` ago; whether it
        was logged."""
        with self._lock:
            now = self._clock()
            if self._next_at is not None and now < self._next_at:
                self._suppressed += 1
                self.suppressed_total += 1
                suppressed = -1
            else:
                suppressed, self._suppressed = self._suppressed, 0
                self._next_at = now + self.interval_s
        if suppressed < 0:
            if self._on_suppressed is not None:
                self._on_suppressed()
            return False
        if suppressed:
            self._logger.log(
                self._level,
                "%s (%d more like this since the previous line were not logged)",
                message % args if args else message,
                suppressed,
            )
        else:
            self._logger.log(self._level, message, *args)
        return True
