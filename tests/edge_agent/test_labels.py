"""The label store: what an escalation and its answer become on disk, bounds and retention."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import cv2
import grpc
import numpy as np
import pytest

from configkit.yaml_loader import ConfigError
from edge_agent.config import EdgeAgentConfig
from edge_agent.config.labels import LabelStoreConfig
from edge_agent.escalation import EscalationResult
from edge_agent.labels import LabelStore, label_images
from edge_agent.labels.store import jpeg_size
from protos.analytics.v1 import analytics_pb2 as pb


def _jpeg(width: int, height: int) -> bytes:
    ok, data = cv2.imencode(".jpg", np.zeros((height, width, 3), np.uint8))
    assert ok
    return bytes(data)


def _box(
    x1: float, y1: float, x2: float, y2: float, score: float = 0.9, **fields: int
) -> pb.Detection:
    return pb.Detection(
        x1=x1, y1=y1, x2=x2, y2=y2, score=score, class_id=0, class_name="person", **fields
    )


def test_whole_frame_boxes_are_mapped_into_the_scaled_image() -> None:
    request = pb.FrameRequest(
        camera_id="door", frame_id=5, jpeg=_jpeg(320, 180), original_width=640, original_height=360
    )
    result = pb.FrameResult(
        detections=[_box(100, 40, 200, 300), _box(600, 300, 700, 400), _box(0, 0, 5, 5, 0.1)]
    )

    (image,) = label_images(request, result, jpeg_size, min_score=0.2)

    assert (image.kind, image.size, image.source_size, image.region) == (
        "frame",
        (320, 180),
        (640, 360),
        None,
    )
    assert [(b["x1"], b["y1"], b["x2"], b["y2"]) for b in image.boxes] == [
        (50.0, 20.0, 100.0, 150.0),
        (300.0, 150.0, 320.0, 180.0),  # clipped to the image
    ]


def test_region_boxes_go_to_their_own_crop_in_its_pixels() -> None:
    request = pb.FrameRequest(
        camera_id="door",
        original_width=640,
        original_height=360,
        regions=[
            pb.Region(x1=100, y1=50, x2=300, y2=250, jpeg=_jpeg(100, 100)),  # scaled 0.5
            pb.Region(x1=400, y1=0, x2=500, y2=100, jpeg=b"not a jpeg"),
        ],
    )
    result = pb.FrameResult(
        detections=[
            _box(120, 60, 220, 160, region_index=0),
            _box(410, 10, 450, 90, region_index=1),
            _box(10, 10, 50, 50),  # a whole-frame box: no whole frame was sent
        ]
    )

    (image,) = label_images(request, result, jpeg_size)  # the undecodable crop is left out

    assert (image.kind, image.size, image.region) == ("region", (100, 100), (100, 50, 300, 250))
    assert [(b["x1"], b["y1"], b["x2"], b["y2"]) for b in image.boxes] == [(10.0, 5.0, 60.0, 55.0)]


def _request(camera: str, frame_id: int) -> pb.FrameRequest:
    stamp = pb.FrameRequest().capture_time
    stamp.FromSeconds(1_790_000_000)
    request = pb.FrameRequest(
        agent_id="box",
        camera_id=camera,
        frame_id=frame_id,
        request_id=f"{camera}/{frame_id}",
        jpeg=_jpeg(64, 48),
        original_width=64,
        original_height=48,
    )
    request.capture_time.CopyFrom(stamp)
    return request


def _answer(
    request: pb.FrameRequest, code: grpc.StatusCode = grpc.StatusCode.OK
) -> EscalationResult:
    result = pb.FrameResult(
        camera_id=request.camera_id,
        frame_id=request.frame_id,
        request_id=request.request_id,
        model_name="cloud",
        model_version="7",
        detections=[_box(8, 8, 32, 40)],
    )
    return EscalationResult(
        request.camera_id, request.frame_id, request.request_id, code, "", result, 0.1
    )


def _wait_for(condition: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_store_writes_answered_frames_of_its_cameras_only(tmp_path: Path) -> None:
    config = LabelStoreConfig(enabled=True, directory=tmp_path / "labels", cameras=["door"])
    store = LabelStore(config, "box", lambda: {"name": "edge", "version": "2", "runtime": "litert"})
    store.start()
    try:
        kept, other, failed = _request("door", 1), _request("yard", 2), _request("door", 3)
        for request in (kept, other, failed):
            store.sent(request)
        store.answered(_answer(kept))
        store.answered(_answer(other))
        store.answered(_answer(failed, grpc.StatusCode.UNAVAILABLE))
        _wait_for(lambda: store.counters.kept_frames == 1)
    finally:
        store.close()

    assert os.stat(config.directory).st_mode & 0o777 == 0o700
    files = sorted(
        p.relative_to(config.directory).as_posix() for p in config.directory.rglob("*.*")
    )
    assert files == ["door/2026-09-21/141320000-f1-0.jpg", "door/2026-09-21/141320000-f1-0.json"]
    document = json.loads((config.directory / files[1]).read_text())
    assert document["schema"] == "edge-labels/v1"
    assert (document["camera"], document["frame_id"], document["agent"]) == ("door", 1, "box")
    assert document["edge_model"] == {"name": "edge", "version": "2", "runtime": "litert"}
    assert document["cloud_model"] == {"name": "cloud", "version": "7"}
    assert document["image"]["width"] == 64 and document["boxes"][0]["x2"] == 32.0


def test_store_is_bounded_and_never_blocks(tmp_path: Path) -> None:
    config = LabelStoreConfig(enabled=True, directory=tmp_path, max_pending=2)
    store = LabelStore(config, "box")  # not started: nothing drains the queue
    requests = [_request("door", i) for i in range(4)]
    for request in requests:
        store.sent(request)
    assert store.counters.dropped == 2  # the table holds max_pending requests
    store.forget(requests[1].request_id)
    store.answered(_answer(requests[0]))
    store.answered(_answer(requests[1]))  # forgotten: nothing to keep
    assert store.counters.dropped == 2


def test_retention_deletes_old_labels_at_start(tmp_path: Path) -> None:
    old = tmp_path / "door" / "2020-01-01" / "000000000-f1-0.json"
    old.parent.mkdir(parents=True)
    old.write_text("{}")
    os.utime(old, (0, 0))
    store = LabelStore(LabelStoreConfig(enabled=True, directory=tmp_path, retention_days=1), "box")
    store.start()
    store.close()
    assert not old.exists() and store.counters.deleted == 1


def _config(labels: dict[str, object], escalation: bool = True) -> dict[str, object]:
    return {
        "agent": {"id": "box"},
        "cameras": [{"name": "door", "url": "rtsp://10.0.0.1/door"}],
        "detector": {"runtime": {"type": "onnxruntime", "model_path": "m.onnx"}},
        "escalation": {"enabled": escalation, "cloud_address": "cloud:50051", "tls": False},
        "labels": labels,
    }


def test_config_checks_the_cameras_named_and_needs_escalation() -> None:
    EdgeAgentConfig.model_validate(_config({"enabled": True, "cameras": ["door"]}))
    assert not EdgeAgentConfig.model_validate(_config({})).labels.enabled  # off by default
    with pytest.raises((ConfigError, ValueError), match="no camera named 'gate'"):
        EdgeAgentConfig.model_validate(_config({"enabled": True, "cameras": ["gate"]}))
    with pytest.raises((ConfigError, ValueError), match="needs escalation.enabled"):
        EdgeAgentConfig.model_validate(_config({"enabled": True}, escalation=False))
