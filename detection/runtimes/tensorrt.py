"""TensorRT 10 backend: a serialized engine on an NVIDIA GPU, buffers through `cuda-python`.

The module imports without TensorRT; the constructor imports it and raises
`RuntimeUnavailableError` where it is not installed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from detection.errors import ModelLoadError, RuntimeUnavailableError
from detection.runtimes._io import FloatArray, check_images, chunks, layout_of, to_layout
from detection.runtimes.base import EMPTY_METADATA, InputSpec, register_runtime
from detection.runtimes.config import TensorRTConfig

logger = logging.getLogger(__name__)


TENSORRT_NOT_INSTALLED = (
    "TensorRT is not installed (needs the `gpu` extra on a machine with an NVIDIA GPU)"
)


def import_tensorrt(missing_message: str = TENSORRT_NOT_INSTALLED) -> Any:
    """The `tensorrt` module, or `RuntimeUnavailableError(missing_message)` where it is absent."""
    try:
        import tensorrt
    except ImportError as exc:
        raise RuntimeUnavailableError(missing_message) from exc
    return tensorrt


def import_cudart(needed_for: str = "TensorRT") -> Any:
    """cuda-python's runtime module (either layout), or a clear `RuntimeUnavailableError`."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # cuda-python before 12.6
        except ImportError as exc:
            raise RuntimeUnavailableError(
                f"cuda-python is not installed; {needed_for} needs it (the `gpu` extra)"
            ) from exc
    return cudart


class _Cuda:
    """The few CUDA runtime calls the engine needs, each checked for errors."""

    def __init__(self, cudart: Any) -> None:
        self._rt = cudart

    def call(self, what: str, result: tuple[Any, ...]) -> Any:
        """Raise on a CUDA error; return the call's value (or None)."""
        err = result[0]
        if err != self._rt.cudaError_t.cudaSuccess:
            message = self._rt.cudaGetErrorString(err)[1]
            raise RuntimeError(f"CUDA {what} failed: {err} {message!r}")
        return result[1] if len(result) > 1 else None

    def set_device(self, device_id: int) -> None:
        """Make `device_id` current for this thread."""
        self.call("cudaSetDevice", self._rt.cudaSetDevice(device_id))

    def stream(self) -> Any:
        """A new stream."""
        return self.call("cudaStreamCreate", self._rt.cudaStreamCreate())

    def malloc(self, nbytes: int) -> int:
        """Device memory of `nbytes`; returns the address."""
        return int(self.call("cudaMalloc", self._rt.cudaMalloc(nbytes)))

    def free(self, ptr: int) -> None:
        """Free device memory."""
        self.call("cudaFree", self._rt.cudaFree(ptr))

    def to_device(self, dst: int, src: np.ndarray[Any, Any], stream: Any) -> None:
        """Copy a contiguous host array to device memory on `stream`."""
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        result = self._rt.cudaMemcpyAsync(dst, src.ctypes.data, src.nbytes, kind, stream)
        self.call("cudaMemcpyAsync", result)

    def to_host(self, dst: np.ndarray[Any, Any], src: int, stream: Any) -> None:
        """Copy device memory into a contiguous host array on `stream`."""
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        result = self._rt.cudaMemcpyAsync(dst.ctypes.data, src, dst.nbytes, kind, stream)
        self.call("cudaMemcpyAsync", result)

    def synchronize(self, stream: Any) -> None:
        """Wait for everything queued on `stream`."""
        self.call("cudaStreamSynchronize", self._rt.cudaStreamSynchronize(stream))

    def destroy(self, stream: Any) -> None:
        """Destroy a stream."""
        self.call("cudaStreamDestroy", self._rt.cudaStreamDestroy(stream))


class _DeviceBuffer:
    """Device memory that grows to the largest size asked for."""

    def __init__(self, cuda: _Cuda) -> None:
        self._cuda = cuda
        self.ptr = 0
        self.nbytes = 0

    def ensure(self, nbytes: int) -> int:
        """At least `nbytes` of device memory; returns its address."""
        if nbytes > self.nbytes:
            self.release()
            self.ptr = self._cuda.malloc(nbytes)
            self.nbytes = nbytes
        return self.ptr

    def release(self) -> None:
        """Free the memory."""
        if self.ptr:
            self._cuda.free(self.ptr)
        self.ptr, self.nbytes = 0, 0


