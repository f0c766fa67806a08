"""`FrameRateLimiter`: analyse a camera at its `target_fps`, whatever rate it streams at."""

from __future__ import annotations


class FrameRateLimiter:
    """Accepts frames at most `fps` times a second on average, from their capture times.

    Frames come at the camera's own rate; a frame is taken when its time has reached the next
    slot, and the next slot moves one period on, so 25 fps thinned to 10 fps gives 10 frames a
    second on average (not 8.3, as "at least a period since the last one" would). After a gap
    longer than a period the schedule restarts from the frame, so a pause never causes a burst.
    A frame up to a fifth of a period early still counts as on time: camera timestamps jitter,
    and a 25 fps camera analysed at 25 fps must not lose frames to it.
    """

    def __init__(self, fps: float) -> None:
        if not fps > 0.0:
            raise ValueError(f"fps must be positive, got {fps}")
        self.period_s = 1.0 / fps
        self._early_s = 0.2 * self.period_s
        self._next_s: float | None = None
        self.skipped = 0

    def accept(self, timestamp_s: float) -> bool:
        """Whether the frame captured at `timestamp_s` (monotonic) should be analysed."""
        if self._next_s is not None and timestamp_s < self._next_s - self._early_s:
            self.skipped += 1
            return False
        if self._next_s is None or timestamp_s - self._next_s >= self.period_s:
            self._next_s = timestamp_s + self.period_s
        else:
            self._next_s += self.period_s
        return True
