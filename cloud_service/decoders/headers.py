"""JPEG header checks: read the size from the SOF segment and apply the byte and pixel limits.

Run on every payload before decoding, so that non-JPEG, truncated and oversized input is rejected
with a clear message before a codec (CPU or GPU) allocates anything for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cloud_service.decoders.base import DecodeError, JpegLimits

_SOI = b"\xff\xd8"
_EOI = b"\xff\xd9"
_SOS = 0xDA
# Start-of-frame markers carrying the image size (C4 DHT, C8 JPG and CC DAC are not SOF).
_SOF_MARKERS = frozenset(
    {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)
# Markers without a length field.
_STANDALONE_MARKERS = frozenset({0x01, *range(0xD0, 0xD8)})


@dataclass(frozen=True)
class JpegInfo:
    """Size read from a JPEG header."""

    width: int
    height: int


def inspect_jpeg(data: bytes) -> JpegInfo:
    """Image size from the SOF segment; raise `DecodeError` for non-JPEG or truncated data."""
    if not data.startswith(_SOI):
        raise DecodeError(f"not a JPEG: starts with {data[:4].hex() or 'nothing'}, expected ffd8")
    size: JpegInfo | None = None
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            raise DecodeError(f"corrupt JPEG: expected a marker at byte {pos}")
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
                raise DecodeError("corrupt JPEG: scan data before a start-of-frame header")
            if data.rfind(_EOI, pos) < 0:
                raise DecodeError("truncated JPEG: no end-of-image marker after the scan data")
            if size.width == 0 or size.height == 0:
                raise DecodeError(f"corrupt JPEG: image size {size.width}x{size.height}")
            return size
        pos += 2 + length
    raise DecodeError(f"truncated JPEG: header ends at byte {len(data)} before the scan data")


def check_limits(data: bytes, limits: JpegLimits) -> JpegInfo:
    """`inspect_jpeg` plus the byte and pixel limits; raise `DecodeError` naming the limit."""
    if len(data) > limits.max_jpeg_bytes:
        raise DecodeError(
            f"JPEG of {len(data)} bytes exceeds max_jpeg_bytes={limits.max_jpeg_bytes}"
        )
    info = inspect_jpeg(data)
    pixels = info.width * info.height
    if pixels > limits.max_image_pixels:
        raise DecodeError(
            f"JPEG of {info.width}x{info.height} = {pixels} pixels exceeds "
            f"max_image_pixels={limits.max_image_pixels}"
        )
    return info


def check_all(payloads: Sequence[bytes], limits: JpegLimits) -> list[JpegInfo | DecodeError]:
    """`check_limits` for each payload, the error in place of the info where one fails."""
    results: list[JpegInfo | DecodeError] = []
    for data in payloads:
        try:
            results.append(check_limits(data, limits))
        except DecodeError as exc:
            results.append(exc)
    return results
