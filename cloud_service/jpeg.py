"""Former home of the CPU JPEG code; the names now live in `cloud_service.decoders`.

Kept so that older imports (`JpegLimits`, `BgrImage`, `JpegError`, ...) go on working; new code
imports from `cloud_service.decoders`.
"""

from __future__ import annotations

from cloud_service.decoders.base import BgrImage, JpegLimits
from cloud_service.decoders.base import DecodeError as JpegError
from cloud_service.decoders.codecs import ImageCodec as JpegDecoder
from cloud_service.decoders.codecs import OpenCvCodec as OpenCvJpegDecoder
from cloud_service.decoders.codecs import SimpleJpegCodec as SimpleJpegDecoder
from cloud_service.decoders.codecs import create_codec as default_jpeg_decoder
from cloud_service.decoders.codecs import decode_checked
from cloud_service.decoders.headers import JpegInfo, check_limits, inspect_jpeg

__all__ = [
    "BgrImage",
    "JpegDecoder",
    "JpegError",
    "JpegInfo",
    "JpegLimits",
    "OpenCvJpegDecoder",
    "SimpleJpegDecoder",
    "check_limits",
    "decode_checked",
    "default_jpeg_decoder",
    "inspect_jpeg",
]
