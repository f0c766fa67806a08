"""Pure conversions between `Detections`, timestamps, status codes and the analytics.v1 messages.

Shared by the cloud (filling results) and the edge (reading them); no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import grpc
import numpy as np

from detection.detections import Detections
from protos.analytics.v1 import analytics_pb2 as pb

_CODES_BY_VALUE: dict[int, grpc.StatusCode] = {int(code.value[0]): code for code in grpc.StatusCode}


def detections_to_proto(
    detections: Detections,
    class_names: Sequence[str] = (),
    region_index: int | None = None,
) -> list[pb.Detection]:
    """One `Detection` message per box; `class_names[class_id]` names it (empty if out of range).

    `region_index` marks boxes found in `FrameRequest.regions[region_index]`; None: whole frame.
    """
    messages: list[pb.Detection] = []
    for xyxy, score, class_id, _track in detections:
        message = pb.Detection(
            x1=float(xyxy[0]),
            y1=float(xyxy[1]),
            x2=float(xyxy[2]),
            y2=float(xyxy[3]),
            score=score,
            class_id=class_id,
            class_name=class_names[class_id] if class_id < len(class_names) else "",
        )
        if region_index is not None:
            message.region_index = region_index
        messages.append(message)
    return messages


def detections_from_proto(messages: Iterable[pb.Detection]) -> Detections:
    """A `Detections` batch (no track ids) from `Detection` messages, in the same order."""
    items = list(messages)
    if not items:
        return Detections.empty()
    return Detections(
        xyxy=np.array([[d.x1, d.y1, d.x2, d.y2] for d in items], dtype=np.float32),
        confidence=np.array([d.score for d in items], dtype=np.float32),
        class_id=np.array([d.class_id for d in items], dtype=np.int64),
    )


def status_to_proto(code: grpc.StatusCode, message: str = "") -> pb.ResultStatus:
    """A per-frame `ResultStatus` carrying the numeric value of a gRPC status code."""
    return pb.ResultStatus(code=int(code.value[0]), message=message)


def status_code_from_proto(status: pb.ResultStatus) -> grpc.StatusCode:
    """The gRPC status code of a `ResultStatus`; values gRPC does not define map to UNKNOWN."""
    return _CODES_BY_VALUE.get(status.code, grpc.StatusCode.UNKNOWN)


def map_to_source(
    detections: Detections,
    *,
    scale_x: float,
    scale_y: float,
    offset_x: float = 0.0,
    offset_y: float = 0.0,
    source_width: float,
    source_height: float,
) -> Detections:
    """Boxes from image pixels to source-frame pixels: `offset + xy * scale`, clipped to the frame.

    Used for a downscaled whole-frame JPEG (offset 0) and for region crops (offset = region origin).
    """
    if len(detections) == 0:
        return detections
    xyxy = detections.xyxy.astype(np.float64)
    xyxy[:, [0, 2]] = offset_x + xyxy[:, [0, 2]] * scale_x
    xyxy[:, [1, 3]] = offset_y + xyxy[:, [1, 3]] * scale_y
    xyxy[:, [0, 2]] = np.clip(xyxy[:, [0, 2]], 0.0, source_width)
    xyxy[:, [1, 3]] = np.clip(xyxy[:, [1, 3]], 0.0, source_height)
    return Detections(
        xyxy.astype(np.float32), detections.confidence, detections.class_id, detections.tracker_id
    )
