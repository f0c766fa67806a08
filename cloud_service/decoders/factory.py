"""`create_decoder`: the decoder the `decoder` config section asks for.

The GPU modules (`nvjpeg`, `nvimgcodec`) are imported only when a GPU decoder is asked for, so
the CPU path never loads torch.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

from cloud_service.decoders.base import Decoder, JpegLimits
from cloud_service.decoders.codecs import create_codec
from cloud_service.decoders.cpu import CpuDecoder
from detection.errors import RuntimeUnavailableError

if TYPE_CHECKING:
    from cloud_service.config import DecoderConfig
    from cloud_service.decoders.nvjpeg import GpuDecoder

logger = logging.getLogger(__name__)

NvjpegBackend = Literal["auto", "nvimgcodec", "torchvision"]


def create_cpu_decoder(config: DecoderConfig) -> CpuDecoder:
    """The CPU codec of `config` on `config.threads` threads."""
    return CpuDecoder(
        create_codec(config.cpu_codec),
        limits=JpegLimits.from_config(config),
        threads=config.threads,
    )


def create_decoder(config: DecoderConfig) -> Decoder:
    """CPU or NVJPEG decoder; a missing GPU decoder falls back to the CPU if allowed (logged)."""
    if config.type == "cpu":
        return create_cpu_decoder(config)
    try:
        decoder: Decoder = create_gpu_decoder(
            config.nvjpeg_backend,
            limits=JpegLimits.from_config(config),
            device_id=config.device_id,
            threads=config.threads,
        )
    except RuntimeUnavailableError as exc:
        if not config.fallback_to_cpu:
            raise
        logger.warning("NVJPEG decoder unavailable (%s); decoding JPEG on the CPU", exc)
        return create_cpu_decoder(config)
    logger.info("JPEG decoder %s on GPU %s", decoder.name, config.device_id)
    return decoder


def create_gpu_decoder(
    backend: NvjpegBackend = "auto",
    *,
    limits: JpegLimits | None = None,
    device_id: int = 0,
    threads: int = 4,
) -> GpuDecoder:
    """The NVJPEG decoder named by `backend`; `auto` tries nvImageCodec, then torchvision."""
    names = ["nvimgcodec", "torchvision"] if backend == "auto" else [backend]
    reasons: list[str] = []
    for name in names:
        try:
            if name == "nvimgcodec":
                from cloud_service.decoders.nvimgcodec import NvImageCodecDecoder

                return NvImageCodecDecoder(limits=limits, device_id=device_id, threads=threads)
            from cloud_service.decoders.nvjpeg import TorchvisionNvjpegDecoder

            return TorchvisionNvjpegDecoder(limits=limits, device=f"cuda:{device_id}")
        except RuntimeUnavailableError as exc:
            reasons.append(f"{name}: {exc}")
    raise RuntimeUnavailableError("no GPU JPEG decoder available: " + "; ".join(reasons))
