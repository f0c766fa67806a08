"""Cloud service config: the examples validate, cross-field mistakes are caught with their line."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud_service.config import CloudServiceConfig
from configkit import ConfigError, load_config, parse_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

BASE = """\
engine:
  runtime:
    type: tensorrt
    engine_path: models/cloud/yolov5x.engine
    max_batch_size: 16
"""


@pytest.mark.parametrize("name", ["cloud-service.example.yaml", "cloud-service.cpu.yaml"])
def test_examples_validate(name: str) -> None:
    config = load_config(CONFIGS / name, CloudServiceConfig)
    assert config.engine.runtime.type in ("onnxruntime", "tensorrt")


def test_defaults() -> None:
    config = parse_config(BASE, CloudServiceConfig)
    assert config.decoder.type == "cpu"
    assert config.batching.max_batch_size == 16
    assert config.metrics.listen_port == 9109
    assert (config.model_name, config.model_version) == (None, None)  # from the model file


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("", "model <metadata>:<metadata> on tensorrt"),
        ("model_name: yolov5x\nmodel_version: '2'\n", "model yolov5x:2 on tensorrt"),
        ("model_name: yolov5x\n", "model yolov5x:<metadata> on tensorrt"),
    ],
)
def test_summary_names_the_model_or_defers_to_its_metadata(extra: str, expected: str) -> None:
    assert parse_config(BASE + extra, CloudServiceConfig).summary().startswith(expected)


CASES = [
    pytest.param(
        "batching:\n  max_batch_size: 8\n  preferred_batch_sizes: [4, 16]\n",
        "t.yaml:8: batching.preferred_batch_sizes[1]: preferred batch size 16 is outside "
        "1..max_batch_size (8)",
        id="preferred-size-above-max",
    ),
    pytest.param(
        "batching:\n  preferred_batch_sizes: [8, 4]\n",
        "t.yaml:7: batching.preferred_batch_sizes[1]: preferred_batch_sizes must be strictly "
        "increasing",
        id="preferred-sizes-not-increasing",
    ),
    pytest.param(
        "batching:\n  max_batch_size: 0\n",
        "t.yaml:7: batching.max_batch_size: Input should be greater than or equal to 1 (got 0)",
        id="max-batch-size-range",
    ),
    pytest.param(
        "batching:\n  max_batch_size: 32\n",
        "t.yaml:7: batching.max_batch_size: batching.max_batch_size (32) exceeds the engine's "
        "engine.runtime.max_batch_size (16)",
        id="batch-above-engine-profile",
    ),
    pytest.param(
        "batching:\n  max_queue_frames: 10\n  per_stream_queue_frames: 20\n",
        "t.yaml:8: batching.per_stream_queue_frames: per_stream_queue_frames (20) exceeds "
        "max_queue_frames (10)",
        id="stream-queue-above-total",
    ),
    pytest.param(
        "decoder:\n  type: gpu\n",
        "t.yaml:7: decoder.type: Input should be 'cpu' or 'nvjpeg' (got 'gpu')",
        id="decoder-type",
    ),
    pytest.param(
        "decoder:\n  max_jpeg_bytes: 134217728\n",
        "t.yaml:7: decoder.max_jpeg_bytes: decoder.max_jpeg_bytes (134217728) exceeds "
        "server.max_receive_message_bytes (67108864)",
        id="jpeg-above-message-limit",
    ),
    pytest.param(
        "server:\n  listen_adress: 0.0.0.0:1\n",
        "t.yaml:7: server.listen_adress: unknown key",
        id="typo-in-server",
    ),
]


@pytest.mark.parametrize(("extra", "expected"), CASES)
def test_errors(extra: str, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(BASE + extra, CloudServiceConfig, "t.yaml")
    assert str(raised.value) == expected


def test_engine_is_required() -> None:
    with pytest.raises(ConfigError, match=r"^t.yaml:1: engine: required field is missing$"):
        parse_config("model_name: x\n", CloudServiceConfig, "t.yaml")
