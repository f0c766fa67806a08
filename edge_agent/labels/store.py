"""`LabelStore`: escalated frames and the cloud's answers written to disk, off the frame loop.

The escalation encoder tells the store what it `sent`; the frame loop tells it what came
`answered`. Requests wait for their answer in a bounded table (`max_pending`); an answered pair
goes to a writer thread through a bounded queue. Whatever does not fit is counted in `dropped`
and never blocks either thread. The writer turns a pair into images and labels
(`labels.records`), writes each as `<camera>/<YYYY-MM-DD>/<HHMMSSmmm>-f<frame>-<n>.jpg` + `.json`
(atomically: a reader never sees half a file) and applies retention (`media.retention.sweep`)
every `SWEEP_EVERY_WRITES` writes and at start.

Document (`.json`, schema `edge-labels/v1`)::

    {"schema": "edge-labels/v1", "agent": "box-1", "camera": "door", "frame_id": 812,
     "request_id": "door/812", "capture_time": "2026-12-02T10:00:00.000Z",
     "image": {"file": "100000000-f812-0.jpg", "kind": "frame", "width": 640, "height": 360,
               "source_width": 640, "source_height": 360, "region": null},
     "edge_model": {"name": "edge-yolov5n-320-int8", "version": "1", "runtime": "litert"},
     "cloud_model": {"name": "cloud-yolov5s-640", "version": "3"},
     "boxes": [{"class_id": 0, "class_name": "person", "score": 0.91,
                "x1": 10.0, "y1": 20.0, "x2": 50.0, "y2": 120.0}]}

Boxes are in the image's own pixels; `region` (source-frame pixels) says where a region crop
came from.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import cv2
import numpy as np

from detection.label_format import SCHEMA
from edge_agent.alerts.payload import iso_utc
from edge_agent.config.labels import LabelStoreConfig
from edge_agent.escalation import EscalationResult
from edge_agent.labels.records import LabelImage, Size, label_images
from edge_agent.media.files import write_atomic
from edge_agent.media.paths import safe_component
from edge_agent.media.retention import sweep
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.timestamps import timestamp_to_seconds

logger = logging.getLogger(__name__)

SWEEP_EVERY_WRITES = 50
_DAY_S = 86_400.0


def jpeg_size(data: bytes) -> Size | None:
    """(width, height) of a JPEG, by decoding it; None when it does not decode."""
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if image is None:
        return None
    return (int(image.shape[1]), int(image.shape[0]))


@dataclass
class LabelCounters:
    """What the store did."""

    kept_frames: int = 0
    kept_images: int = 0
    dropped: int = 0  # not kept: table or queue full
    failed: int = 0  # a write failed (disk full, permissions)
    deleted: int = 0  # removed by retention


@dataclass(frozen=True)
class _Answered:
    request: pb.FrameRequest
    result: pb.FrameResult
    edge_model: Mapping[str, str]


class LabelStore:
    """Keeps escalated frames with the cloud's answers (see the module docstring)."""

    def __init__(
        self,
        config: LabelStoreConfig,
        agent_id: str,
        edge_model: Callable[[], Mapping[str, str]] = dict,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.agent_id = agent_id
        self.counters = LabelCounters()
        self._edge_model = edge_model
        self._clock = clock
        self._cameras = frozenset(config.cameras)
        self._lock = threading.Lock()
        self._pending: collections.OrderedDict[str, pb.FrameRequest] = collections.OrderedDict()
        self._queue: queue.Queue[_Answered | None] = queue.Queue(maxsize=config.max_pending)
        self._writer: threading.Thread | None = None
        self._writes = 0

    def wants(self, camera: str) -> bool:
        """Whether frames of `camera` are kept."""
        return not self._cameras or camera in self._cameras

    def sent(self, request: pb.FrameRequest) -> None:
        """An escalation is going out (call before sending it: its answer may come back before
        the sender returns); the answer comes through `answered` (any thread)."""
        if not self.wants(request.camera_id):
            return
        with self._lock:
            if len(self._pending) >= self.config.max_pending:
                self.counters.dropped += 1
                return
            self._pending[request.request_id] = request

    def set_edge_model(self, edge_model: Callable[[], Mapping[str, str]]) -> None:
        """Where the edge model's identity comes from (it changes with a model swap)."""
        self._edge_model = edge_model

    def forget(self, request_id: str) -> None:
        """A request announced by `sent` did not go out after all."""
        with self._lock:
            self._pending.pop(request_id, None)

    def answered(self, result: EscalationResult) -> None:
        """An escalation came back (or failed); an answer with detections is queued to write."""
        with self._lock:
            request = self._pending.pop(result.request_id, None)
        if request is None or not result.ok or result.result is None:
            return
        item = _Answered(request, result.result, dict(self._edge_model()))
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            with self._lock:
                self.counters.dropped += 1

    def start(self) -> None:
        """Create the folder (owner-only), apply retention once and start the writer thread."""
        self.config.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.config.directory, 0o700)
        self._sweep()
        self._writer = threading.Thread(target=self._run, name="label-store", daemon=True)
        self._writer.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (up to `timeout_s`) and stop the writer."""
        if self._writer is None:
            return
        self._queue.put(None)
        self._writer.join(timeout_s)
        self._writer = None

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._write(item)
            except OSError as exc:  # a full or read-only disk loses this pair, not the agent
                with self._lock:
                    self.counters.failed += 1
                logger.warning("label store: cannot write frame %s: %s", item.request.frame_id, exc)

    def _write(self, item: _Answered) -> None:
        request, result = item.request, item.result
        images = label_images(request, result, jpeg_size, min_score=self.config.min_score)
        if not images:
            return
        capture_s = (
            timestamp_to_seconds(request.capture_time)
            if request.HasField("capture_time")
            else self._clock()
        )
        stamp = time.gmtime(capture_s)
        folder = (
            self.config.directory
            / safe_component(request.camera_id)
            / time.strftime("%Y-%m-%d", stamp)
        )
        millis = int(round((capture_s % 1.0) * 1000)) % 1000
        stem = f"{time.strftime('%H%M%S', stamp)}{millis:03d}-f{request.frame_id}"
        for number, image in enumerate(images):
            name = f"{stem}-{number}"
            write_atomic(folder / f"{name}.jpg", image.jpeg)
            document = self._document(item, image, f"{name}.jpg", capture_s)
            write_atomic(folder / f"{name}.json", json.dumps(document, indent=1).encode())
        with self._lock:
            self.counters.kept_frames += 1
            self.counters.kept_images += len(images)
        self._writes += 1
        if self._writes % SWEEP_EVERY_WRITES == 0:
            self._sweep()

    def _document(
        self, item: _Answered, image: LabelImage, file: str, capture_s: float
    ) -> dict[str, object]:
        request, result = item.request, item.result
        return {
            "schema": SCHEMA,
            "agent": self.agent_id,
            "camera": request.camera_id,
            "frame_id": request.frame_id,
            "request_id": request.request_id,
            "capture_time": iso_utc(capture_s),
            "image": {
                "file": file,
                "kind": image.kind,
                "width": image.size[0],
                "height": image.size[1],
                "source_width": image.source_size[0],
                "source_height": image.source_size[1],
                "region": list(image.region) if image.region is not None else None,
            },
            "edge_model": dict(item.edge_model),
            "cloud_model": {"name": result.model_name, "version": result.model_version},
            "boxes": list(image.boxes),
        }

    def _sweep(self) -> None:
        config = self.config
        done = sweep(
            config.directory,
            self._clock(),
            config.retention_days * _DAY_S,
            int(config.max_disk_mb * 1024 * 1024),
        )
        if done.deleted:
            with self._lock:
                self.counters.deleted += done.deleted
            logger.info(
                "label store: retention deleted %d file(s), %d bytes",
                done.deleted,
                done.deleted_bytes,
            )
