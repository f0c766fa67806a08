"""`cloud-service serve` as a process: loads the engine, answers over gRPC, drains on SIGTERM."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import numpy as np
import numpy.typing as npt
import pytest
import simplejpeg

from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub
from tests.fixtures.cloud_process import REPO_ROOT, CloudProcess, serve_command
from tests.fixtures.processes import free_tcp_port

pytestmark = pytest.mark.process  # cloud-service serve as a child process

STARTUP_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 15.0

CONFIG = """\
server:
  listen_address: 127.0.0.1:{port}
  grace_period_s: 2
batching:
  max_batch_size: 4
engine:
  runtime:
    type: onnxruntime
    model_path: {model}
  confidence_threshold: 0.0
  max_detections: 10
  input_size: [320, 320]
model_name: yolov5s-random
model_version: test
metrics:
  listen_port: 0
"""


def test_serve_answers_frames_and_drains_on_sigterm(
    tmp_path: Path, yolov5s_onnx: Path, bus_image: npt.NDArray[np.uint8]
) -> None:
    config = tmp_path / "cloud.yaml"
    config.write_text(CONFIG.format(port=free_tcp_port(), model=yolov5s_onnx))
    cloud = CloudProcess(config, tmp_path)
    cloud.start(STARTUP_TIMEOUT_S)
    process = cloud.process
    try:
        with grpc.insecure_channel(cloud.address) as channel:
            jpeg = simplejpeg.encode_jpeg(np.ascontiguousarray(bus_image), colorspace="BGR")
            request = pb.FrameRequest(
                agent_id="agent",
                camera_id="cam",
                frame_id=7,
                jpeg=jpeg,
                original_width=810,
                original_height=1080,
            )
            result = InferenceServiceStub(channel).DetectFrame(request, timeout=30)
        assert result.status.code == grpc.StatusCode.OK.value[0]
        assert (result.frame_id, result.model_name) == (7, "yolov5s-random")
        assert 0 < len(result.detections) <= 10
        assert all(
            0 <= d.x1 <= d.x2 <= 810 and 0 <= d.y1 <= d.y2 <= 1080 for d in result.detections
        )
        cloud.stop(SHUTDOWN_TIMEOUT_S)
    finally:
        cloud.kill()
    output = cloud.output()
    assert process.returncode == 0, output
    assert "draining" in output and "stopped" in output


def _serve_to_exit(config: Path) -> subprocess.CompletedProcess[str]:
    """Run `serve` on a config that must make it exit on its own."""
    return subprocess.run(
        serve_command(config),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=STARTUP_TIMEOUT_S,
        check=False,
    )


def test_serve_with_a_bad_config_exits_1_naming_the_line(tmp_path: Path) -> None:
    config = tmp_path / "cloud.yaml"
    config.write_text("server:\n  listen_address: 127.0.0.1:0\n  colour: blue\n")
    process = _serve_to_exit(config)
    assert process.returncode == 1
    assert f"{config}:3: server.colour: unknown key" in process.stderr


def test_serve_with_a_missing_model_fails_clearly(tmp_path: Path) -> None:
    missing = "model.onnx"
    config = tmp_path / "cloud.yaml"
    config.write_text(CONFIG.format(port=free_tcp_port(), model=tmp_path / missing))
    process = _serve_to_exit(config)
    assert process.returncode == 1
    assert missing in process.stderr and "Traceback" not in process.stderr
