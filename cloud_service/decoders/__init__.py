"""JPEG decoders for the cloud service: batched, errors per payload, CPU or NVJPEG.

`create_decoder(config.decoder)` builds the configured one. The GPU module (`nvjpeg`) is imported
only when a GPU decoder is asked for, so the CPU path never loads torch.
"""

from cloud_service.decoders.base import (
    BgrImage,
    DecodeError,
    DecodeJob,
    Decoder,
    DecodeResult,
    JpegLimits,
)
from cloud_service.decoders.codecs import (
    ImageCodec,
    OpenCvCodec,
    SimpleJpegCodec,
    TurboJpegCodec,
    create_codec,
    decode_checked,
)
from cloud_service.decoders.cpu import CpuDecoder
from cloud_service.decoders.factory import create_cpu_decoder, create_decoder
from cloud_service.decoders.headers import JpegInfo, check_limits, inspect_jpeg

__all__ = [
    "BgrImage",
    "CpuDecoder",
    "DecodeError",
    "DecodeJob",
    "DecodeResult",
    "Decoder",
    "ImageCodec",
    "JpegInfo",
    "JpegLimits",
    "OpenCvCodec",
    "SimpleJpegCodec",
    "TurboJpegCodec",
    "check_limits",
    "create_codec",
    "create_cpu_decoder",
    "create_decoder",
    "decode_checked",
    "inspect_jpeg",
]
