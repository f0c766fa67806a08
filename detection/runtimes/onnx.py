"""ONNX Runtime backend: any machine; CUDA / TensorRT execution providers where installed."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import onnxruntime as ort

from detection.errors import ModelLoadError, RuntimeUnavailableError
from detection.runtimes._io import FloatArray, check_images, layout_of, run_fixed_batch, to_layout
from detection.runtimes.base import InputSpec, register_runtime
from detection.runtimes.config import OnnxRuntimeConfig

logger = logging.getLogger(__name__)

_INPUT_TYPES: dict[str, type[np.floating[Any]]] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
}


def _static(dim: Any) -> int | None:
    """A dimension from `NodeArg.shape`: an int when fixed, None for a symbolic or unknown axis."""
    return dim if isinstance(dim, int) and dim > 0 else None


def _select_providers(wanted: list[str]) -> list[str]:
    available = ort.get_available_providers()
    chosen = [p for p in wanted if p in available]
    for skipped in (p for p in wanted if p not in available):
        logger.info("ONNX Runtime provider %s not available here, skipped", skipped)
    if not chosen:
        raise RuntimeUnavailableError(
            f"none of the ONNX Runtime providers {wanted} is available; available: {available}"
        )
    return chosen


def _custom_metadata(session: Any) -> dict[str, str]:
    """The model's `metadata_props` (ONNX key/value strings)."""
    return {str(k): str(v) for k, v in session.get_modelmeta().custom_metadata_map.items()}


def read_metadata(config: OnnxRuntimeConfig) -> Mapping[str, str]:
    """The `metadata_props` of the model file, from a CPU-only session without graph optimisation
    (no GPU provider starts, no TensorRT engine is built: cheap enough for `validate-config`)."""
    path = config.model_path
    if not path.is_file():
        raise ModelLoadError(f"ONNX model file not found: {path}")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own pybind types (InvalidProtobuf, Fail, ...)
        raise ModelLoadError(f"cannot load ONNX model {path}: {exc}") from exc
    return MappingProxyType(_custom_metadata(session))


@register_runtime("onnxruntime")
class OnnxRuntime:
    """A YOLO model run by ONNX Runtime; float32 or float16 models, fixed or dynamic batch."""

    name: str = "onnxruntime"

    def __init__(self, config: OnnxRuntimeConfig) -> None:
        path = config.model_path
        if not path.is_file():
            raise ModelLoadError(f"ONNX model file not found: {path}")
        providers = _select_providers(config.providers)
        options = ort.SessionOptions()
        options.intra_op_num_threads = config.intra_op_threads
        if not config.allow_spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:  # ORT raises its own pybind types (InvalidProtobuf, Fail, ...)
            raise ModelLoadError(f"cannot load ONNX model {path}: {exc}") from exc
        self._session: Any = session
        self._metadata = MappingProxyType(_custom_metadata(session))
        model_input = session.get_inputs()[0]
        shape = tuple(_static(d) or -1 for d in model_input.shape)
        layout = layout_of(shape)
        if layout is None:
            raise ModelLoadError(
                f"{path}: input {model_input.name!r} has shape {model_input.shape}; "
                "expected (B, 3, H, W) or (B, H, W, 3)"
            )
        if model_input.type not in _INPUT_TYPES:
            raise ModelLoadError(
                f"{path}: input type {model_input.type} unsupported; expected float or float16"
            )
        self._input_name: str = model_input.name
        self._input_dtype = _INPUT_TYPES[model_input.type]
        self._output_name: str = self._session.get_outputs()[0].name
        h, w = (shape[2], shape[3]) if layout == "NCHW" else (shape[1], shape[2])
        self._spec = InputSpec(
            height=h if h > 0 else None,
            width=w if w > 0 else None,
            layout=layout,
            max_batch_size=shape[0] if shape[0] > 0 else None,
        )
        logger.info(
            "loaded ONNX model %s on %s: input %s %s (%s), output %s",
            path,
            self._session.get_providers(),
            self._input_name,
            model_input.shape,
            model_input.type,
            self._output_name,
        )

    @property
    def input_spec(self) -> InputSpec:
        """The model's input size (None where dynamic), batch limit and layout."""
        return self._spec

    @property
    def metadata(self) -> Mapping[str, str]:
        """The model's `metadata_props` (e.g. `class_names`, `model_name`, `box_units`)."""
        return self._metadata

    def infer(self, images: FloatArray) -> FloatArray:
        """Run `images (B,3,H,W)` float32 RGB 0..1; returns the model's first output as float32."""
        check_images(images, self._spec)
        if self._spec.max_batch_size is None:
            return self._run(images)
        return run_fixed_batch(images, self._spec.max_batch_size, self._run)

    def _run(self, images: FloatArray) -> FloatArray:
        if self._session is None:
            raise RuntimeError("ONNX runtime is closed")
        feed = to_layout(images, self._spec.layout).astype(self._input_dtype, copy=False)
        output = self._session.run([self._output_name], {self._input_name: feed})[0]
        return np.asarray(output, dtype=np.float32)

    def close(self) -> None:
        """Release the session (ONNX Runtime frees it when the last reference goes)."""
        self._session = None
