"""The committed real detector pair (`models/coco/`): manifest, metadata, real images, and INT8
agreeing with FP32 on real frames (the edge model is the INT8 one)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import pytest

from detection.coco_eval import agreement
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from detection.toolchain.model_source import load_spec, sha256_of
from detection.toolchain.real_import import video_frames
from testbed.media import sample_clip as sample_clip_of
from testbed.media import sample_image
from tests.fixtures.rtsp import MEDIA_CACHE_DIR

pytest.importorskip("onnxruntime")

COCO = Path(__file__).resolve().parents[2] / "models" / "coco"
MANIFEST = json.loads((COCO / "manifest.json").read_text(encoding="utf-8"))
EDGE_INPUT = (320, 416)
PERSON = 0


def _detector(name: str, input_size: tuple[int, int], threshold: float = 0.35) -> Detector:
    return Detector.from_config(
        DetectorConfig.model_validate(
            {
                "runtime": {"type": "onnxruntime", "model_path": str(COCO / name)},
                "input_size": list(input_size),
                "confidence_threshold": threshold,
            }
        )
    )


def _every(path: Path, step: int, offset: int) -> list[npt.NDArray[np.uint8]]:
    return [frame for index, frame in video_frames(path) if index % step == offset]


@pytest.fixture(scope="module")
def real_frames(sample_clip: Path) -> list[npt.NDArray[np.uint8]]:
    """bus.jpg, zidane.jpg, bikes and vtest frames the INT8 model was not calibrated on."""
    frames = [
        np.asarray(cv2.imread(str(sample_image(MEDIA_CACHE_DIR, name=n))), dtype=np.uint8)
        for n in ("bus", "zidane")
    ]
    frames += _every(sample_clip, 25, 12)
    frames += _every(sample_clip_of(MEDIA_CACHE_DIR, name="vtest"), 40, 20)
    assert len(frames) >= 30
    return frames


@pytest.fixture(scope="module")
def fp32() -> Iterator[Detector]:
    with _detector("nanodet-coco-fp32.onnx", EDGE_INPUT) as detector:
        yield detector


@pytest.fixture(scope="module")
def int8() -> Iterator[Detector]:
    with _detector("nanodet-coco-int8.onnx", EDGE_INPUT) as detector:
        yield detector


def test_manifest_rows_match_the_committed_files() -> None:
    spec = load_spec(COCO / "source.json")
    assert MANIFEST["class_names"] == spec.class_names
    assert MANIFEST["source"]["package"] == spec.package
    assert MANIFEST["source"]["version"] == spec.version
    for row in MANIFEST["models"]:
        path = COCO / row["file"]
        assert sha256_of(path) == row["sha256"], row["file"]
        assert path.stat().st_size == row["bytes"]
    for licence in spec.licences:
        assert (COCO / licence.text_file).read_text(encoding="utf-8").strip()


@pytest.mark.parametrize("name", ["nanodet-coco-fp32.onnx", "nanodet-coco-int8.onnx"])
def test_class_names_and_identity_travel_in_the_model(name: str) -> None:
    with _detector(name, EDGE_INPUT) as detector:
        assert len(detector.class_names) == 80
        assert detector.class_names[0] == "person" and detector.class_names[5] == "bus"


def _labels(detector: Detector, detections: Detections) -> list[str]:
    return [detector.class_name(int(c)) for c in detections.class_id]


def test_real_stills_are_seen(fp32: Detector, int8: Detector) -> None:
    bus = cv2.imread(str(sample_image(MEDIA_CACHE_DIR, name="bus")))
    zidane = cv2.imread(str(sample_image(MEDIA_CACHE_DIR, name="zidane")))
    for detector in (fp32, int8):
        bus_labels = _labels(detector, detector.detect([bus])[0])
        assert bus_labels.count("person") >= 3 and "bus" in bus_labels, bus_labels
        zidane_labels = _labels(detector, detector.detect([zidane])[0])
        assert zidane_labels.count("person") >= 2, zidane_labels
    # the tie is a small object the edge input barely resolves: it scores 0.38 (FP32) and 0.35
    # (INT8) at 320x416 under onnxruntime 1.32, so it is looked for from 0.3, not at 0.35 where
    # the INT8 kernels' rounding decides
    for name in ("nanodet-coco-fp32.onnx", "nanodet-coco-int8.onnx"):
        with _detector(name, EDGE_INPUT, threshold=0.3) as detector:
            assert "tie" in _labels(detector, detector.detect([zidane])[0]), name


@pytest.mark.slow
def test_int8_agrees_with_fp32_on_real_frames(
    real_frames: list[npt.NDArray[np.uint8]], fp32: Detector, int8: Detector
) -> None:
    reference = [fp32.detect([f])[0] for f in real_frames]
    predicted = [int8.detect([f])[0] for f in real_frames]
    person = agreement(reference, predicted, classes=[PERSON])
    overall = agreement(reference, predicted)
    assert person.true_positives + person.false_negatives >= 100
    assert person.f1 >= 0.95, person  # 0.976 on the import's held-out frames (manifest.json)
    assert overall.f1 >= 0.9, overall
