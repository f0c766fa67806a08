"""The edge label store's file format (`edge-labels/v1`): written by the agent, read for training.

The agent (`edge_agent.labels`) keeps every escalated image it sent with the cloud's answer as
`<camera>/<YYYY-MM-DD>/<HHMMSSmmm>-f<frame>-<n>.jpg` and a `.json` document beside it; the
toolchain (`vision-toolchain distill`) reads them back with `read_camera_records`. A document::

    {"schema": "edge-labels/v1", "agent": "box-1", "camera": "door", "frame_id": 812,
     "request_id": "door/812", "capture_time": "2026-12-02T10:00:00.000Z",
     "image": {"file": "100000000-f812-0.jpg", "kind": "frame", "width": 640, "height": 360,
               "source_width": 640, "source_height": 360, "region": null},
     "edge_model": {"name": ..., "version": ..., "runtime": ...},
     "cloud_model": {"name": ..., "version": ...},
     "boxes": [{"class_id": 0, "class_name": "person", "score": 0.91,
                "x1": 10.0, "y1": 20.0, "x2": 50.0, "y2": 120.0}]}

Boxes are in the image's own pixels. Pure: parsing and validation, no images decoded.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from detection.errors import DetectionError

__all__ = [
    "SCHEMA",
    "LabelFormatError",
    "LabelRecord",
    "parse_record",
    "read_camera_records",
]

logger = logging.getLogger(__name__)

SCHEMA = "edge-labels/v1"
_BOX_KEYS = ("x1", "y1", "x2", "y2")


class LabelFormatError(DetectionError, ValueError):
    """A label folder is missing or empty, or a document is not an `edge-labels/v1` record."""


@dataclass(frozen=True)
class LabelRecord:
    """One kept image and the cloud's boxes for it (`xyxy` in its pixels, `class_id`, `score`)."""

    image: Path
    camera: str
    capture_s: float
    frame_id: int
    kind: str  # "frame" or "region"
    size: tuple[int, int]  # (width, height)
    xyxy: npt.NDArray[np.float32]
    class_id: npt.NDArray[np.int64]
    score: npt.NDArray[np.float32]
    class_names: dict[int, str]
    edge_model: dict[str, str]
    cloud_model: dict[str, str]


def _field(document: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = document.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise LabelFormatError(f"{where}: `{key}` is missing or not a {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _capture_seconds(text: str, where: str) -> float:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise LabelFormatError(f"{where}: capture_time {text!r} is not an ISO 8601 time") from None


def _boxes(
    items: list[Any], size: tuple[int, int], where: str
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64], npt.NDArray[np.float32], dict[int, str]]:
    width, height = size
    xyxy: list[list[float]] = []
    classes: list[int] = []
    scores: list[float] = []
    names: dict[int, str] = {}
    for number, box in enumerate(items):
        here = f"{where}: boxes[{number}]"
        if not isinstance(box, dict):
            raise LabelFormatError(f"{here} is not an object")
        coords = [_field(box, key, (int, float), here) for key in _BOX_KEYS]
        class_id = _field(box, "class_id", int, here)
        score = float(_field(box, "score", (int, float), here))
        x1, y1, x2, y2 = (float(v) for v in coords)
        inside = 0.0 <= x1 < x2 <= width and 0.0 <= y1 < y2 <= height
        if class_id < 0 or not 0.0 <= score <= 1.0 or not inside:
            raise LabelFormatError(
                f"{here}: class {class_id}, score {score}, box {coords} outside a "
                f"{width}x{height} image or out of range"
            )
        if isinstance(box.get("class_name"), str):
            names[class_id] = box["class_name"]
        xyxy.append([x1, y1, x2, y2])
        classes.append(class_id)
        scores.append(score)
    return (
        np.asarray(xyxy, np.float32).reshape(-1, 4),
        np.asarray(classes, np.int64),
        np.asarray(scores, np.float32),
        names,
    )


def _strings(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def parse_record(document: Any, json_path: Path) -> LabelRecord:
    """The record of one `.json` document (its image beside it); `LabelFormatError` if invalid."""
    where = str(json_path)
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise LabelFormatError(f"{where}: not an {SCHEMA} document")
    image = _field(document, "image", dict, where)
    file = _field(image, "file", str, f"{where}: image")
    if Path(file).name != file:
        raise LabelFormatError(f"{where}: image file {file!r} must be a name in the same folder")
    size = (_field(image, "width", int, where), _field(image, "height", int, where))
    if min(size) < 1:
        raise LabelFormatError(f"{where}: image size {size} must be positive")
    xyxy, class_id, score, names = _boxes(_field(document, "boxes", list, where), size, where)
    return LabelRecord(
        image=json_path.with_name(file),
        camera=_field(document, "camera", str, where),
        capture_s=_capture_seconds(_field(document, "capture_time", str, where), where),
        frame_id=_field(document, "frame_id", int, where),
        kind=str(image.get("kind", "frame")),
        size=size,
        xyxy=xyxy,
        class_id=class_id,
        score=score,
        class_names=names,
        edge_model=_strings(document.get("edge_model")),
        cloud_model=_strings(document.get("cloud_model")),
    )


@dataclass(frozen=True)
class CameraRecords:
    """The valid records of one camera, oldest first, and the documents that were skipped."""

    records: tuple[LabelRecord, ...]
    skipped: tuple[str, ...]  # one line each: which file and why


def read_camera_records(directory: Path, camera: str) -> CameraRecords:
    """Every record of `camera` under the store's `directory`, sorted by capture time.

    A document that is not valid JSON, not an `edge-labels/v1` record, or whose image is missing
    is skipped with its reason (a half-deleted pair after retention must not stop training);
    a folder without any valid record is a `LabelFormatError`.
    """
    folder = Path(directory) / camera
    if not folder.is_dir():
        raise LabelFormatError(f"no label folder for camera {camera!r}: {folder} does not exist")
    records: list[LabelRecord] = []
    skipped: list[str] = []
    for path in sorted(folder.glob("*/*.json")):
        try:
            record = parse_record(json.loads(path.read_text(encoding="utf-8")), path)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            skipped.append(f"{path}: unreadable: {exc}")
            continue
        except LabelFormatError as exc:
            skipped.append(str(exc))
            continue
        if not record.image.is_file():
            skipped.append(f"{path}: image {record.image.name} is missing")
            continue
        records.append(record)
    for line in skipped:
        logger.warning("label store: skipped %s", line)
    if not records:
        raise LabelFormatError(
            f"{folder} holds no valid {SCHEMA} record ({len(skipped)} skipped)"
            + (f"; first: {skipped[0]}" if skipped else "")
        )
    records.sort(key=lambda r: (r.capture_s, r.frame_id, r.image.name))
    return CameraRecords(records=tuple(records), skipped=tuple(skipped))
