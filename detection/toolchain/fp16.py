"""Store an ONNX model's float weights as float16 (half the file), still computing in float32.

Each float32 initializer becomes a float16 initializer followed by a `Cast` to float32; ONNX
Runtime folds the casts at load time, so CPUs without float16 kernels run it unchanged. Accuracy
changes only by the rounding of the weights to float16.
"""

from __future__ import annotations

import logging
from pathlib import Path

from detection.errors import ExportError

logger = logging.getLogger(__name__)

_MIN_ELEMENTS = 16  # tiny tensors (shapes, scalars) stay as they are: no gain, more nodes


FP16_SUFFIX = "__fp16"
"""What `store_weights_fp16` appends to the name of an initializer it stores as float16 (a Cast
node makes the float32 tensor of the original name from it)."""


def store_weights_fp16(source: Path, target: Path) -> Path:
    """Write `target`: `source` with its large float32 initializers stored as float16."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if not source.is_file():
        raise ExportError(f"ONNX model not found: {source}")
    model = onnx.load(str(source))
    graph = model.graph
    casts = []
    converted = 0
    for init in list(graph.initializer):
        if init.data_type != TensorProto.FLOAT:
            continue
        array = numpy_helper.to_array(init)
        if array.size < _MIN_ELEMENTS or np.abs(array).max(initial=0.0) > 65000:
            continue
        half_name = f"{init.name}{FP16_SUFFIX}"
        graph.initializer.remove(init)
        graph.initializer.append(numpy_helper.from_array(array.astype(np.float16), half_name))
        casts.append(helper.make_node("Cast", [half_name], [init.name], to=TensorProto.FLOAT))
        converted += 1
    for index, node in enumerate(casts):
        graph.node.insert(index, node)
    onnx.checker.check_model(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(target))
    logger.info("stored %d initializers of %s as float16 in %s", converted, source, target)
    return target
