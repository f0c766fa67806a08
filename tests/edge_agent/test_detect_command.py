"""`edge-agent detect`: a real model over the real sample clip, from a file and over RTSP."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from detection.config import DetectorConfig
from detection.runtimes.config import LiteRTConfig, OnnxRuntimeConfig, TensorRTConfig
from edge_agent.cli import main
from edge_agent.detect_command import format_frame, run_detect, runtime_config_for
from tests.fixtures.rtsp import RtspServer

FRAMES = 5


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("m.onnx", OnnxRuntimeConfig),
        ("m.ONNX", OnnxRuntimeConfig),
        ("m.tflite", LiteRTConfig),
        ("m.engine", TensorRTConfig),
        ("m.plan", TensorRTConfig),
    ],
)
def test_runtime_is_chosen_by_suffix(name: str, expected: type) -> None:
    assert isinstance(runtime_config_for(Path(name), threads=2), expected)


def test_unknown_suffix_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"cannot tell the runtime of m\.pt"):
        runtime_config_for(Path("m.pt"), threads=2)


def _config(model: Path, confidence: float = 0.0) -> DetectorConfig:
    # random weights score near zero: threshold 0 lets boxes through to check their geometry
    return DetectorConfig(
        runtime=OnnxRuntimeConfig(model_path=model),
        confidence_threshold=confidence,
        input_size=(320, 320),
        max_detections=20,
    )


def test_jsonl_output_has_one_line_per_frame_with_boxes_inside_the_frame(
    yolov5s_onnx: Path, sample_clip: Path
) -> None:
    out = io.StringIO()
    summary = run_detect(
        _config(yolov5s_onnx), str(sample_clip), out, max_frames=FRAMES, fmt="jsonl"
    )
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["frame"] for line in lines] == list(range(FRAMES))
    assert summary.frames == FRAMES and len(summary.latencies_ms) == FRAMES
    boxes = [d["xyxy"] for line in lines for d in line["detections"]]
    assert boxes, "threshold 0 must let boxes through"
    assert all(0 <= x1 <= x2 <= 640 and 0 <= y1 <= y2 <= 272 for x1, y1, x2, y2 in boxes)
    assert summary.detections == len(boxes)


def test_reads_a_live_rtsp_stream(yolov5s_onnx: Path, rtsp_server: RtspServer) -> None:
    out = io.StringIO()
    summary = run_detect(_config(yolov5s_onnx, 0.25), rtsp_server.url, out, max_frames=FRAMES)
    assert summary.frames == FRAMES
    assert len(out.getvalue().splitlines()) == FRAMES


def test_cli_prints_frames_and_a_summary(
    yolov5s_onnx: Path, sample_clip: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["detect", "--model", str(yolov5s_onnx), "--source", str(sample_clip)]
    code = main([*argv, "--imgsz", "320", "--max-frames", "3"])
    captured = capsys.readouterr()
    assert code == 0
    assert len(captured.out.splitlines()) == 3
    assert "3 frames" in captured.err and "p50" in captured.err


@pytest.mark.parametrize(
    ("model", "source", "extra", "message"),
    [
        ("missing.onnx", "{clip}", [], "missing.onnx"),
        ("{model}", "no-such-clip.mp4", [], "video file not found: no-such-clip.mp4"),
        ("{model}", "rtsp://127.0.0.1:1/none", [], "cannot open video source"),
        ("model.pt", "{clip}", [], "cannot tell the runtime"),
        # 2 class names for a model that names its 80 classes (ultralytics `names` metadata)
        (
            "{model}",
            "{clip}",
            ["--class-names", "a,b"],
            r"names 2 classes \(a, b\) but the model "
            r"yolov5s_seed0.onnx has 80",
        ),
        (
            "{model}",
            "{clip}",
            ["--classes", "unicorn"],
            r"unknown class 'unicorn'; the classes of "
            r"the model yolov5s_seed0.onnx are: ",
        ),
    ],
)
def test_cli_bad_inputs_exit_1_with_one_clear_line(
    yolov5s_onnx: Path,
    sample_clip: Path,
    capsys: pytest.CaptureFixture[str],
    model: str,
    source: str,
    extra: list[str],
    message: str,
) -> None:
    model = model.format(model=yolov5s_onnx)
    source = source.format(clip=sample_clip)
    code = main(["detect", "--model", model, "--source", source, "--imgsz", "320", *extra])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("edge-agent detect: ")
    assert re.search(message, err), err


COCO_FP32 = Path(__file__).resolve().parents[2] / "models" / "coco" / "nanodet-coco-fp32.onnx"


@pytest.mark.parametrize(
    ("names", "fmt", "expected"),
    [
        (("person", "car"), "jsonl", ["person", "car", "7"]),
        ((), "jsonl", ["0", "1", "7"]),
        (("person", "car"), "text", "person 0.90 [1.0, 2.0, 3.0, 4.0], car 0.80"),
    ],
    ids=["named", "unnamed", "text"],
)
def test_format_frame_prints_class_names(
    names: tuple[str, ...], fmt: str, expected: list[str] | str
) -> None:
    import numpy as np

    from detection.detections import Detections

    dets = Detections(
        xyxy=np.array([[1.04, 2.0, 3.0, 4.0], [1, 2, 3, 4], [1, 2, 3, 4]], np.float32),
        confidence=np.array([0.9, 0.8, 0.7], np.float32),
        class_id=np.array([0, 1, 7]),
    )
    line = format_frame(3, dets, names, fmt, 1.0)  # type: ignore[arg-type]
    if fmt == "jsonl":
        assert [d["class"] for d in json.loads(line)["detections"]] == expected
    else:
        assert isinstance(expected, str) and expected in line


def test_labels_come_from_the_model_and_classes_filter_them(
    sample_clip: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["detect", "--model", str(COCO_FP32), "--source", str(sample_clip), "--imgsz", "320,416"]
    assert main([*argv, "--max-frames", "2", "--format", "jsonl"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    labels = {d["class"] for line in lines for d in line["detections"]}
    assert "person" in labels and not any(label.isdigit() for label in labels), labels
    assert main([*argv, "--max-frames", "2", "--format", "jsonl", "--classes", "person"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {d["class"] for line in lines for d in line["detections"]} == {"person"}


@pytest.mark.parametrize("imgsz", ["320,", "a,b", "320,416,3"])
def test_imgsz_is_s_or_h_w(imgsz: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["detect", "--model", str(COCO_FP32), "--source", "x.mp4", "--imgsz", imgsz])
    assert "expected S or H,W in pixels" in capsys.readouterr().err
