"""`create_decoder`: the decoder the `decoder` config section asks for."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cloud_service.decoders.base import Decoder, JpegLimits
from cloud_service.decoders.codecs import create_codec
from cloud_service.decoders.cpu import CpuDecoder
from detection.errors import RuntimeUnavailableError

if TYPE_CHECKING:
    from cloud_service.config import DecoderConfig

logger = logging.getLogger(__name__)


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
    from cloud_service.decoders.nvjpeg import create_gpu_decoder  # torch only when asked for

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
