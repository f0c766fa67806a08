"""JPEG encoding of escalated frames and regions, and `FrameRequest` building (analytics.v1)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import cv2
import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from edge_agent.escalation.policy import EscalationDecision
from edge_agent.escalation.roi import Box
from edge_agent.escalation.uplink import EncodedPacket
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.timestamps import timestamp_from_seconds

logger = logging.getLogger(__name__)


BgrImage = npt.NDArray[np.uint8]


class EncodeError(ValueError):
    """An image could not be JPEG-encoded (empty, wrong shape)."""


def encode_jpeg(image: BgrImage, quality: int) -> bytes:
    """`image` (BGR or grey, uint8) as a JPEG of `quality` (1-100)."""
    if not 1 <= quality <= 100:
        raise ValueError(f"JPEG quality must be in 1..100, got {quality}")
    if image.size == 0 or image.ndim not in (2, 3):
        raise EncodeError(f"cannot encode an image of shape {image.shape}")
    ok, buffer = cv2.imencode(".jpg", image, [int(cv2.IMWRITE_JPEG_QUALITY), int(quality)])
    if not ok:
        raise EncodeError(f"OpenCV failed to encode an image of shape {image.shape}")
    return bytes(buffer.tobytes())


def crop(image: BgrImage, box: Box) -> BgrImage:
    """The pixels of `image` inside `box` (whole-pixel edges, clipped to the image)."""
    height, width = image.shape[:2]
    x1, y1 = max(0, int(box[0])), max(0, int(box[1]))
    x2, y2 = min(width, int(np.ceil(box[2]))), min(height, int(np.ceil(box[3])))
    return image[y1:y2, x1:x2]


def build_frame_request(
    image: BgrImage,
    *,
    agent_id: str,
    camera_id: str,
    frame_id: int,
    capture_time_s: float,
    jpeg_quality: int,
    regions: Sequence[Box] = (),
    region_jpeg_quality: int | None = None,
    deadline_s: float | None = None,
    request_id: str = "",
    video: EncodedPacket | None = None,
) -> pb.FrameRequest:
    """A `FrameRequest` for `image`: the whole frame, or only JPEG crops of `regions`.

    With `video` (the whole frame already encoded by the camera's uplink encoder) the whole
    frame goes as that packet instead of a JPEG. Times are POSIX seconds (wall clock). Region
    boxes are in `image` pixels, which are the source pixels: the request states the original
    size so the cloud maps boxes back.
    """
    height, width = image.shape[:2]
    request = pb.FrameRequest(
        agent_id=agent_id,
        camera_id=camera_id,
        frame_id=frame_id,
        request_id=request_id or f"{agent_id}/{camera_id}/{frame_id}",
        original_width=width,
        original_height=height,
    )
    request.capture_time.CopyFrom(timestamp_from_seconds(capture_time_s))
    if deadline_s is not None:
        request.deadline.CopyFrom(timestamp_from_seconds(deadline_s))
    if video is not None:
        if regions:
            raise ValueError("a video packet carries a whole frame: no regions with it")
        request.video.CopyFrom(
            pb.VideoPacket(
                codec=video.codec,
                data=video.data,
                keyframe=video.keyframe,
                session=video.session,
                sequence=video.sequence,
                width=video.width,
                height=video.height,
            )
        )
        return request
    if not regions:
        request.jpeg = encode_jpeg(image, jpeg_quality)
        request.jpeg_quality = jpeg_quality
        return request
    quality = region_jpeg_quality if region_jpeg_quality is not None else jpeg_quality
    request.jpeg_quality = quality
    for box in regions:
        pixels = crop(image, box)
        if pixels.size == 0:
            raise EncodeError(f"region {box} is outside the {width}x{height} frame")
        x1, y1 = max(0, int(box[0])), max(0, int(box[1]))
        request.regions.append(
            pb.Region(
                x1=float(x1),
                y1=float(y1),
                x2=float(x1 + pixels.shape[1]),
                y2=float(y1 + pixels.shape[0]),
                jpeg=encode_jpeg(pixels, quality),
            )
        )
    return request


def request_for_decision(
    image: BgrImage,
    decision: EscalationDecision,
    *,
    agent_id: str,
    camera_id: str,
    frame_id: int,
    capture_time_s: float,
    jpeg_quality: int,
    region_jpeg_quality: int,
    deadline_s: float | None = None,
    video: EncodedPacket | None = None,
) -> pb.FrameRequest:
    """The request a policy decision calls for: the whole frame (JPEG, or `video`'s packet)
    or the decision's regions."""
    return build_frame_request(
        image,
        agent_id=agent_id,
        camera_id=camera_id,
        frame_id=frame_id,
        capture_time_s=capture_time_s,
        jpeg_quality=jpeg_quality,
        regions=decision.regions,
        region_jpeg_quality=region_jpeg_quality,
        deadline_s=deadline_s,
        video=video,
    )


def payload_bytes(request: pb.FrameRequest) -> int:
    """Image bytes a request carries (whole frame as JPEG or video, plus regions), as the
    budget counts them."""
    whole = len(request.jpeg) + len(request.video.data)
    return whole + sum(len(region.jpeg) for region in request.regions)


def payload_pixels(request: pb.FrameRequest) -> int:
    """Source pixels a request's image payload covers, for `EscalationPolicy.record_encoded`."""
    if request.jpeg or request.HasField("video"):
        return int(request.original_width * request.original_height)
    return int(sum((r.x2 - r.x1) * (r.y2 - r.y1) for r in request.regions))


def detections_from_result(result: pb.FrameResult, class_names: Sequence[str]) -> Detections:
    """The cloud's detections of `result` in the edge's class ids.

    A detection is mapped by its `class_name` when the edge knows the name, else kept by id;
    names the edge does not know are dropped (the models disagree on that class).
    """
    index = {name: i for i, name in enumerate(class_names)}
    rows: list[tuple[float, float, float, float, float, int]] = []
    for d in result.detections:
        if d.class_name:
            if d.class_name not in index:
                continue
            class_id = index[d.class_name]
        else:
            class_id = int(d.class_id)
        rows.append((d.x1, d.y1, d.x2, d.y2, d.score, class_id))
    if not rows:
        return Detections.empty()
    array = np.array(rows, dtype=np.float32)
    return Detections(array[:, :4], array[:, 4], array[:, 5].astype(np.int64))
