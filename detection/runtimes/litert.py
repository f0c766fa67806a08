"""LiteRT (TFLite) backend: INT8 models on CPUs, and on NPUs / GPUs through external delegates."""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

try:
    from ai_edge_litert.interpreter import Interpreter, load_delegate
except ImportError:  # old device images ship only the legacy interpreter
    from tflite_runtime.interpreter import Interpreter, load_delegate

from detection.errors import ModelLoadError
from detection.runtimes._io import FloatArray, check_images, layout_of, run_fixed_batch, to_layout
from detection.runtimes.base import InputSpec, register_runtime
from detection.runtimes.config import LiteRTConfig

logger = logging.getLogger(__name__)


def quantize(values: FloatArray, dtype: npt.DTypeLike, scale: float, zero_point: int) -> Any:
    """Float values to the tensor's integer type with its affine parameters (round, saturate)."""
    info = np.iinfo(dtype)
    q = np.round(values / scale) + zero_point
    return np.clip(q, info.min, info.max).astype(dtype)


def dequantize(values: npt.NDArray[Any], scale: float, zero_point: int) -> FloatArray:
    """Integer tensor values back to float32."""
    return ((values.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)).astype(
        np.float32
    )


def _quant_params(detail: dict[str, Any], path: object) -> tuple[float, int]:
    scale, zero_point = detail["quantization"]
    if np.issubdtype(detail["dtype"], np.integer) and scale == 0:
        raise ModelLoadError(
            f"{path}: integer tensor {detail['name']!r} has no quantisation scale; "
            "cannot convert it to or from float"
        )
    return float(scale), int(zero_point)


def flatbuffer_metadata(data: bytes) -> dict[str, str]:
    """The text entries of a `.tflite` flatbuffer's `metadata` table (name -> UTF-8 value).

    Binary entries (e.g. `CONVERSION_METADATA`) are skipped, trailing NULs stripped. Empty where
    the schema module is not installed (legacy `tflite-runtime`) or the table cannot be parsed.
    """
    try:
        from ai_edge_litert import schema_py_generated as schema
    except ImportError:
        return {}
    entries: dict[str, str] = {}
    try:
        model = schema.Model.GetRootAs(data, 0)
        for i in range(model.MetadataLength()):
            entry = model.Metadata(i)
            buffer = model.Buffers(entry.Buffer())
            offset, size = int(buffer.Offset()), int(buffer.Size())
            if offset > 1:  # large models keep buffers after the flatbuffer
                raw = data[offset : offset + size]
            else:
                array = buffer.DataAsNumpy()
                raw = array.tobytes() if isinstance(array, np.ndarray) else b""
            try:
                entries[entry.Name().decode("utf-8")] = raw.rstrip(b"\0").decode("utf-8")
            except UnicodeDecodeError:
                continue
    except (IndexError, ValueError, TypeError, AttributeError, struct.error) as exc:  # malformed
        logger.debug("cannot read the TFLite metadata table: %s", exc)
        return {}
    return entries


