"""The YOLOv5x ONNX model for `bench/cloud/gpu_cloud.py`, carried to a GPU machine without its
weights.

YOLOv5x in float32 is ~390 MB, too large to carry. `prepare` (here, with the `tools` extra)
exports it from ultralytics' YAML at 640 with a dynamic batch and moves every Conv weight and
bias into an external-data file that it does not keep: the graph alone is small. On the GPU
machine `materialize` writes that file again with seeded random float32 values, which costs what
trained weights cost (the benchmark measures speed, not accuracy).
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import numpy as np

from bench.harness import REPO_ROOT

logger = logging.getLogger(__name__)

MODEL_DIR = REPO_ROOT / ".cache" / "gpu-bench"
MODEL_NAME = "yolov5x-640"
IMGSZ = 640
WEIGHT_SCALE = 0.02  # std of the random weights: keeps activations finite through the network


def prepare(model_dir: Path = MODEL_DIR, spec: str = "yolov5x.yaml") -> Path:
    """Export `spec`, externalise its Conv tensors, keep graph + sidecar JSON; return the graph."""
    import onnx
    from onnx import external_data_helper, numpy_helper

    from detection.toolchain.export import export_onnx

    with tempfile.TemporaryDirectory() as work:
        exported = export_onnx(spec, Path(work), IMGSZ, dynamic=True)
        model = onnx.load(str(exported))
    conv_inputs = {n for node in model.graph.node if node.op_type == "Conv" for n in node.input[1:]}
    weights = f"{MODEL_NAME}.weights"
    offset, count = 0, 0
    for tensor in model.graph.initializer:
        if tensor.name not in conv_inputs or tensor.data_type != onnx.TensorProto.FLOAT:
            continue
        nbytes = numpy_helper.to_array(tensor).nbytes
        if not tensor.HasField("raw_data"):  # set_external_data needs raw_data to replace
            tensor.raw_data = numpy_helper.to_array(tensor).tobytes()
            tensor.ClearField("float_data")
        external_data_helper.set_external_data(tensor, weights, offset=offset, length=nbytes)
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        offset, count = offset + nbytes, count + 1
    model_dir.mkdir(parents=True, exist_ok=True)
    graph = model_dir / f"{MODEL_NAME}.onnx"
    onnx.save(model, str(graph))
    sidecar = {"weights_file": weights, "weights_bytes": offset, "tensors": count, "spec": spec}
    (model_dir / f"{MODEL_NAME}.json").write_text(json.dumps(sidecar, indent=1))
    logger.info(
        "wrote %s (%s KiB) without %s MB of weights",
        graph,
        graph.stat().st_size // 1024,
        offset // 10**6,
    )
    return graph


def materialize(model_dir: Path = MODEL_DIR, seed: int = 0) -> Path:
    """Write the random weights next to the graph (once); return the graph's path."""
    graph = model_dir / f"{MODEL_NAME}.onnx"
    sidecar_path = model_dir / f"{MODEL_NAME}.json"
    if not graph.is_file() or not sidecar_path.is_file():
        raise FileNotFoundError(
            f"{graph} not found: run `python -m bench.cloud.gpu_cloud --prepare` where the tools "
            "extra is installed and carry .cache/gpu-bench"
        )
    sidecar = json.loads(sidecar_path.read_text())
    weights = model_dir / sidecar["weights_file"]
    size = int(sidecar["weights_bytes"])
    if not weights.is_file() or weights.stat().st_size != size:
        rng = np.random.default_rng(seed)
        values = rng.standard_normal(size // 4, dtype=np.float32) * np.float32(WEIGHT_SCALE)
        values.tofile(weights)
    return graph
