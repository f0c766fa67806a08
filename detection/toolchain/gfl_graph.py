"""Bake a GFL detector's (NanoDet's) pre-processing and box decoding into its ONNX graph.

NanoDet as converted from TF.js takes a BGR, mean/std-normalised `(1, 3, 416, 416)` input and
answers per stride (8, 16, 32) sigmoid class scores and box logits: 4 sides x `reg_max + 1` bins
(the General Focal Loss "distribution" head). The rewritten graph:

- takes what every runtime here feeds: RGB scaled to 0..1, NCHW, any batch and any size that is a
  multiple of the largest stride (the convolutions and the x2 resizes are size-agnostic; only the
  converter's fixed reshapes are replaced);
- answers one `(B, 4 + C, N)` tensor in the anchor-free YOLO layout (`cx, cy, w, h` in input
  pixels, then class scores), so `detection.decode` and NMS treat it like any YOLOv8-style head
  and every runtime (ONNX Runtime, LiteRT, TensorRT) sees a plain single-output model.

Per level of stride `s` with feature `(B, C + 4 * (reg_max + 1), h, w)`: a cell at column x, row y
has its centre at `((x + 0.5) s, (y + 0.5) s)`; each side's distance is the expectation of a
softmax over the bins, times `s`. Only `onnx` and `numpy` are needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from detection.errors import DetectionError

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto, NodeProto, TensorProto


# Node-name prefixes of what the rewrite adds (pre-processing, decoding): INT8 keeps them float.
ADDED_NODE_PREFIXES: tuple[str, ...] = ("pre/", "gfl")


class GraphRewriteError(DetectionError, ValueError):
    """The ONNX graph does not have the GFL head this rewrite expects."""


@dataclass(frozen=True)
class GflHead:
    """What the rewrite must know of the source model."""

    num_classes: int
    reg_max: int  # bins per side minus one
    strides: tuple[int, ...]
    mean_bgr: tuple[float, float, float]  # per-channel mean, 0..255 scale
    std_bgr: tuple[float, float, float]

    @property
    def channels(self) -> int:
        """Channels of one level's head output: class scores then box bins."""
        return self.num_classes + 4 * (self.reg_max + 1)


def _const(name: str, value: npt.ArrayLike, dtype: type[np.generic] = np.float32) -> TensorProto:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _level_convs(graph: GraphProto, head: GflHead) -> list[str]:
    """The head's per-level output tensors (before the converter's split), finest stride first.

    They are the outputs of the Conv nodes with `head.channels` output channels that feed a
    Split into class scores and box logits.
    """
    from onnx import numpy_helper

    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    splits = [n for n in graph.node if n.op_type == "Split"]
    producers = {o: n for n in graph.node for o in n.output}
    found: list[tuple[int, str]] = []
    for split in splits:
        source = split.input[0]
        conv = producers.get(source)
        if conv is None or conv.op_type != "Conv":
            continue
        weight = inits.get(conv.input[1])
        if weight is None or weight.shape[0] != head.channels:
            continue
        found.append((len(found), source))
    if len(found) != len(head.strides):
        raise GraphRewriteError(
            f"expected {len(head.strides)} head convolutions with {head.channels} output channels "
            f"({head.num_classes} classes + 4 x {head.reg_max + 1} bins) feeding a Split, "
            f"found {len(found)}"
        )
    return [name for _, name in found]


