"""The README's main command end to end: cloud, RTSP camera, broker, edge agent, alerts, video."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import cv2
import pytest

from testbed import demo, demo_stack
from testbed.broker import amqtt_available, mosquitto_executable
from testbed.demo_report import pace_of
from testbed.processes import free_tcp_port

# process: the demo's cloud, agent, broker and RTSP processes
pytestmark = [pytest.mark.process, pytest.mark.timeout(240)]

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
    # No frame rate is asserted: on a slow or loaded box the edge falls behind the camera (and
    # must keep its alerts all the same); the summary says so and by how much.
    pace = numbers["pace"]
    assert pace["camera_fps"] == 25.0 and 0 < pace["analysed_fps"] <= 26.0
    assert ("BEHIND the camera" in summary) is pace["behind"]
    assert "own process (pid" in out  # the cloud runs apart from the edge
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
    """The cloud process exits on a model file that is not there: the demo names it, with the
    cloud's own message, and leaves no cgroup behind."""
    models = demo_stack.committed_models("int8")
    missing = demo_out / "no-such-cloud-model.onnx"
    monkeypatch.setattr(
        demo_stack,
        "committed_models",
        lambda _kind: dataclasses.replace(models, cloud=missing),
    )
    code = demo.main(["--out", str(demo_out), "--no-video"])
    out = capsys.readouterr().out
    assert code == demo.EXIT_START_FAILED
    assert "DEMO FAILED: the cloud service did not start: cloud service exited" in out
    assert "no-such-cloud-model.onnx" in out
    assert "Traceback" not in out
    assert not list(Path("/sys/fs/cgroup/cpu").glob(f"demo-cloud-{os.getpid()}"))


@pytest.mark.parametrize(
    ("frames", "ran_s", "behind", "text"),
    [
        (396, 15.9, False, "keeps up: 24.9 of the camera's 25 frames/s (100 %)"),
        (
            100,
            16.0,
            True,
            "BEHIND the camera: 6.2 of the camera's 25 frames/s (25 %); 300 frames skipped as "
            "stale, tracks and rules see about every 4.0th frame",
        ),
    ],
)
def test_the_summary_says_when_the_edge_is_behind_the_camera_and_by_how_much(
    frames: int, ran_s: float, behind: bool, text: str
) -> None:
    pace = pace_of(frames, ran_s, 25.0, 300 if behind else 0)
    assert pace.behind is behind
    assert pace.text() == text
    assert pace.numbers()["behind"] is behind


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