def read_metadata(config: LiteRTConfig) -> Mapping[str, str]:
    """The text metadata of the `.tflite` file (`flatbuffer_metadata`), without an interpreter."""
    path: Path = config.model_path
    if not path.is_file():
        raise ModelLoadError(f"TFLite model file not found: {path}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"cannot read TFLite model {path}: {exc}") from exc
    return MappingProxyType(flatbuffer_metadata(data))


def _load_delegates(config: LiteRTConfig) -> list[Any]:
    if config.delegate_path is None:
        return []
    path = config.delegate_path
    if not path.is_file():
        raise ModelLoadError(f"LiteRT delegate library not found: {path}")
    try:
        delegate = load_delegate(str(path), dict(config.delegate_options))
    except (ValueError, OSError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot load LiteRT delegate {path}: {exc}") from exc
    logger.info("loaded LiteRT delegate %s with options %s", path, config.delegate_options)
    return [delegate]


@register_runtime("litert")
class LiteRTRuntime:
    """A YOLO `.tflite` model: float or int8/uint8 I/O, NCHW or NHWC input, any batch size.

    A model with a fixed batch of 1 is resized to the batch asked for when its graph allows;
    otherwise the images are run one at a time.
    """

    name: str = "litert"

    def __init__(self, config: LiteRTConfig) -> None:
        if not config.model_path.is_file():
            raise ModelLoadError(f"TFLite model file not found: {config.model_path}")
        self._config = config
        self._delegates = _load_delegates(config)
        self._interpreter: Any = self._build()
        self._metadata = read_metadata(config)
        detail = self._interpreter.get_input_details()[0]
        out_detail = self._interpreter.get_output_details()[0]
        shape = tuple(int(d) for d in detail["shape"])
        layout = layout_of(shape)
        if layout is None:
            raise ModelLoadError(
                f"{config.model_path}: input shape {shape}; expected (B, 3, H, W) or (B, H, W, 3)"
            )
        self._input_shape = shape
        self._input_index: int = detail["index"]
        self._input_dtype = np.dtype(detail["dtype"])
        self._input_quant = _quant_params(detail, config.model_path)
        self._output_index: int = out_detail["index"]
        self._output_quant = _quant_params(out_detail, config.model_path)
        self._output_is_int = np.issubdtype(out_detail["dtype"], np.integer)
        self._batch = shape[0]
        self._resizable = True
        h, w = (shape[2], shape[3]) if layout == "NCHW" else (shape[1], shape[2])
        self._spec = InputSpec(height=h, width=w, layout=layout, max_batch_size=None)
        logger.info(
            "loaded TFLite model %s: input %s %s %s, quantisation in %s out %s",
            config.model_path,
            shape,
            layout,
            self._input_dtype,
            self._input_quant,
            self._output_quant,
        )

    def _build(self) -> Any:
        path = self._config.model_path
        try:
            interpreter = Interpreter(
                model_path=str(path),
                num_threads=self._config.num_threads,
                experimental_delegates=self._delegates or None,
            )
            interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as exc:
            raise ModelLoadError(f"cannot load TFLite model {path}: {exc}") from exc
        return interpreter

    @property
    def input_spec(self) -> InputSpec:
        """Fixed input size and layout; any batch size (resized or looped)."""
        return self._spec

    @property
    def metadata(self) -> Mapping[str, str]:
        """Text entries of the model's flatbuffer metadata table (often only runtime versions)."""
        return self._metadata

    def infer(self, images: FloatArray) -> FloatArray:
        """Run `images (B,3,H,W)` float32 RGB 0..1; returns the first output as float32."""
        check_images(images, self._spec)
        batch = images.shape[0]
        if self._interpreter is None:
            raise RuntimeError("LiteRT runtime is closed")
        if batch == self._batch or (self._resizable and self._resize(batch)):
            return self._run(images)
        return run_fixed_batch(images, self._batch, self._run)

    def _resize(self, batch: int) -> bool:
        """Resize the input to batch `batch`; on failure rebuild the interpreter, return False."""
        if batch == self._batch:
            return True
        shape = [batch, *self._input_shape[1:]]
        try:
            self._interpreter.resize_tensor_input(self._input_index, shape, strict=False)
            self._interpreter.allocate_tensors()
            out_shape = self._interpreter.get_output_details()[0]["shape"]
            if int(out_shape[0]) != batch:
                raise ValueError(f"output batch is {out_shape[0]} after resizing to {batch}")
        except (ValueError, RuntimeError) as exc:
            logger.info(
                "TFLite model %s cannot take batch %s (%s); running it in its own batch size",
                self._config.model_path,
                batch,
                exc,
            )
            self._resizable = False
            self._interpreter = self._build()  # a failed resize can leave it unusable
            self._batch = self._input_shape[0]
            return False
        self._batch = batch
        return True

    def _run(self, images: FloatArray) -> FloatArray:
        feed = to_layout(images, self._spec.layout)
        if np.issubdtype(self._input_dtype, np.integer):
            tensor = quantize(feed, self._input_dtype, *self._input_quant)
        else:
            tensor = feed.astype(self._input_dtype, copy=False)
        self._interpreter.set_tensor(self._input_index, tensor)
        self._interpreter.invoke()
        output = self._interpreter.get_tensor(self._output_index)
        if self._output_is_int:
            return dequantize(output, *self._output_quant)
        return np.array(output, dtype=np.float32)

    def close(self) -> None:
        """Drop the interpreter and delegates."""
        self._interpreter = None
        self._delegates = []
