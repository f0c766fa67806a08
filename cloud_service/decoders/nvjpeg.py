"""GPU JPEG decoders (NVJPEG): torchvision's `decode_jpeg` on CUDA here, nvImageCodec batched
decode in `nvimgcodec.py`, the shared batch handling; `factory.create_gpu_decoder` picks one.

Both import their library lazily and raise `RuntimeUnavailableError` where it, or a CUDA GPU, is
missing. Every payload passes the header checks and limits first; the GPU sees only payloads that
parse. `decode_batch_device` keeps the images on the GPU (torch `uint8 (3, h, w)` RGB tensors) for
`cloud_service.gpu_preprocess`; `decode_batch` copies them to host BGR arrays like `CpuDecoder`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from cloud_service.decoders.base import (
    BgrImage,
    DecodeError,
    DecodeJob,
    Decoder,
    DecodeResult,
    JpegLimits,
)
from cloud_service.decoders.headers import JpegInfo, check_all
from detection.errors import RuntimeUnavailableError

logger = logging.getLogger(__name__)

DeviceImage = Any  # torch.Tensor uint8 (3, h, w) RGB on the GPU
DeviceResult = DeviceImage | DecodeError


class GpuDecoder(Decoder, Protocol):
    """A `Decoder` that can also leave the decoded images on the GPU."""

    def decode_batch_device(self, payloads: Sequence[bytes]) -> list[DeviceResult]:
        """One `uint8 (3, h, w)` RGB CUDA tensor or `DecodeError` per payload, in order."""
        ...


def import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise RuntimeUnavailableError(
            "torch is not installed (needed for images on the GPU and torchvision's decoder)"
        ) from exc
    return torch


def _require_cuda(torch: Any, what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeUnavailableError(f"no CUDA GPU: {what} needs one")


def _check_shape(image: DeviceImage, info: JpegInfo) -> DeviceResult:
    if tuple(image.shape) != (3, info.height, info.width):
        return DecodeError(
            f"decoded shape {tuple(image.shape)} differs from header size "
            f"{info.width}x{info.height}"
        )
    return image


class BatchedGpuDecoder:
    """Header checks, error placement, host copies and the one-thread job queue of GPU decoders.

    A subclass implements `_decode_valid` for payloads that passed the header checks.
    """

    name = "nvjpeg"

    def __init__(self, limits: JpegLimits | None) -> None:
        self.limits = limits if limits is not None else JpegLimits()
        # GPU decodes are batched already; one thread keeps them in order and off the caller.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvjpeg")

    def _decode_valid(self, payloads: list[bytes]) -> list[DeviceImage | DecodeError]:
        raise NotImplementedError

    def decode_batch_device(self, payloads: Sequence[bytes]) -> list[DeviceResult]:
        """One `uint8 (3, h, w)` RGB CUDA tensor or `DecodeError` per payload, in order."""
        checked = check_all(payloads, self.limits)
        results: list[DeviceResult] = list(checked)
        valid = [(i, info) for i, info in enumerate(checked) if isinstance(info, JpegInfo)]
        if valid:
            decoded = self._decode_valid([payloads[i] for i, _ in valid])
            for (i, info), image in zip(valid, decoded, strict=True):
                results[i] = image if isinstance(image, DecodeError) else _check_shape(image, info)
        return results

    def decode_batch(self, payloads: Sequence[bytes]) -> list[DecodeResult]:
        """Decode on the GPU and copy each image to a host BGR `uint8 (h, w, 3)` array."""
        return [
            r if isinstance(r, DecodeError) else _to_host_bgr(r)
            for r in self.decode_batch_device(payloads)
        ]

    def submit(self, payloads: Sequence[bytes]) -> DecodeJob:
        """Decode on the decoder's own thread; return at once."""
        return DecodeJob.of_batch(self._pool.submit(self.decode_batch, list(payloads)))

    def close(self) -> None:
        """Stop the job thread."""
        self._pool.shutdown(wait=True)


def _to_host_bgr(image: DeviceImage) -> BgrImage:
    """CHW RGB tensor (any device) -> contiguous HWC BGR numpy array (reordered on the device)."""
    return np.asarray(image.flip(0).permute(1, 2, 0).contiguous().cpu().numpy(), dtype=np.uint8)


class TorchvisionNvjpegDecoder(BatchedGpuDecoder):
    """`torchvision.io.decode_jpeg(list, device='cuda')`: one batched NVJPEG call per batch.

    torchvision returns no partial results, so a failed batch is decoded again one by one to
    find the payloads that caused it. `device="cpu"` decodes with libjpeg (tests, no GPU).
    """

    def __init__(self, *, limits: JpegLimits | None = None, device: str = "cuda:0") -> None:
        torch = import_torch()
        try:
            from torchvision.io import ImageReadMode, decode_jpeg
        except ImportError as exc:
            raise RuntimeUnavailableError("torchvision is not installed (`gpu` extra)") from exc
        if device.startswith("cuda"):
            _require_cuda(torch, "torchvision's NVJPEG decode")
        super().__init__(limits)
        self.name = "nvjpeg/torchvision" if device.startswith("cuda") else "torchvision/cpu"
        self._torch = torch
        self._device = device
        self._decode: Callable[..., Any] = decode_jpeg
        self._mode = ImageReadMode.RGB

    def _decode_valid(self, payloads: list[bytes]) -> list[DeviceImage | DecodeError]:
        tensors = [self._torch.frombuffer(bytearray(p), dtype=self._torch.uint8) for p in payloads]
        try:
            return list(self._decode(tensors, mode=self._mode, device=self._device))
        except RuntimeError as exc:
            logger.debug("batched decode of %s images failed (%s); one by one", len(payloads), exc)
        return [self._decode_alone(tensor) for tensor in tensors]

    def _decode_alone(self, tensor: Any) -> DeviceImage | DecodeError:
        try:
            return self._decode(tensor, mode=self._mode, device=self._device)
        except RuntimeError as exc:
            return DecodeError(f"cannot decode JPEG: {exc}")