@register_runtime("tensorrt")
class TensorRTRuntime:
    """A YOLO TensorRT engine with one image input; fixed or dynamic batch (profile 0)."""

    name: str = "tensorrt"

    def __init__(self, config: TensorRTConfig) -> None:
        trt = import_tensorrt()
        self._cuda = _Cuda(import_cudart())
        path = config.engine_path
        if not path.is_file():
            raise ModelLoadError(f"TensorRT engine file not found: {path}")
        self._cuda.set_device(config.device_id)
        self._trt_logger = trt.Logger(trt.Logger.WARNING)
        self._engine: Any = trt.Runtime(self._trt_logger).deserialize_cuda_engine(path.read_bytes())
        if self._engine is None:
            raise ModelLoadError(
                f"cannot deserialize TensorRT engine {path} (corrupt, or built for another "
                "TensorRT version / GPU)"
            )
        self._context: Any = self._engine.create_execution_context()
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        inputs = [n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        if len(inputs) != 1:
            raise ModelLoadError(f"{path}: expected one input tensor, found {inputs}")
        self._input = inputs[0]
        self._outputs = [n for n in names if n != self._input]
        self._dtypes = {n: np.dtype(trt.nptype(self._engine.get_tensor_dtype(n))) for n in names}
        self._spec = self._input_spec(path, config.max_batch_size)
        self._stream = self._cuda.stream()
        self._buffers = {n: _DeviceBuffer(self._cuda) for n in names}
        logger.info(
            "loaded TensorRT engine %s on GPU %s: input %s %s, outputs %s",
            path,
            config.device_id,
            self._input,
            self._spec,
            self._outputs,
        )

    def _input_spec(self, path: object, configured_max_batch: int) -> InputSpec:
        shape = tuple(int(d) for d in self._engine.get_tensor_shape(self._input))
        layout = layout_of(shape)
        if layout is None:
            raise ModelLoadError(f"{path}: input shape {shape}; expected (B,3,H,W) or (B,H,W,3)")
        self._dynamic_batch = shape[0] < 0
        if self._dynamic_batch:
            _, _, max_shape = self._engine.get_tensor_profile_shape(self._input, 0)
            max_batch = min(int(max_shape[0]), configured_max_batch)
        else:
            max_batch = shape[0]
        h, w = (shape[2], shape[3]) if layout == "NCHW" else (shape[1], shape[2])
        return InputSpec(
            height=h if h > 0 else None,
            width=w if w > 0 else None,
            layout=layout,
            max_batch_size=max_batch,
        )

    @property
    def input_spec(self) -> InputSpec:
        """Input size (None where dynamic), largest batch per run and layout."""
        return self._spec

    @property
    def metadata(self) -> Mapping[str, str]:
        """Always empty: a serialized engine keeps no metadata of the model it was built from, so
        class names come from config (`class_names`)."""
        return EMPTY_METADATA

    def infer(self, images: FloatArray) -> FloatArray:
        """Run `images (B,3,H,W)` float32 RGB 0..1 in batches the engine accepts; float32 out."""
        check_images(images, self._spec)
        batch = self._spec.max_batch_size or images.shape[0]
        outputs = []
        for piece in chunks(images, batch):
            n = piece.shape[0]
            if not self._dynamic_batch and n < batch:
                pad = np.zeros((batch - n, *piece.shape[1:]), np.float32)
                piece = np.concatenate([piece, pad])
            outputs.append(self._run(piece)[:n])
        return np.concatenate(outputs)

    def _run(self, images: FloatArray) -> FloatArray:
        if self._context is None:
            raise RuntimeError("TensorRT runtime is closed")
        host_in = to_layout(images, self._spec.layout).astype(self._dtypes[self._input])
        if not self._context.set_input_shape(self._input, host_in.shape):
            raise ValueError(f"engine rejects input shape {host_in.shape}")
        ptr = self._buffers[self._input].ensure(host_in.nbytes)
        self._context.set_tensor_address(self._input, ptr)
        self._cuda.to_device(ptr, host_in, self._stream)
        host_out: dict[str, np.ndarray[Any, Any]] = {}
        for name in self._outputs:
            shape = tuple(self._context.get_tensor_shape(name))
            host_out[name] = np.empty(shape, dtype=self._dtypes[name])
            address = self._buffers[name].ensure(max(host_out[name].nbytes, 1))
            self._context.set_tensor_address(name, address)
        if not self._context.execute_async_v3(int(self._stream)):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        for name, array in host_out.items():
            self._cuda.to_host(array, self._buffers[name].ptr, self._stream)
        self._cuda.synchronize(self._stream)
        return host_out[self._outputs[0]].astype(np.float32)

    def close(self) -> None:
        """Free device buffers and the stream, drop the engine."""
        if self._context is None:
            return
        for buffer in self._buffers.values():
            buffer.release()
        self._cuda.destroy(self._stream)
        self._context = None
        self._engine = None
