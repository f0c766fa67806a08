"""Turn one `FrameRequest` into the images to detect on, with the mapping back to source pixels."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import grpc

from cloud_service.convert import map_to_source
from cloud_service.jpeg import BgrImage, JpegDecoder, JpegError, JpegLimits, decode_checked
from detection.detections import Detections
from protos.analytics.v1 import analytics_pb2 as pb


class FrameRejected(Exception):
    """The frame cannot be processed; `code` and `message` go into its `FrameResult.status`."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ImageToSource:
    """Maps boxes on one decoded image to source-frame pixels: `offset + xy * scale`."""

    scale_x: float
    scale_y: float
    offset_x: float
    offset_y: float
    region_index: int | None


@dataclass(frozen=True)
class PreparedFrame:
    """Decoded images of one request (whole frame and/or regions) ready for the detector."""

    images: list[BgrImage]
    mappings: list[ImageToSource]
    source_width: float
    source_height: float
    decode_time_ms: float

    def to_source(self, image_index: int, detections: Detections) -> Detections:
        """Boxes found on `images[image_index]` in source-frame pixels, clipped to the frame."""
        mapping = self.mappings[image_index]
        return map_to_source(
            detections,
            scale_x=mapping.scale_x,
            scale_y=mapping.scale_y,
            offset_x=mapping.offset_x,
            offset_y=mapping.offset_y,
            source_width=self.source_width,
            source_height=self.source_height,
        )


def _decode(decoder: JpegDecoder, data: bytes, limits: JpegLimits, field: str) -> BgrImage:
    try:
        return decode_checked(decoder, data, limits)
    except JpegError as exc:
        raise FrameRejected(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {exc}") from exc


def _check_region(index: int, region: pb.Region) -> None:
    coords = (region.x1, region.y1, region.x2, region.y2)
    if not all(math.isfinite(c) for c in coords) or min(coords) < 0:
        raise FrameRejected(
            grpc.StatusCode.INVALID_ARGUMENT, f"regions[{index}]: coordinates {coords} invalid"
        )
    if region.x2 <= region.x1 or region.y2 <= region.y1:
        raise FrameRejected(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"regions[{index}]: needs x2 > x1 and y2 > y1, got {coords}",
        )
    if not region.jpeg:
        raise FrameRejected(grpc.StatusCode.INVALID_ARGUMENT, f"regions[{index}]: jpeg is empty")


def prepare_frame(
    request: pb.FrameRequest, decoder: JpegDecoder, limits: JpegLimits
) -> PreparedFrame:
    """Decode the whole-frame JPEG and every region; raise `FrameRejected` on invalid input."""
    if not request.jpeg and not request.regions:
        raise FrameRejected(grpc.StatusCode.INVALID_ARGUMENT, "neither jpeg nor regions is set")
    started = time.perf_counter()
    images: list[BgrImage] = []
    mappings: list[ImageToSource] = []
    source_width = float(request.original_width) or math.inf
    source_height = float(request.original_height) or math.inf
    if request.jpeg:
        frame = _decode(decoder, request.jpeg, limits, "jpeg")
        height, width = frame.shape[:2]
        if not request.original_width or not request.original_height:
            source_width, source_height = float(width), float(height)
        images.append(frame)
        mappings.append(ImageToSource(source_width / width, source_height / height, 0.0, 0.0, None))
    for index, region in enumerate(request.regions):
        _check_region(index, region)
        crop = _decode(decoder, region.jpeg, limits, f"regions[{index}].jpeg")
        height, width = crop.shape[:2]
        mappings.append(
            ImageToSource(
                (region.x2 - region.x1) / width,
                (region.y2 - region.y1) / height,
                region.x1,
                region.y1,
                index,
            )
        )
        images.append(crop)
    return PreparedFrame(
        images=images,
        mappings=mappings,
        source_width=source_width,
        source_height=source_height,
        decode_time_ms=(time.perf_counter() - started) * 1000.0,
    )
