"""Single-image CPU JPEG codecs (simplejpeg, PyTurboJPEG, OpenCV) and the checked decode.

All three wrap libjpeg-turbo. simplejpeg and PyTurboJPEG are strict (corrupt scan data raises);
`cv2.imdecode` is lenient and slower. Each releases the GIL while decoding, so a thread pool
decodes in parallel.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, Protocol

import numpy as np

from cloud_service.decoders.base import BgrImage, DecodeError, JpegLimits
from cloud_service.decoders.headers import check_limits
from detection.errors import RuntimeUnavailableError

logger = logging.getLogger(__name__)

CodecName = Literal["auto", "simplejpeg", "turbojpeg", "opencv"]


class ImageCodec(Protocol):
    """Decodes one JPEG to a BGR `uint8 (h, w, 3)` image; raises `DecodeError` on bad data."""

    name: str

    def decode(self, data: bytes) -> BgrImage:
        """Decode `data` (already checked by `check_limits`)."""
        ...


class SimpleJpegCodec:
    """libjpeg-turbo through `simplejpeg`, strict: corrupt or truncated data raises."""

    name = "simplejpeg"

    def __init__(self) -> None:
        try:
            import simplejpeg
        except ImportError as exc:
            raise RuntimeUnavailableError("simplejpeg is not installed (cloud extra)") from exc
        self._simplejpeg = simplejpeg

    def decode(self, data: bytes) -> BgrImage:
        """Decode to BGR."""
        try:
            image = self._simplejpeg.decode_jpeg(data, colorspace="BGR", strict=True)
        except ValueError as exc:
            raise DecodeError(f"cannot decode JPEG: {exc}") from exc
        return np.asarray(image, dtype=np.uint8)


def _strict_turbojpeg(turbojpeg: Any) -> Any:
    """A `TurboJPEG` that raises on libjpeg warnings (corrupt data) instead of warning.

    PyTurboJPEG 1.x reports warnings through `warnings.warn`, which cannot be caught per call
    from many threads; overriding its (name-mangled) reporter turns them into errors.
    """

    class StrictTurboJPEG(turbojpeg.TurboJPEG):  # type: ignore[misc]
        def _TurboJPEG__report_error(self, handle: Any) -> None:  # noqa: N802
            raise OSError(self._TurboJPEG__get_error_string(handle))

    return StrictTurboJPEG()


class TurboJpegCodec:
    """libjpeg-turbo through PyTurboJPEG (<2, with the system `libturbojpeg0`), strict."""

    name = "turbojpeg"

    def __init__(self) -> None:
        try:
            import turbojpeg  # type: ignore[import-untyped,unused-ignore]

            self._turbo = _strict_turbojpeg(turbojpeg)
        except (ImportError, RuntimeError, OSError) as exc:
            raise RuntimeUnavailableError(
                f"PyTurboJPEG or libturbojpeg is not installed: {exc}"
            ) from exc
        self._flags = int(turbojpeg.TJFLAG_STOPONWARNING)
        self._bgr = int(turbojpeg.TJPF_BGR)

    def decode(self, data: bytes) -> BgrImage:
        """Decode to BGR; stops at the first libjpeg warning."""
        try:
            image = self._turbo.decode(data, pixel_format=self._bgr, flags=self._flags)
        except OSError as exc:
            raise DecodeError(f"cannot decode JPEG: {exc}") from exc
        return np.asarray(image, dtype=np.uint8)


class OpenCvCodec:
    """`cv2.imdecode`; more lenient than simplejpeg about corrupt scan data."""

    name = "opencv"

    def decode(self, data: bytes) -> BgrImage:
        """Decode to BGR."""
        import cv2  # keep import cost out of module import

        image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
        if image is None:
            raise DecodeError("cannot decode JPEG: cv2.imdecode failed")
        return np.asarray(image, dtype=np.uint8)


_CODECS: dict[str, type[SimpleJpegCodec | TurboJpegCodec | OpenCvCodec]] = {
    "simplejpeg": SimpleJpegCodec,
    "turbojpeg": TurboJpegCodec,
    "opencv": OpenCvCodec,
}


def create_codec(name: CodecName = "auto") -> ImageCodec:
    """The codec called `name`; `auto` is simplejpeg where installed, else OpenCV."""
    if name != "auto":
        return _CODECS[name]()
    try:
        return SimpleJpegCodec()
    except RuntimeUnavailableError:
        logger.info("simplejpeg not installed; decoding JPEG with OpenCV")
        return OpenCvCodec()


def decode_checked(codec: ImageCodec, data: bytes, limits: JpegLimits) -> BgrImage:
    """Check `data` against `limits`, decode it and verify the decoded size matches the header."""
    info = check_limits(data, limits)
    image = codec.decode(data)
    if image.shape != (info.height, info.width, 3):
        raise DecodeError(
            f"decoded shape {image.shape} differs from header size {info.width}x{info.height}"
        )
    return image
