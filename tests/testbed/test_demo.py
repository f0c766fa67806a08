"""The README's main command end to end: cloud, RTSP camera, broker, edge agent, alerts, video."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import pytest

from testbed import demo, demo_stack
from testbed.broker import amqtt_available, mosquitto_executable
from testbed.processes import free_tcp_port

pytestmark = pytest.mark.timeout(240)

SUMMARY_ROWS = (
    "frames analysed",
    "escalated",
    "bytes sent to cloud",
    "answers fused",
    "tracks by fusion",
    "capture -> frame results",
    "capture -> alert via MQTT",
    "-- expected events (first scene loop",
    "-- annotated video",
)


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One output folder for the module: the scene is rendered once."""
    if mosquitto_executable() is None and not amqtt_available():
        pytest.skip("no MQTT broker: neither mosquitto nor amqtt is installed")
    return tmp_path_factory.mktemp("demo")


def _video_frames(path: Path) -> int:
    capture = cv2.VideoCapture(str(path))
    frames = 0
    while capture.read()[0]:
        frames += 1
    capture.release()
    return frames


def test_demo_runs_one_scene_loop_end_to_end(
    demo_out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two loops: the agent joins a live looping stream, and on a loaded machine its first second
    # (capture start, first inference) can drop the frames where the scene's first two people walk
    # into the zone; the check then finds one whole loop among what it saw (seen in a CI run).
    code = demo.main(["--out", str(demo_out), "--loops", "2", "--progress-s", "3"])
    out = capsys.readouterr().out
    assert code == demo.EXIT_OK, out

    assert "  ALERT " in out.split("== summary")[0]  # printed live, as they came from MQTT
    summary = out.split("== summary")[1]
    for row in SUMMARY_ROWS:
        assert row in summary, summary
    assert ": OK" in summary

    numbers = json.loads((demo_out / "summary.json").read_text())
    assert numbers["frames_analysed"] >= 0.8 * 25 * 14.4  # kept (near) the camera's frame rate
    assert 0 < numbers["escalated"] < numbers["frames_analysed"]
    assert (
        numbers["answered"] > 0 and numbers["fusion"]["answers"] > 0 and numbers["bytes_sent"] > 0
    )
    assert numbers["expected"]["ok"] and numbers["expected"]["matched"] >= 5
    assert numbers["problems"] == []
    assert len(numbers["latency_ms"]["results"]) == numbers["frames_analysed"]
    assert numbers["latency_ms"]["alerts"]

    video = Path(numbers["video"])
    assert video.is_file()
    assert _video_frames(video) == numbers["video_frames"] == numbers["frames_analysed"]


def test_demo_says_which_component_failed_and_exits_2(
    demo_out: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_config: object) -> None:
        raise RuntimeError("engine exploded")

    monkeypatch.setattr(demo_stack, "build_service", broken)
    code = demo.main(["--out", str(demo_out), "--no-video"])
    out = capsys.readouterr().out
    assert code == demo.EXIT_START_FAILED
    assert "DEMO FAILED: the cloud service did not start: engine exploded" in out


def test_demo_reports_an_unreachable_external_broker(
    demo_out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_tcp_port()  # nothing listens there
    code = demo.main(
        ["--out", str(demo_out), "--no-video", "--mqtt-host", "127.0.0.1", "--mqtt-port", str(port)]
    )
    out = capsys.readouterr().out
    assert code == demo.EXIT_START_FAILED
    assert "DEMO FAILED: starting the MQTT broker failed" in out