def _order_by_resolution(
    sources: Sequence[str], graph: GraphProto, input_hw: tuple[int, int]
) -> list[str]:
    """Sort level tensors finest first by running shape inference at a fixed input size."""
    import onnx

    model = onnx.helper.make_model(graph)
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in list(inferred.graph.value_info) + list(inferred.graph.output)
    }
    sizes = []
    for name in sources:
        dims = shapes.get(name)
        if not dims or len(dims) != 4 or dims[2] <= 0:
            raise GraphRewriteError(f"cannot infer the spatial size of head output {name}")
        sizes.append((-dims[2] * dims[3], name))
    expected = sorted(input_hw[0] * input_hw[1] // (s * s) for s in (8, 16, 32))
    if sorted(-s for s, _ in sizes) != expected:
        raise GraphRewriteError(f"head outputs have cell counts {[-s for s, _ in sizes]}")
    return [name for _, name in sorted(sizes)]


def _node(op: str, inputs: list[str], outputs: list[str], **attrs: Any) -> NodeProto:
    """A node named after its first output, so the added parts can be told apart by prefix."""
    from onnx import helper

    return helper.make_node(op, inputs, outputs, name=outputs[0], **attrs)


def _preprocess_nodes(
    head: GflHead, graph_input: str, out: str
) -> tuple[list[NodeProto], list[TensorProto]]:
    """RGB 0..1 -> BGR, x 255, minus mean, over std: `x * (255 / std) - mean / std`."""

    scale = np.array([255.0 / s for s in head.std_bgr], dtype=np.float32).reshape(1, 3, 1, 1)
    shift = np.array(
        [-m / s for m, s in zip(head.mean_bgr, head.std_bgr, strict=True)], dtype=np.float32
    ).reshape(1, 3, 1, 1)
    inits = [
        _const("pre/bgr_index", [2, 1, 0], np.int64),
        _const("pre/scale", scale),
        _const("pre/shift", shift),
    ]
    nodes = [
        _node("Gather", [graph_input, "pre/bgr_index"], ["pre/bgr"], axis=1),
        _node("Mul", ["pre/bgr", "pre/scale"], ["pre/scaled"]),
        _node("Add", ["pre/scaled", "pre/shift"], [out]),
    ]
    return nodes, inits


def _level_decode_nodes(
    head: GflHead, feature: str, stride: int, level: int
) -> tuple[list[NodeProto], list[TensorProto], str]:
    """Nodes that turn one level's `(B, C + 4 * bins, h, w)` into `(B, 4 + C, h * w)`."""

    p = f"gfl{level}/"
    bins = head.reg_max + 1
    c = head.num_classes
    inits = [
        _const(p + "split", [c, 4 * bins], np.int64),
        _const(p + "cls_shape", [0, c, -1], np.int64),
        _const(p + "reg_shape", [0, 4, bins, -1], np.int64),
        _const(p + "bins", np.arange(bins, dtype=np.float32).reshape(1, 1, bins, 1)),
        _const(p + "stride", np.float32(stride)),
        _const(p + "half", np.float32(0.5)),
        _const(p + "zero", 0, np.int64),
        _const(p + "one", 1, np.int64),
        _const(p + "idx_h", [2], np.int64),
        _const(p + "idx_w", [3], np.int64),
        _const(p + "axis2", [2], np.int64),
        _const(p + "row_shape", [-1], np.int64),
        _const(p + "sides_lt", [0, 1], np.int64),
        _const(p + "sides_rb", [2, 3], np.int64),
    ]
    n = _node
    nodes = [
        n("Split", [feature, p + "split"], [p + "cls_logit", p + "reg_logit"], axis=1),
        n("Sigmoid", [p + "cls_logit"], [p + "cls_map"]),
        n("Reshape", [p + "cls_map", p + "cls_shape"], [p + "cls"]),
        n("Reshape", [p + "reg_logit", p + "reg_shape"], [p + "reg"]),
        n("Softmax", [p + "reg"], [p + "prob"], axis=2),
        n("Mul", [p + "prob", p + "bins"], [p + "weighted"]),
        n("ReduceSum", [p + "weighted", p + "axis2"], [p + "dist_cells"], keepdims=0),
        n("Mul", [p + "dist_cells", p + "stride"], [p + "dist"]),  # (B, 4, hw): l, t, r, b
        # cell centres from the feature's own size, so any input size works
        n("Shape", [feature], [p + "shape"]),
        n("Gather", [p + "shape", p + "idx_h"], [p + "h1"]),
        n("Gather", [p + "shape", p + "idx_w"], [p + "w1"]),
        n("Squeeze", [p + "h1"], [p + "h"]),
        n("Squeeze", [p + "w1"], [p + "w"]),
        n("Range", [p + "zero", p + "w", p + "one"], [p + "xs_i"]),
        n("Range", [p + "zero", p + "h", p + "one"], [p + "ys_i"]),
        n("Cast", [p + "xs_i"], [p + "xs_f"], to=1),
        n("Cast", [p + "ys_i"], [p + "ys_f"], to=1),
        n("Add", [p + "xs_f", p + "half"], [p + "xs_h"]),
        n("Add", [p + "ys_f", p + "half"], [p + "ys_h"]),
        n("Mul", [p + "xs_h", p + "stride"], [p + "xs"]),
        n("Mul", [p + "ys_h", p + "stride"], [p + "ys"]),
        n("Concat", [p + "h1", p + "w1"], [p + "hw"], axis=0),
        n("Unsqueeze", [p + "xs", p + "zero_axes"], [p + "xs_row"]),  # (1, w)
        n("Unsqueeze", [p + "ys", p + "one_axes"], [p + "ys_col"]),  # (h, 1)
        n("Expand", [p + "xs_row", p + "hw"], [p + "cx_grid"]),
        n("Expand", [p + "ys_col", p + "hw"], [p + "cy_grid"]),
        n("Reshape", [p + "cx_grid", p + "row_shape"], [p + "cx"]),  # (hw,)
        n("Reshape", [p + "cy_grid", p + "row_shape"], [p + "cy"]),
        n("Gather", [p + "dist", p + "sides_lt"], [p + "lt"], axis=1),  # (B, 2, hw)
        n("Gather", [p + "dist", p + "sides_rb"], [p + "rb"], axis=1),
        n("Unsqueeze", [p + "cx", p + "zero_axes"], [p + "cx1"]),
        n("Unsqueeze", [p + "cy", p + "zero_axes"], [p + "cy1"]),
        n("Concat", [p + "cx1", p + "cy1"], [p + "centre"], axis=0),  # (2, hw)
        n("Sub", [p + "rb", p + "lt"], [p + "shift2"]),
        n("Mul", [p + "shift2", p + "half"], [p + "shift"]),
        n("Add", [p + "centre", p + "shift"], [p + "cxcy"]),  # (B, 2, hw)
        n("Add", [p + "lt", p + "rb"], [p + "wh"]),
        n("Concat", [p + "cxcy", p + "wh", p + "cls"], [p + "out"], axis=1),
    ]
    inits += [_const(p + "zero_axes", [0], np.int64), _const(p + "one_axes", [1], np.int64)]
    return nodes, inits, p + "out"


def _constant(graph: GraphProto, name: str) -> npt.NDArray[Any] | None:
    from onnx import numpy_helper

    for init in graph.initializer:
        if init.name == name:
            return np.asarray(numpy_helper.to_array(init))
    return None


def _fold_pads(nodes: list[NodeProto], graph: GraphProto) -> list[NodeProto]:
    """Fold explicit spatial `Pad` nodes into the `Conv` / `MaxPool` that reads them.

    TF's "SAME" padding arrives as a separate Pad (zeros before a Conv, -inf before a MaxPool).
    As pads attributes they cost nothing, and the INT8 graph keeps one quantised chain instead of
    leaving each Pad between a dequantise and a quantise. Exact: zero padding is what Conv pads
    with, and MaxPool's own padding is ignored by the max (as -inf is).
    """
    from onnx import helper

    consumers: dict[str, list[NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    dropped: set[int] = set()
    for pad in nodes:
        if pad.op_type != "Pad" or len(consumers.get(pad.output[0], [])) != 1:
            continue
        target = consumers[pad.output[0]][0]
        pads = _constant(graph, pad.input[1]) if len(pad.input) > 1 else None
        value = _constant(graph, pad.input[2]) if len(pad.input) > 2 and pad.input[2] else None
        mode = next((a.s for a in pad.attribute if a.name == "mode"), b"constant")
        fill = 0.0 if value is None else float(value.reshape(-1)[0])
        wanted_fill = {"Conv": 0.0, "MaxPool": -np.inf}.get(target.op_type)
        if (
            wanted_fill is None
            or pads is None
            or pads.shape != (8,)
            or mode != b"constant"
            or fill != wanted_fill
            or pads[[0, 1, 4, 5]].any()
            or any(a.name in ("pads", "auto_pad") for a in target.attribute)
        ):
            continue
        top, left, bottom, right = (int(v) for v in pads[[2, 3, 6, 7]])
        target.attribute.append(helper.make_attribute("pads", [top, left, bottom, right]))
        target.input[0] = pad.input[0]
        dropped.add(id(pad))
    return [n for n in nodes if id(n) not in dropped]


def _canonical_names(
    body: list[NodeProto], levels: list[str], graph: GraphProto
) -> tuple[list[NodeProto], list[str], list[TensorProto]]:
    """Rename the kept nodes, tensors and weights by position: `body/<i>`, `body/w<j>`.

    The converter numbers the constants it merges in an order that varies from run to run, so
    the same weights come out under other names; renamed by position, an import of the same
    package gives the same file byte for byte.
    """
    inits = {i.name: i for i in graph.initializer}
    names: dict[str, str] = {}
    kept: list[TensorProto] = []
    for index, node in enumerate(body):
        for i, name in enumerate(node.input):
            if name in inits and name not in names:
                names[name] = f"body/w{len(kept)}"
                weight = type(inits[name])()
                weight.CopyFrom(inits[name])
                weight.name = names[name]
                kept.append(weight)
            node.input[i] = names.get(name, name)
        for k, name in enumerate(node.output):
            names[name] = f"body/{index}" + (f":{k}" if k else "")
            node.output[k] = names[name]
        node.name = f"body/{index}_{node.op_type}"
    return body, [names[level] for level in levels], kept


def rewrite_gfl(
    model: ModelProto,
    head: GflHead,
    input_hw: tuple[int, int] = (416, 416),
    metadata: dict[str, str] | None = None,
) -> ModelProto:
    """Return a new `onnx.ModelProto`: pre-processing and GFL decoding baked in (module doc).

    `input_hw` is the size the source graph was converted at, used only to order the levels.
    """
    import onnx
    from onnx import helper

    src = onnx.ModelProto()
    src.CopyFrom(model)
    graph = src.graph
    if len(graph.input) != 1:
        raise GraphRewriteError(f"expected one graph input, found {len(graph.input)}")
    levels = _order_by_resolution(_level_convs(graph, head), graph, input_hw)
    old_input = graph.input[0].name
    # keep only the nodes the level tensors depend on (drops the converter's split/reshape tail)
    producers = {o: n for n in graph.node for o in n.output}
    needed: set[int] = set()
    stack = list(levels)
    while stack:
        node = producers.get(stack.pop())
        if node is None or id(node) in needed:
            continue
        needed.add(id(node))
        stack.extend(node.input)
    body = _fold_pads([n for n in graph.node if id(n) in needed], graph)
    for node in body:  # the old input now comes out of the pre-processing
        for i, name in enumerate(node.input):
            if name == old_input:
                node.input[i] = "pre/normalised"
    body, levels, kept_inits = _canonical_names(body, levels, graph)
    pre_nodes, pre_inits = _preprocess_nodes(head, "images", "pre/normalised")
    tail_nodes: list[NodeProto] = []
    tail_inits: list[TensorProto] = []
    outs = []
    for level, (feature, stride) in enumerate(zip(levels, head.strides, strict=True)):
        nodes, inits, out = _level_decode_nodes(head, feature, stride, level)
        tail_nodes += nodes
        tail_inits += inits
        outs.append(out)
    tail_nodes.append(helper.make_node("Concat", outs, ["output0"], name="gfl/concat", axis=2))
    new_graph = helper.make_graph(
        pre_nodes + body + tail_nodes,
        "gfl_detector",
        [helper.make_tensor_value_info("images", onnx.TensorProto.FLOAT, ["batch", 3, "h", "w"])],
        [
            helper.make_tensor_value_info(
                "output0", onnx.TensorProto.FLOAT, ["batch", 4 + head.num_classes, "anchors"]
            )
        ],
        initializer=pre_inits + kept_inits + tail_inits,
    )
    opset = max(13, *(o.version for o in src.opset_import if o.domain in ("", "ai.onnx")))
    out_model = helper.make_model(
        new_graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="vision-toolchain"
    )
    out_model.ir_version = min(src.ir_version or 8, 8)
    if metadata:
        helper.set_model_props(out_model, metadata)
    onnx.checker.check_model(out_model)
    return out_model


def decode_gfl_reference(
    levels: Sequence[npt.NDArray[np.float32]], head: GflHead
) -> npt.NDArray[np.float32]:
    """The same decoding in numpy, from per-level `(B, C + 4 * bins, h, w)` maps: for tests."""
    outs = []
    bins = head.reg_max + 1
    for feature, stride in zip(levels, head.strides, strict=True):
        b, _, h, w = feature.shape
        logits = feature[:, : head.num_classes].reshape(b, head.num_classes, -1)
        cls = 1 / (1 + np.exp(-np.clip(logits, -80, 80)))
        reg = feature[:, head.num_classes :].reshape(b, 4, bins, h * w)
        prob = np.exp(reg - reg.max(axis=2, keepdims=True))
        prob /= prob.sum(axis=2, keepdims=True)
        dist = (prob * np.arange(bins, dtype=np.float32)[None, None, :, None]).sum(axis=2) * stride
        ys, xs = np.mgrid[0:h, 0:w]
        cx = (xs.reshape(-1) + 0.5) * stride
        cy = (ys.reshape(-1) + 0.5) * stride
        left, top, right, bottom = dist[:, 0], dist[:, 1], dist[:, 2], dist[:, 3]
        box = np.stack(
            [cx + (right - left) / 2, cy + (bottom - top) / 2, left + right, top + bottom], axis=1
        )
        outs.append(np.concatenate([box, cls], axis=1).astype(np.float32))
    return np.concatenate(outs, axis=2)
