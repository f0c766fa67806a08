"""`Detections`: the one batch type passed between pipeline stages (parallel numpy arrays)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from detection.errors import InvalidDetectionsError

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]

_NO_TRACK = -1


def _check_shape(name: str, array: npt.NDArray[Any], expected: tuple[int, ...]) -> None:
    if array.shape != expected:
        raise InvalidDetectionsError(f"{name} must have shape {expected}, got {array.shape}")


@dataclass(frozen=True, eq=False)
class Detections:
    """Boxes of one frame: `xyxy (n,4)`, `confidence (n,)`, `class_id (n,)`, `tracker_id (n,)`.

    Arrays are converted to float32 / int64 and validated on creation; `tracker_id` is -1 where
    an object has no track yet.
    """

    xyxy: FloatArray
    confidence: FloatArray
    class_id: IntArray
    tracker_id: IntArray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    def __post_init__(self) -> None:
        xyxy = np.asarray(self.xyxy, dtype=np.float32)
        if xyxy.size == 0:
            xyxy = xyxy.reshape(0, 4)
        if xyxy.ndim != 2 or xyxy.shape[1] != 4:
            raise InvalidDetectionsError(f"xyxy must have shape (n, 4), got {xyxy.shape}")
        n = xyxy.shape[0]
        confidence = np.asarray(self.confidence, dtype=np.float32).reshape(-1)
        class_id = np.asarray(self.class_id).reshape(-1)
        if class_id.size and not np.issubdtype(class_id.dtype, np.integer):
            if not np.all(np.equal(np.mod(class_id, 1), 0)):
                raise InvalidDetectionsError("class_id must hold whole numbers")
        class_id = class_id.astype(np.int64)
        tracker_id = np.asarray(self.tracker_id).reshape(-1).astype(np.int64)
        if tracker_id.size == 0 and n:
            tracker_id = np.full(n, _NO_TRACK, dtype=np.int64)
        _check_shape("confidence", confidence, (n,))
        _check_shape("class_id", class_id, (n,))
        _check_shape("tracker_id", tracker_id, (n,))
        if not np.all(np.isfinite(xyxy)) or not np.all(np.isfinite(confidence)):
            raise InvalidDetectionsError("xyxy and confidence must be finite (no NaN or inf)")
        if np.any(xyxy[:, 2] < xyxy[:, 0]) or np.any(xyxy[:, 3] < xyxy[:, 1]):
            raise InvalidDetectionsError("boxes must satisfy x2 >= x1 and y2 >= y1")
        if np.any(class_id < 0):
            raise InvalidDetectionsError("class_id must be >= 0")
        object.__setattr__(self, "xyxy", xyxy)
        object.__setattr__(self, "confidence", confidence)
        object.__setattr__(self, "class_id", class_id)
        object.__setattr__(self, "tracker_id", tracker_id)

    @classmethod
    def empty(cls) -> Detections:
        """A batch with no boxes."""
        return cls(
            xyxy=np.empty((0, 4), np.float32),
            confidence=np.empty(0, np.float32),
            class_id=np.empty(0, np.int64),
        )

    def __len__(self) -> int:
        return int(self.xyxy.shape[0])

    def __getitem__(self, index: int | slice | npt.NDArray[Any]) -> Detections:
        """Select boxes by index, slice, integer array or boolean mask; always a `Detections`."""
        if isinstance(index, int):
            index = np.array([index])
        return Detections(
            xyxy=self.xyxy[index],
            confidence=self.confidence[index],
            class_id=self.class_id[index],
            tracker_id=self.tracker_id[index],
        )

    def __iter__(self) -> Iterator[tuple[FloatArray, float, int, int]]:
        for i in range(len(self)):
            yield (
                self.xyxy[i],
                float(self.confidence[i]),
                int(self.class_id[i]),
                int(self.tracker_id[i]),
            )

    @property
    def area(self) -> FloatArray:
        """Box areas in square pixels."""
        wh = self.xyxy[:, 2:4] - self.xyxy[:, 0:2]
        return (wh[:, 0] * wh[:, 1]).astype(np.float32)

    def with_tracker_ids(self, tracker_id: npt.ArrayLike) -> Detections:
        """A copy with `tracker_id` replaced (the original is never mutated)."""
        return Detections(self.xyxy, self.confidence, self.class_id, np.asarray(tracker_id))

    @classmethod
    def concatenate(cls, parts: list[Detections]) -> Detections:
        """Join several batches into one."""
        if not parts:
            return cls.empty()
        return cls(
            xyxy=np.concatenate([p.xyxy for p in parts]),
            confidence=np.concatenate([p.confidence for p in parts]),
            class_id=np.concatenate([p.class_id for p in parts]),
            tracker_id=np.concatenate([p.tracker_id for p in parts]),
        )
