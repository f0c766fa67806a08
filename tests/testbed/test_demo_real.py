"""The demo on real footage (`--source real`): cloud, RTSP camera serving OpenCV's `vtest` clip,
broker and edge agent with the COCO-80 models; real people raise alerts, the video is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import pytest

from testbed import demo, demo_real
from testbed.broker import amqtt_available, mosquitto_executable

# ~10 s start-up (cached clip, cloud warm-up, RTSP) + 20 s streamed + drain and video
pytestmark = [
    pytest.mark.process,  # the demo's cloud, agent, broker and RTSP processes
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg not installed"),
    pytest.mark.skipif(
        mosquitto_executable() is None and not amqtt_available(),
        reason="no MQTT broker: neither mosquitto nor amqtt is installed",
    ),
]

STREAM_S = 20.0  # people cross the zone and the line within the clip's first seconds
SUMMARY_ROWS = (
    "footage",
    "frames analysed",
    "escalated",
    "bytes sent to cloud",
    "capture -> alert via MQTT",
    "started by class: person",
    "no scripted events",
    "-- annotated video",
)


def test_real_footage_demo_raises_person_alerts_over_mqtt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "demo-real"
    code = demo.main(
        ["--source", "real", "--out", str(out_dir), "--duration-s", str(STREAM_S),
         "--progress-s", "5"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == demo.EXIT_OK, out

    live, summary = out.split("== summary")
    assert "  ALERT " in live and "class=person" in live  # printed as they came from MQTT
    for row in SUMMARY_ROWS:
        assert row in summary, summary
    assert "expected events" not in summary  # nothing scripted is claimed for real footage

    numbers = json.loads((out_dir / "summary.json").read_text())
    assert numbers["source"] == "real" and numbers["problems"] == []
    assert numbers["frames_analysed"] > 0 and numbers["detections"] > 0
    assert numbers["answered"] > 0 and numbers["bytes_sent"] > 0
    labels = [a["label"] for a in numbers["alerts"]]
    assert "person" in labels, numbers["alerts"]
    assert numbers["alerts_by_label"].get("person", 0) >= 1

    video = Path(numbers["video"])
    assert video == out_dir / "annotated.mp4" and video.is_file()
    capture = cv2.VideoCapture(str(video))
    ok, frame = capture.read()
    capture.release()
    assert ok and frame.shape[:2] == (576, 768)
    assert numbers["video_frames"] == numbers["frames_analysed"]


def test_real_footage_demo_names_a_broken_config_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "demo-real.edge.yaml"
    broken.write_text(
        demo_real.EDGE_CONFIG.read_text().replace("kind: line_cross", "kind: line_crossing")
    )
    monkeypatch.setattr(demo_real, "EDGE_CONFIG", broken)
    code = demo.main(["--source", "real", "--out", str(tmp_path / "out"), "--no-video"])
    out = capsys.readouterr().out
    assert code == demo.EXIT_START_FAILED
    assert f"DEMO FAILED: {broken} is not a usable config" in out
    assert "line_crossing" in out
    assert "== cloud service" not in out  # nothing was started
