"""`CpuDecoder`: a CPU codec run over a batch in a thread pool, errors per payload."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from cloud_service.decoders.base import DecodeError, DecodeJob, DecodeResult, JpegLimits
from cloud_service.decoders.codecs import ImageCodec, create_codec, decode_checked

logger = logging.getLogger(__name__)


class CpuDecoder:
    """Decodes batches with one CPU codec on `threads` threads (the codecs release the GIL).

    `submit` returns at once, so the caller can decode the next batch while the engine runs
    the current one; `decode_batch` waits. With one thread, `decode_batch` decodes inline.
    """

    def __init__(
        self,
        codec: ImageCodec | None = None,
        *,
        limits: JpegLimits | None = None,
        threads: int = 1,
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._codec = codec if codec is not None else create_codec()
        self.limits = limits if limits is not None else JpegLimits()
        self.threads = threads
        self.name = f"cpu/{self._codec.name}"
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="jpeg-decode")

    def decode_one(self, data: bytes) -> DecodeResult:
        """Check and decode one payload; any failure comes back as a `DecodeError`."""
        try:
            return decode_checked(self._codec, data, self.limits)
        except DecodeError as exc:
            return exc
        except Exception as exc:  # a codec bug must not fail the frame's neighbours
            logger.warning("%s failed on a %s-byte payload: %r", self.name, len(data), exc)
            return DecodeError(f"cannot decode JPEG: {type(exc).__name__}: {exc}")

    def decode_batch(self, payloads: Sequence[bytes]) -> list[DecodeResult]:
        """One image or `DecodeError` per payload, in order."""
        if self.threads == 1 or len(payloads) <= 1:
            return [self.decode_one(data) for data in payloads]
        return self.submit(payloads).result()

    def submit(self, payloads: Sequence[bytes]) -> DecodeJob:
        """Queue every payload on the pool and return at once."""
        return DecodeJob.of_items([self._pool.submit(self.decode_one, data) for data in payloads])

    def close(self) -> None:
        """Stop the threads (after the queued work)."""
        self._pool.shutdown(wait=True)

    def __repr__(self) -> str:
        return f"CpuDecoder(codec={self._codec.name!r}, threads={self.threads})"
