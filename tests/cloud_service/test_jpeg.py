"""JPEG header checks, limits and the CPU codecs (`cloud_service.decoders`)."""

from __future__ import annotations

import numpy as np
import pytest

from cloud_service.config import DecoderConfig
from cloud_service.decoders import (
    DecodeError,
    ImageCodec,
    JpegLimits,
    OpenCvCodec,
    SimpleJpegCodec,
    check_limits,
    create_codec,
    decode_checked,
    inspect_jpeg,
)
from tests.fixtures.grpc_server import make_jpeg

GOOD = make_jpeg(64, 48)


@pytest.mark.parametrize("decoder", [SimpleJpegCodec(), OpenCvCodec()], ids=lambda d: d.name)
def test_decoders_agree_on_good_jpeg(decoder: ImageCodec) -> None:
    image = decode_checked(decoder, GOOD, JpegLimits())

    assert image.shape == (48, 64, 3) and image.dtype == np.uint8
    reference = decode_checked(SimpleJpegCodec(), GOOD, JpegLimits())
    assert np.abs(image.astype(int) - reference.astype(int)).mean() < 2.0


def test_default_decoder_prefers_simplejpeg() -> None:
    assert create_codec().name == "simplejpeg"


def test_inspect_reads_the_size() -> None:
    info = inspect_jpeg(make_jpeg(33, 17))

    assert (info.width, info.height) == (33, 17)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "not a JPEG"),
        (b"GIF89a" + bytes(20), "not a JPEG"),
        (GOOD[:20], "truncated JPEG: header ends"),
        (GOOD[: len(GOOD) - 10], "truncated JPEG: no end-of-image"),
        (b"\xff\xd8\x00\x00\x00\x00", "expected a marker"),
        (b"\xff\xd8\xff\xda\x00\x02" + b"\xff\xd9", "scan data before a start-of-frame"),
    ],
    ids=["empty", "gif", "header-cut", "scan-cut", "garbage-after-soi", "no-sof"],
)
def test_inspect_rejects(payload: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        inspect_jpeg(payload)


def test_strict_decoder_rejects_corrupt_scan_data() -> None:
    jpeg = make_jpeg(160, 120)
    middle = len(jpeg) // 2
    corrupt = jpeg[:middle] + bytes(range(256)) + jpeg[middle + 256 :]

    with pytest.raises(DecodeError, match="cannot decode"):
        decode_checked(SimpleJpegCodec(), corrupt, JpegLimits())


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (JpegLimits(max_jpeg_bytes=len(GOOD) - 1), "max_jpeg_bytes"),
        (JpegLimits(max_image_pixels=64 * 48 - 1), "max_image_pixels"),
    ],
)
def test_limits(limits: JpegLimits, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        check_limits(GOOD, limits)


def test_limits_at_the_bound_pass() -> None:
    info = check_limits(GOOD, JpegLimits(max_jpeg_bytes=len(GOOD), max_image_pixels=64 * 48))

    assert (info.width, info.height) == (64, 48)


def test_limits_from_config() -> None:
    config = DecoderConfig(max_jpeg_bytes=2048, max_image_pixels=100)

    assert JpegLimits.from_config(config) == JpegLimits(max_jpeg_bytes=2048, max_image_pixels=100)
    assert JpegLimits() == JpegLimits.from_config(DecoderConfig())


@pytest.mark.parametrize("field", ["max_jpeg_bytes", "max_image_pixels"])
def test_limits_validate(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        JpegLimits(**{field: 0})
