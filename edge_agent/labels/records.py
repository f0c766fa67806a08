"""From one escalation (the request sent, the cloud's answer) to the images and labels to keep.

Pure: no files, no clock. An escalation sent either the whole frame (possibly scaled down) or
region crops; each image sent becomes one `LabelImage` with the cloud's boxes for it mapped from
source-frame pixels (what the cloud answers) into that image's own pixels, clipped to it. Boxes
found in a region belong to that region's image only (`Detection.region_index`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from protos.analytics.v1 import analytics_pb2 as pb

Size = tuple[int, int]  # (width, height)
SizeOf = Callable[[bytes], Size | None]


@dataclass(frozen=True)
class LabelImage:
    """One image that was sent, with the cloud's boxes in its pixels."""

    jpeg: bytes
    kind: str  # "frame" or "region"
    size: Size
    source_size: Size
    region: tuple[float, float, float, float] | None  # in source-frame pixels
    boxes: tuple[dict[str, object], ...]


def _source_size(request: pb.FrameRequest, frame_size: Size | None) -> Size | None:
    if request.original_width and request.original_height:
        return (request.original_width, request.original_height)
    return frame_size


def _mapped(
    detection: pb.Detection, origin: tuple[float, float], scale: tuple[float, float], size: Size
) -> dict[str, object] | None:
    (ox, oy), (sx, sy), (w, h) = origin, scale, size
    x1 = min(max((detection.x1 - ox) * sx, 0.0), float(w))
    y1 = min(max((detection.y1 - oy) * sy, 0.0), float(h))
    x2 = min(max((detection.x2 - ox) * sx, 0.0), float(w))
    y2 = min(max((detection.y2 - oy) * sy, 0.0), float(h))
    if x2 - x1 < 1.0 or y2 - y1 < 1.0:
        return None
    return {
        "class_id": detection.class_id,
        "class_name": detection.class_name,
        "score": round(float(detection.score), 4),
        "x1": round(x1, 1),
        "y1": round(y1, 1),
        "x2": round(x2, 1),
        "y2": round(y2, 1),
    }


def _boxes(
    detections: Sequence[pb.Detection],
    origin: tuple[float, float],
    scale: tuple[float, float],
    size: Size,
) -> tuple[dict[str, object], ...]:
    mapped = (_mapped(d, origin, scale, size) for d in detections)
    return tuple(box for box in mapped if box is not None)


def label_images(
    request: pb.FrameRequest, result: pb.FrameResult, size_of: SizeOf, *, min_score: float = 0.0
) -> list[LabelImage]:
    """The images of `request` with `result`'s boxes (score >= `min_score`) in their pixels.

    `size_of` reads a JPEG's (width, height), None when it cannot; such an image is left out.
    """
    kept = [d for d in result.detections if d.score >= min_score]
    images: list[LabelImage] = []
    if request.jpeg:
        size = size_of(request.jpeg)
        source = _source_size(request, size)
        if size is not None and source is not None:
            scale = (size[0] / source[0], size[1] / source[1])
            whole = [d for d in kept if not d.HasField("region_index")]
            boxes = _boxes(whole, (0.0, 0.0), scale, size)
            images.append(LabelImage(request.jpeg, "frame", size, source, None, boxes))
    for index, region in enumerate(request.regions):
        size = size_of(region.jpeg)
        source = _source_size(request, None)
        width, height = region.x2 - region.x1, region.y2 - region.y1
        if size is None or source is None or width <= 0 or height <= 0:
            continue
        scale = (size[0] / width, size[1] / height)
        mine = [d for d in kept if d.HasField("region_index") and d.region_index == index]
        boxes = _boxes(mine, (region.x1, region.y1), scale, size)
        rect = (region.x1, region.y1, region.x2, region.y2)
        images.append(LabelImage(region.jpeg, "region", size, source, rect, boxes))
    return images
