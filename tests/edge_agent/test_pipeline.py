"""Parts of the frame loop: frame-rate limiter, motion gate, camera URLs, status document (the
per-camera core is in test_pipeline_core.py)."""

from __future__ import annotations

import numpy as np
import pytest

from configkit.secrets import SecretError
from edge_agent.capture.urls import camera_url, redact_url
from edge_agent.config import CameraConfig, MotionConfig
from edge_agent.pipeline import CameraStatus, FrameRateLimiter, MotionGate


@pytest.mark.parametrize(
    ("source_fps", "target_fps", "expected_per_s"),
    [(25.0, 10.0, 10), (25.0, 25.0, 25), (30.0, 5.0, 5), (10.0, 30.0, 10), (25.0, 7.0, 7)],
)
def test_rate_limiter_keeps_the_target_rate_on_average(
    source_fps: float, target_fps: float, expected_per_s: int
) -> None:
    limiter = FrameRateLimiter(target_fps)
    seconds = 20
    times = np.arange(int(source_fps * seconds)) / source_fps
    accepted = sum(limiter.accept(float(t)) for t in times)
    assert abs(accepted / seconds - expected_per_s) <= 0.1
    assert limiter.skipped == len(times) - accepted


def test_rate_limiter_restarts_after_a_gap_without_a_burst() -> None:
    limiter = FrameRateLimiter(10.0)
    assert limiter.accept(0.0)
    assert limiter.accept(5.0)  # long pause (camera reconnect)
    assert not limiter.accept(5.04)
    assert limiter.accept(5.1)


def test_rate_limiter_rejects_a_bad_rate() -> None:
    with pytest.raises(ValueError, match="positive"):
        FrameRateLimiter(0.0)


def _frame(value: int, square_at: tuple[int, int] | None = None) -> np.ndarray:
    image = np.full((180, 320, 3), value, dtype=np.uint8)
    if square_at is not None:
        x, y = square_at
        image[y : y + 40, x : x + 40] = 255
    return image


def test_motion_gate_skips_still_frames_and_detects_moving_ones() -> None:
    gate = MotionGate(MotionConfig(enabled=True, max_skip_s=10.0))
    assert gate.update(_frame(60), 0.0).detect  # first frame: nothing to compare with
    still = [gate.update(_frame(60), 0.1 * i) for i in range(1, 5)]
    assert not any(r.moving or r.detect for r in still)
    moving = gate.update(_frame(60, square_at=(100, 60)), 0.6)
    assert moving.moving and moving.detect and moving.changed_fraction > 0.01


def test_motion_gate_detects_now_and_then_without_motion() -> None:
    gate = MotionGate(MotionConfig(enabled=True, max_skip_s=1.0))
    decisions = [gate.update(_frame(60), 0.25 * i).detect for i in range(9)]
    assert decisions == [True, False, False, False, True, False, False, False, True]


def test_motion_gate_ignores_sensor_noise() -> None:
    rng = np.random.default_rng(0)
    gate = MotionGate(MotionConfig(enabled=True, max_skip_s=60.0))
    base = _frame(100)
    for i in range(10):
        noise = rng.integers(-6, 7, size=base.shape)
        noisy = np.clip(base.astype(np.int16) + noise, 0, 255).astype(np.uint8)
        result = gate.update(noisy, float(i))
        assert i == 0 or not result.moving


def _camera(**fields: object) -> CameraConfig:
    return CameraConfig.model_validate({"name": "cam", **fields})


def test_camera_url_puts_escaped_credentials_in_and_logs_never_show_them() -> None:
    camera = _camera(
        url="rtsp://10.0.0.5:554/stream1", username="view er", password={"env": "CAM_PW"}
    )
    url = camera_url(camera, {"CAM_PW": "p@ss:w/rd"})
    assert url == "rtsp://view%20er:p%40ss%3Aw%2Frd@10.0.0.5:554/stream1"
    assert redact_url(url) == "rtsp://view%20er:***@10.0.0.5:554/stream1"


@pytest.mark.parametrize(
    "fields",
    [{"url": "/videos/a.mp4"}, {"url": "rtsp://h/s"}, {"url": "rtsp://h/s", "username": "u"}],
)
def test_camera_url_without_password_is_unchanged_or_has_only_the_user(
    fields: dict[str, object],
) -> None:
    url = camera_url(_camera(**fields), {})
    assert url == (fields["url"] if "username" not in fields else "rtsp://u@h/s")
    assert redact_url(url) == url


def test_camera_url_missing_secret_is_a_clear_error() -> None:
    camera = _camera(url="rtsp://h/s", username="u", password={"env": "NOPE"})
    with pytest.raises(SecretError, match="NOPE"):
        camera_url(camera, {})


def test_status_document_reports_state_rate_and_counters() -> None:
    status = CameraStatus("cam")
    status.changed("streaming", "first frame", now_s=1_764_485_750.0)
    for i in range(20):
        status.analysed(100.0 + 0.1 * i)
    assert status.fps(now_monotonic_s=102.0) == pytest.approx(20 / 5.0)
    document = status.document(agent="a", frames=20, dropped=3, reconnects=1, now_s=1.0e9)
    assert document["state"] == "streaming"
    assert document["since"] == "2025-11-30T06:55:50.000Z"
    assert (document["frames_analysed"], document["frames_dropped"]) == (20, 3)
    assert document["schema"] == "edge-camera-status/v1"
