"""`MotionGate`: tells frames with motion from still ones by differencing against a background."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

from edge_agent.config.motion import MotionConfig


@dataclass(frozen=True, slots=True)
class MotionResult:
    """What the gate decided for one frame."""

    changed_fraction: float
    moving: bool
    detect: bool  # moving, or the longest allowed skip has passed


class MotionGate:
    """Downscaled grey frame compared with a running-average background.

    The first frame always counts as moving (nothing to compare with). `max_skip_s` forces a
    detection now and then, so still objects keep their tracks.
    """

    def __init__(self, config: MotionConfig) -> None:
        self.config = config
        self._background: npt.NDArray[np.float32] | None = None
        self._last_detect_s: float | None = None

    def update(self, image: npt.NDArray[np.uint8], timestamp_s: float) -> MotionResult:
        """Compare `image` (BGR) with the background, then fold it into the background."""
        grey = self._prepare(image)
        if self._background is None or self._background.shape != grey.shape:
            self._background = grey.copy()
            fraction, moving = 1.0, True
        else:
            delta = np.abs(grey - self._background)
            fraction = float(np.count_nonzero(delta >= self.config.pixel_delta)) / delta.size
            moving = fraction >= self.config.min_changed_fraction
            cv2.accumulateWeighted(grey, self._background, self.config.background_alpha)
        overdue = (
            self._last_detect_s is None
            or timestamp_s - self._last_detect_s >= self.config.max_skip_s
        )
        detect = moving or overdue
        if detect:
            self._last_detect_s = timestamp_s
        return MotionResult(fraction, moving, detect)

    def _prepare(self, image: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        height, width = image.shape[:2]
        target_w = min(self.config.downscale_width_px, width)
        target_h = max(1, round(height * target_w / width))
        small = cv2.resize(image, (target_w, target_h), interpolation=cv2.INTER_AREA)
        grey = cv2.cvtColor(small, cv2.COLOR_BGR2GRAY) if small.ndim == 3 else small
        blurred = cv2.GaussianBlur(grey, (5, 5), 0)
        return np.asarray(blurred, dtype=np.float32)
