"""CPU JPEG decoding behind a small protocol, with header checks and size limits.

`simplejpeg` (libjpeg-turbo, strict about corrupt data) is preferred; `cv2.imdecode` is the
fallback where it is not installed. Every payload goes through `inspect_jpeg` first, so that
non-JPEG, truncated and oversized input is rejected with a clear message before any decoding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from cloud_service.config import DecoderConfig

logger = logging.getLogger(__name__)

BgrImage = npt.NDArray[np.uint8]

_SOI = b"\xff\xd8"
_EOI = b"\xff\xd9"
_SOS = 0xDA
# Start-of-frame markers carrying the image size (C4 DHT, C8 JPG and CC DAC are not SOF).
_SOF_MARKERS = frozenset(
    {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)
# Markers without a length field.
_STANDALONE_MARKERS = frozenset({0x01, *range(0xD0, 0xD8)})


class JpegError(ValueError):
    """The payload is not a decodable JPEG within the configured limits."""


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


@dataclass(frozen=True)
class JpegInfo:
    """Size read from a JPEG header."""

    width: int
    height: int


class JpegDecoder(Protocol):
    """Decodes one JPEG to a BGR `uint8 (h, w, 3)` image; raises `JpegError` on bad data."""

    name: str

    def decode(self, data: bytes) -> BgrImage:
        """Decode `data` (already checked by `inspect_jpeg`)."""
        ...


def inspect_jpeg(data: bytes) -> JpegInfo:
    """Image size from the SOF segment; raise `JpegError` for non-JPEG or truncated data."""
    if not data.startswith(_SOI):
        raise JpegError(f"not a JPEG: starts with {data[:4].hex() or 'nothing'}, expected ffd8")
    size: JpegInfo | None = None
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            raise JpegError(f"corrupt JPEG: expected a marker at byte {pos}")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if marker in _STANDALONE_MARKERS:
            pos += 2
            continue
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if marker in _SOF_MARKERS and pos + 9 <= len(data):
            height = int.from_bytes(data[pos + 5 : pos + 7], "big")
            width = int.from_bytes(data[pos + 7 : pos + 9], "big")
            size = JpegInfo(width=width, height=height)
        if marker == _SOS:
            if size is None:
                raise JpegError("corrupt JPEG: scan data before a start-of-frame header")
            if data.rfind(_EOI, pos) < 0:
                raise JpegError("truncated JPEG: no end-of-image marker after the scan data")
            if size.width == 0 or size.height == 0:
                raise JpegError(f"corrupt JPEG: image size {size.width}x{size.height}")
            return size
        pos += 2 + length
    raise JpegError(f"truncated JPEG: header ends at byte {len(data)} before the scan data")


def check_limits(data: bytes, limits: JpegLimits) -> JpegInfo:
    """`inspect_jpeg` plus the byte and pixel limits; raise `JpegError` naming the limit."""
    if len(data) > limits.max_jpeg_bytes:
        raise JpegError(f"JPEG of {len(data)} bytes exceeds max_jpeg_bytes={limits.max_jpeg_bytes}")
    info = inspect_jpeg(data)
    pixels = info.width * info.height
    if pixels > limits.max_image_pixels:
        raise JpegError(
            f"JPEG of {info.width}x{info.height} = {pixels} pixels exceeds "
            f"max_image_pixels={limits.max_image_pixels}"
        )
    return info


def decode_checked(decoder: JpegDecoder, data: bytes, limits: JpegLimits) -> BgrImage:
    """Check `data` against `limits`, decode it and verify the decoded size matches the header."""
    info = check_limits(data, limits)
    image = decoder.decode(data)
    if image.shape != (info.height, info.width, 3):
        raise JpegError(
            f"decoded shape {image.shape} differs from header size {info.width}x{info.height}"
        )
    return image


class SimpleJpegDecoder:
    """libjpeg-turbo through `simplejpeg`, strict: corrupt or truncated data raises."""

    name = "simplejpeg"

    def __init__(self) -> None:
        import simplejpeg  # noqa: PLC0415 - optional dependency (cloud extra)

        self._simplejpeg = simplejpeg

    def decode(self, data: bytes) -> BgrImage:
        """Decode to BGR."""
        try:
            image = self._simplejpeg.decode_jpeg(data, colorspace="BGR", strict=True)
        except ValueError as exc:
            raise JpegError(f"cannot decode JPEG: {exc}") from exc
        return np.asarray(image, dtype=np.uint8)


class OpenCvJpegDecoder:
    """`cv2.imdecode`; more lenient than simplejpeg about corrupt scan data."""

    name = "opencv"

    def decode(self, data: bytes) -> BgrImage:
        """Decode to BGR."""
        import cv2  # noqa: PLC0415 - keep import cost out of module import

        image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
        if image is None:
            raise JpegError("cannot decode JPEG: cv2.imdecode failed")
        return np.asarray(image, dtype=np.uint8)


def default_jpeg_decoder() -> JpegDecoder:
    """simplejpeg where installed, else OpenCV."""
    try:
        return SimpleJpegDecoder()
    except ImportError:
        logger.info("simplejpeg not installed; decoding JPEG with OpenCV")
        return OpenCvJpegDecoder()
