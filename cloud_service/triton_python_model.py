"""A Triton Python-backend model that runs an ONNX file with ONNX Runtime.

`cloud-service triton-repository` copies this file as `<model>/<version>/model.py` next to the
version's `model.onnx`. It is what a Triton without the ONNX Runtime backend (PyTriton's bundled
server, which the tests and the bench use) runs; a production Triton loads `model.onnx` with
its `onnxruntime` backend or a TensorRT plan instead, and needs no Python here.

It depends only on numpy, onnxruntime and Triton's own `triton_python_backend_utils`, because it
runs in Triton's Python stub, not in this project's environment. The stub does not read
`PYTHONPATH`, so its entries are put first on `sys.path` here: point it at the site-packages
holding numpy and onnxruntime. Config `parameters` read: `intra_op_threads` (default 0: ONNX
Runtime's choice).
"""

from __future__ import annotations

import json
import os
import site
import sys
from pathlib import Path
from typing import Any

# First on the path: the interpreter's own site-packages may hold other numpy versions.
_ENTRIES = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
sys.path[:0] = [entry for entry in _ENTRIES if entry not in sys.path]
for _entry in _ENTRIES:
    site.addsitedir(_entry)  # its .pth files

import numpy as np  # noqa: E402 - after the site directories above


class TritonPythonModel:
    """Triton's Python-backend entry points: `initialize`, `execute`, `finalize`."""

    def initialize(self, args: dict[str, str]) -> None:
        """Open `model.onnx` of this version with ONNX Runtime on the CPU."""
        import onnxruntime as ort
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        config: dict[str, Any] = json.loads(args["model_config"])
        parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        folder = Path(args["model_repository"]) / args["model_version"]
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(parameters.get("intra_op_threads") or 0)
        self._session = ort.InferenceSession(
            str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        self._input = config["input"][0]["name"]
        self._output = config["output"][0]["name"]
        self._session_input = self._session.get_inputs()[0].name
        self._session_output = self._session.get_outputs()[0].name

    def execute(self, requests: list[Any]) -> list[Any]:
        """One ONNX Runtime call for all requests Triton batched together; one answer each."""
        pb = self._pb
        arrays = [pb.get_input_tensor_by_name(r, self._input).as_numpy() for r in requests]
        sizes = [a.shape[0] for a in arrays]
        try:
            batch = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
            outputs = self._session.run([self._session_output], {self._session_input: batch})[0]
        except Exception as exc:  # one error answer per request, never a lost one
            error = pb.TritonError(f"ONNX Runtime failed: {exc}")
            return [pb.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        responses = []
        start = 0
        for size in sizes:
            part = np.ascontiguousarray(outputs[start : start + size], dtype=np.float32)
            start += size
            responses.append(pb.InferenceResponse(output_tensors=[pb.Tensor(self._output, part)]))
        return responses

    def finalize(self) -> None:
        """Release the session."""
        self._session = None
