"""Turn `FrameRequest`s into the images to detect on, with the mapping back to source pixels.

The JPEGs of a whole batch of requests (whole frames and regions) go to the decoder in one call,
so a thread pool or NVJPEG decodes them together; a bad payload rejects only its own frame. A
whole frame sent as a video packet (`video`) is decoded first, in batch order, by its uplink
session's decoder (`VideoSessions`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from cloud_service.convert import map_to_source
from cloud_service.decoders import BgrImage, DecodeError, Decoder
from cloud_service.decoders.video import VideoDecoder, VideoRejected
from detection.detections import Detections
from protos.analytics.v1 import analytics_pb2 as pb


class FrameRejected(Exception):
    """The frame cannot be processed; `code` and `message` go into its `FrameResult.status`."""

    def __init__(
        self, code: grpc.StatusCode, message: str, *, keyframe_required: bool = False
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.keyframe_required = keyframe_required


@dataclass(frozen=True)
class ImageToSource:
    """Maps boxes on one decoded image to source-frame pixels: `offset + xy * scale`."""

    scale_x: float
    scale_y: float
    offset_x: float
    offset_y: float
    region_index: int | None

    @property
    def scale_up(self) -> bool:
        """Whether the detector may enlarge the image to its input size.

        Whole frames: yes, as always. Region crops: never; they run at native scale, since a
        64-200 px crop enlarged 4-10x shows objects far larger than the model learned them.
        """
        return self.region_index is None


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


def frame_payloads(request: pb.FrameRequest) -> list[tuple[str, bytes]]:
    """(field name, JPEG) of the whole frame and each region; `FrameRejected` if malformed.

    A `video` whole frame is not among them (it is decoded by its session, see `prepare_frames`).
    """
    video = request.HasField("video")
    if not request.jpeg and not request.regions and not video:
        raise FrameRejected(
            grpc.StatusCode.INVALID_ARGUMENT, "none of jpeg, video and regions is set"
        )
    if video and request.jpeg:
        raise FrameRejected(
            grpc.StatusCode.INVALID_ARGUMENT, "jpeg and video are both set: send one whole frame"
        )
    payloads = [("jpeg", request.jpeg)] if request.jpeg else []
    for index, region in enumerate(request.regions):
        _check_region(index, region)
        payloads.append((f"regions[{index}].jpeg", region.jpeg))
    return payloads


def assemble_frame(
    request: pb.FrameRequest, images: list[BgrImage], decode_time_ms: float
) -> PreparedFrame:
    """The `PreparedFrame` of `request` from its decoded images (whole frame first, regions)."""
    mappings: list[ImageToSource] = []
    source_width = float(request.original_width) or math.inf
    source_height = float(request.original_height) or math.inf
    crops = iter(images)
    if request.jpeg or request.HasField("video"):
        height, width = images[0].shape[:2]
        next(crops)
        if not request.original_width or not request.original_height:
            source_width, source_height = float(width), float(height)
        mappings.append(ImageToSource(source_width / width, source_height / height, 0.0, 0.0, None))
    for index, (region, crop) in enumerate(zip(request.regions, crops, strict=True)):
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
    return PreparedFrame(
        images=list(images),
        mappings=mappings,
        source_width=source_width,
        source_height=source_height,
        decode_time_ms=decode_time_ms,
    )


def decode_video(request: pb.FrameRequest, videos: VideoDecoder | None) -> BgrImage | FrameRejected:
    """The whole frame of a `video` request from its session's decoder, or its rejection."""
    if videos is None:
        return FrameRejected(
            grpc.StatusCode.INVALID_ARGUMENT,
            "this server does not decode the video uplink; send jpeg",
            keyframe_required=True,
        )
    try:
        return videos.decode(request.agent_id, request.camera_id, request.video)
    except VideoRejected as exc:
        return FrameRejected(exc.code, exc.message, keyframe_required=exc.keyframe_required)


def keep_reference(request: pb.FrameRequest, videos: VideoDecoder | None) -> bool:
    """Decode the video packet of a frame that will not be answered (late, say), since later
    packets of its session reference it; whether its session needs a keyframe now (the packet
    did not decode, or nothing here decodes video). A frame without video needs none."""
    if not request.HasField("video"):
        return False
    outcome = decode_video(request, videos)
    return isinstance(outcome, FrameRejected) and outcome.keyframe_required


def prepare_frames(
    requests: Sequence[pb.FrameRequest],
    decoder: Decoder,
    videos: VideoDecoder | None = None,
) -> list[PreparedFrame | FrameRejected]:
    """Decode every JPEG of `requests` in one decoder call, and every video packet by its
    session in order; a frame or its rejection each.

    `decode_time_ms` of each frame is the wall time of the whole batch decode (the images are
    decoded together, so a share per frame has no meaning).
    """
    outcomes: list[PreparedFrame | FrameRejected | list[tuple[str, bytes]]] = []
    started = time.perf_counter()
    pictures: dict[int, BgrImage] = {}
    for index, request in enumerate(requests):
        try:
            payloads = frame_payloads(request)
        except FrameRejected as exc:
            outcomes.append(exc)
            continue
        if request.HasField("video"):
            picture = decode_video(request, videos)
            if isinstance(picture, FrameRejected):
                outcomes.append(picture)
                continue
            pictures[index] = picture
        outcomes.append(payloads)
    flat = [data for o in outcomes if isinstance(o, list) for _, data in o]
    decoded = iter(decoder.decode_batch(flat) if flat else [])
    decode_time_ms = (time.perf_counter() - started) * 1000.0
    prepared: list[PreparedFrame | FrameRejected] = []
    for index, (request, outcome) in enumerate(zip(requests, outcomes, strict=True)):
        if not isinstance(outcome, list):
            prepared.append(outcome)
            continue
        results = [(name, next(decoded)) for name, _ in outcome]
        errors = [(name, r) for name, r in results if isinstance(r, DecodeError)]
        if errors:
            name, error = errors[0]
            code = grpc.StatusCode.INVALID_ARGUMENT
            prepared.append(FrameRejected(code, f"{name}: {error}"))
            continue
        images = [r for _, r in results if not isinstance(r, DecodeError)]
        if index in pictures:
            images.insert(0, pictures[index])
        prepared.append(assemble_frame(request, images, decode_time_ms))
    return prepared
