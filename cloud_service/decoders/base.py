"""What every JPEG decoder shares: the `Decoder` protocol, per-item errors, limits and jobs.

A decoder takes a batch of payloads and returns one entry per payload, in order: the decoded
BGR `uint8 (h, w, 3)` image, or the `DecodeError` that payload alone caused. One bad frame never
fails its neighbours.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from cloud_service.config import DecoderConfig

BgrImage = npt.NDArray[np.uint8]


class DecodeError(ValueError):
    """The payload is not a decodable JPEG within the configured limits (one frame only)."""


DecodeResult = BgrImage | DecodeError


@dataclass(frozen=True)
class JpegLimits:
    """Bounds applied before decoding: compressed size and decoded pixel count."""

    max_jpeg_bytes: int = 4 * 1024 * 1024
    max_image_pixels: int = 3840 * 2160

    @classmethod
    def from_config(cls, config: DecoderConfig) -> JpegLimits:
        """The limits of the `decoder` config section."""
        return cls(max_jpeg_bytes=config.max_jpeg_bytes, max_image_pixels=config.max_image_pixels)

    def __post_init__(self) -> None:
        if self.max_jpeg_bytes < 1:
            raise ValueError(f"max_jpeg_bytes must be >= 1, got {self.max_jpeg_bytes}")
        if self.max_image_pixels < 1:
            raise ValueError(f"max_image_pixels must be >= 1, got {self.max_image_pixels}")


class DecodeJob:
    """A batch being decoded in the background; `result()` waits for it.

    Lets a caller start decoding the next batch while the engine runs the current one.
    """

    def __init__(self, wait: Callable[[float | None], list[DecodeResult]]) -> None:
        self._wait = wait

    @classmethod
    def of_items(cls, futures: Sequence[Future[DecodeResult]]) -> DecodeJob:
        """A job made of one future per payload."""

        def wait(timeout_s: float | None) -> list[DecodeResult]:
            if timeout_s is None:
                return [future.result() for future in futures]
            deadline = time.monotonic() + timeout_s
            return [f.result(timeout=max(0.0, deadline - time.monotonic())) for f in futures]

        return cls(wait)

    @classmethod
    def of_batch(cls, future: Future[list[DecodeResult]]) -> DecodeJob:
        """A job made of one future for the whole batch."""
        return cls(lambda timeout_s: future.result(timeout=timeout_s))

    @classmethod
    def done(cls, results: list[DecodeResult]) -> DecodeJob:
        """A job that has already finished."""
        return cls(lambda _timeout_s: results)

    def result(self, timeout_s: float | None = None) -> list[DecodeResult]:
        """One entry per payload, in order; raises `TimeoutError` after `timeout_s` in all."""
        return self._wait(timeout_s)


class Decoder(Protocol):
    """Decodes batches of JPEG payloads to BGR `uint8 (h, w, 3)` host images, errors per item."""

    name: str
    limits: JpegLimits

    def decode_batch(self, payloads: Sequence[bytes]) -> list[DecodeResult]:
        """One image or `DecodeError` per payload, in order; never raises for bad data."""
        ...

    def submit(self, payloads: Sequence[bytes]) -> DecodeJob:
        """Start decoding `payloads` in the background (same results as `decode_batch`)."""
        ...

    def close(self) -> None:
        """Release threads and device resources."""
        ...
