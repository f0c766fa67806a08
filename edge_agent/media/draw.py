"""Draw a camera's zones, lines and tracked boxes on a frame (OpenCV, BGR, a copy).

One drawing for event snapshots, clips and the status page, so they all show the same thing: zones
as translucent polygons with their names, lines with an arrow towards their `in` side, every
tracked box with its track id and label, and an optional highlighted box (the event's object).
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from edge_agent.config.camera import CameraConfig
from edge_agent.rules.geometry import pixel_points

__all__ = ["annotate", "pixel_points"]

Image = npt.NDArray[np.uint8]

_ZONE_BGR = (255, 160, 0)
_LINE_BGR = (0, 200, 255)
_TRACK_BGR = (80, 220, 80)
_UNTRACKED_BGR = (160, 160, 160)
_HIGHLIGHT_BGR = (0, 0, 255)
_ZONE_ALPHA = 0.18
_FONT = cv2.FONT_HERSHEY_SIMPLEX


def _scale(image: Image) -> float:
    """Line and text size for the image: readable on 360p and on 4K alike."""
    return max(0.4, float(min(image.shape[0], image.shape[1])) / 720.0)


def _label(image: Image, text: str, origin: tuple[int, int], colour: tuple[int, int, int]) -> None:
    scale = 0.5 * _scale(image)
    thickness = max(1, round(_scale(image)))
    (width, height), base = cv2.getTextSize(text, _FONT, scale, thickness)
    x = min(max(0, origin[0]), max(0, image.shape[1] - width))
    y = min(max(height + base, origin[1]), image.shape[0] - 1)
    cv2.rectangle(image, (x, y - height - base), (x + width, y), colour, -1)
    cv2.putText(image, text, (x, y - base), _FONT, scale, (0, 0, 0), thickness, cv2.LINE_AA)


def _draw_places(image: Image, camera: CameraConfig) -> None:
    size = (image.shape[1], image.shape[0])
    thickness = max(1, round(2 * _scale(image)))
    overlay = image.copy()
    polygons = []
    for zone in camera.zones:
        polygon = np.round(pixel_points(zone.points, zone.units, size)).astype(np.int32)
        polygons.append((zone.name, polygon))
        cv2.fillPoly(overlay, [polygon], _ZONE_BGR)
    if polygons:
        cv2.addWeighted(overlay, _ZONE_ALPHA, image, 1.0 - _ZONE_ALPHA, 0.0, dst=image)
    for name, polygon in polygons:
        cv2.polylines(image, [polygon], True, _ZONE_BGR, thickness, cv2.LINE_AA)
        top = polygon[np.argmin(polygon[:, 1])]
        _label(image, name, (int(top[0]), int(top[1]) - 2), _ZONE_BGR)
    for line in camera.lines:
        (x1, y1), (x2, y2) = pixel_points(line.points, line.units, size)
        start, end = (round(x1), round(y1)), (round(x2), round(y2))
        cv2.line(image, start, end, _LINE_BGR, thickness, cv2.LINE_AA)
        # the `in` side: `left` of the direction first -> second point, in image coordinates
        # (y down), is the side a positive cross product points to
        mid_x, mid_y = (x1 + x2) / 2.0, (y1 + y2) / 2.0
        dx, dy = x2 - x1, y2 - y1
        length = max(1e-6, float(np.hypot(dx, dy)))
        sign = 1.0 if line.in_side == "left" else -1.0
        nx, ny = sign * dy / length, -sign * dx / length
        reach = 25.0 * _scale(image)
        tip = (round(mid_x + nx * reach), round(mid_y + ny * reach))
        cv2.arrowedLine(image, (round(mid_x), round(mid_y)), tip, _LINE_BGR, thickness)
        _label(image, f"{line.name} (in)", (tip[0] + 3, tip[1]), _LINE_BGR)


def annotate(
    image: Image,
    camera: CameraConfig,
    detections: Detections | None = None,
    class_names: Sequence[str] = (),
    *,
    highlight: Sequence[float] | None = None,
    highlight_text: str | None = None,
) -> Image:
    """A copy of `image` (BGR) with the camera's zones and lines, the `detections` (tracked ones
    with `#id label`, untracked ones thin and grey) and the `highlight` box (x1, y1, x2, y2 px)
    drawn, with `highlight_text` above it."""
    out = np.ascontiguousarray(image).copy()
    _draw_places(out, camera)
    thickness = max(1, round(2 * _scale(out)))
    if detections is not None:
        for box, class_id, track_id in zip(
            detections.xyxy, detections.class_id, detections.tracker_id, strict=True
        ):
            x1, y1, x2, y2 = (round(float(v)) for v in box)
            tracked = int(track_id) >= 0
            colour = _TRACK_BGR if tracked else _UNTRACKED_BGR
            cv2.rectangle(out, (x1, y1), (x2, y2), colour, thickness if tracked else 1)
            if tracked:
                name = class_names[class_id] if 0 <= class_id < len(class_names) else str(class_id)
                _label(out, f"#{int(track_id)} {name}", (x1, y1 - 2), colour)
    if highlight is not None:
        x1, y1, x2, y2 = (round(float(v)) for v in highlight)
        cv2.rectangle(out, (x1, y1), (x2, y2), _HIGHLIGHT_BGR, 2 * thickness)
        if highlight_text:
            _label(out, highlight_text, (x1, y1 - 2 * thickness), _HIGHLIGHT_BGR)
    return out
