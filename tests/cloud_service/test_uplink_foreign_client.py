"""The video uplink as a stranger uses it: frames encoded by the Debian `ffmpeg` command (not the
agent's encoder), sent by a Node @grpc/grpc-js client built from `analytics.proto` at run time, to
the real servicer on loopback."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import av
import grpc
import numpy as np
import numpy.typing as npt
import pytest

from cloud_service.decoders.video import VideoSessions
from cloud_service.processor import DetectorFrameProcessor
from detection.detections import Detections
from tests.edge_agent.test_uplink import scene
from tests.fixtures.grpc_server import FAKE_MODEL, RecordingDetector, ServerFactory

pytestmark = pytest.mark.process  # ffmpeg and node

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "tests" / "foreign" / "uplink_client.mjs"
PROTO = REPO / "protos" / "analytics" / "v1" / "analytics.proto"
NODE_MODULES = REPO / ".cache" / "node-grpc"
PACKAGES = ("@grpc/grpc-js@1", "@grpc/proto-loader@0.7")
FRAMES = 6
WIDTH, HEIGHT = 320, 240


@pytest.fixture(scope="session")
def node_grpc() -> Path:
    """`node_modules` with @grpc/grpc-js and @grpc/proto-loader (installed once from npm)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js is not installed (the foreign gRPC client runs on it)")
    if not (NODE_MODULES / "node_modules" / "@grpc" / "grpc-js").is_dir():
        NODE_MODULES.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix",
             str(NODE_MODULES), *PACKAGES],
            check=True,
            timeout=300,
        )  # fmt: skip
    return NODE_MODULES / "node_modules"


def ffmpeg_access_units() -> list[bytes]:
    """The scene's frames as H.264 access units made by the `ffmpeg` command (libx264, low
    latency, parameter sets on keyframes), split by FFmpeg's parser."""
    if shutil.which("ffmpeg") is None:
        pytest.skip("the ffmpeg command is not installed")
    raw = b"".join(scene(i, WIDTH, HEIGHT).tobytes() for i in range(FRAMES))
    stream = subprocess.run(
        ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error",
         "-f", "rawvideo", "-pix_fmt", "bgr24", "-s", f"{WIDTH}x{HEIGHT}", "-r", "2", "-i", "-",
         "-c:v", "libx264", "-preset", "veryfast", "-tune", "zerolatency", "-bf", "0",
         "-x264-params", "keyint=1000:scenecut=0:repeat-headers=1", "-pix_fmt", "yuv420p",
         "-f", "h264", "-"],
        input=raw,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout  # fmt: skip
    parser = av.CodecContext.create("h264", "r")
    units = [bytes(p) for p in parser.parse(stream) + parser.parse(b"")]
    assert len(units) == FRAMES
    return units


def run_client(node_grpc: Path, target: str, document: list[dict[str, object]]) -> Any:
    """Run the Node client on `document` (the units to send) against `target`; its answer."""
    include = Path(str(resources.files("grpc_tools") / "_proto"))  # google/protobuf/*.proto
    completed = subprocess.run(
        ["node", str(CLIENT), str(node_grpc), str(PROTO), str(include), target],
        input=json.dumps(document),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_a_node_client_sends_ffmpeg_h264_and_the_cloud_sees_the_frames(
    grpc_server_factory: ServerFactory, node_grpc: Path
) -> None:
    units = ffmpeg_access_units()
    detector = RecordingDetector()
    processor = DetectorFrameProcessor(detector, FAKE_MODEL, videos=VideoSessions())
    server = grpc_server_factory(processor, servicer_kwargs={"uplink_codecs": ("h264", "hevc")})
    # frames 0-3 in order, then frame 5: packet 4 never sent, so 5 cannot be decoded
    sent = [0, 1, 2, 3, 5]
    document = [
        {
            "frame_id": i,
            "keyframe": i == 0,
            "sequence": i,
            "session": "ffmpeg-1",
            "width": WIDTH,
            "height": HEIGHT,
            "data": base64.b64encode(units[i]).decode(),
        }
        for i in sent
    ]
    answer = run_client(node_grpc, server.target, document)
    assert answer["codecs"] == ["h264,hevc"]
    by_frame = {r["frame_id"]: r for r in answer["results"]}
    assert sorted(by_frame) == sent
    assert all(by_frame[i]["code"] == 0 and by_frame[i]["detections"] == 2 for i in range(4))
    gap = by_frame[5]
    assert gap["code"] == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert gap["keyframe_required"] and "send a keyframe" in gap["message"]
    assert len(detector.images) == 4
    for index, image in enumerate(detector.images):
        assert image.shape == (HEIGHT, WIDTH, 3)
        assert np.abs(image.astype(int) - scene(index, WIDTH, HEIGHT)).mean() < 8.0


class SlowFirstDetector(RecordingDetector):
    """A cloud busy with its first frame for `hold_s` (the queue fills behind it)."""

    def __init__(self, hold_s: float) -> None:
        super().__init__()
        self.hold_s = hold_s

    def detect(self, images: Sequence[npt.NDArray[np.uint8]]) -> list[Detections]:
        if not self.calls:
            time.sleep(self.hold_s)
        return super().detect(images)


def test_a_node_clients_packet_that_expires_in_the_queue_does_not_break_its_session(
    grpc_server_factory: ServerFactory, node_grpc: Path
) -> None:
    """Packet 1 comes 200 ms after packet 0, with a 100 ms deadline, and waits behind packet 0's
    1 s detection with the rest (10 s deadlines): it is answered
    DEADLINE_EXCEEDED without `keyframe_required`, and packets 2-5 of the same session are
    answered, because the server decoded packet 1 all the same."""
    units = ffmpeg_access_units()
    detector = SlowFirstDetector(hold_s=1.0)
    processor = DetectorFrameProcessor(detector, FAKE_MODEL, videos=VideoSessions())
    server = grpc_server_factory(processor, servicer_kwargs={"uplink_codecs": ("h264",)})
    document: list[dict[str, object]] = [
        {
            "frame_id": i,
            "keyframe": i == 0,
            "sequence": i,
            "session": "ffmpeg-2",
            "width": WIDTH,
            "height": HEIGHT,
            "data": base64.b64encode(units[i]).decode(),
            "deadline_ms": 10_000,
        }
        for i in range(FRAMES)
    ]
    document[1].update(after_ms=200, deadline_ms=100)  # queued behind frame 0's batch
    answer = run_client(node_grpc, server.target, document)
    by_frame = {r["frame_id"]: r for r in answer["results"]}
    late = by_frame[1]
    assert late["code"] == grpc.StatusCode.DEADLINE_EXCEEDED.value[0], late
    assert not late["keyframe_required"]
    assert all(by_frame[i]["code"] == 0 and by_frame[i]["detections"] == 2 for i in (0, 2, 3, 4, 5))
    assert len(detector.images) == FRAMES - 1
    for index, image in zip((0, 2, 3, 4, 5), detector.images, strict=True):
        assert np.abs(image.astype(int) - scene(index, WIDTH, HEIGHT)).mean() < 8.0
