"""Triton backend: the model runs in NVIDIA Triton Inference Server, reached over gRPC.

The caller keeps everything up to the model input (decoding, letterboxing, batching) and this
runtime sends the preprocessed FP32 batch with the Open Inference Protocol v2 (`ModelInfer`,
raw tensor contents) to the model and version named in `TritonConfig`. Any v2 server with the
same protocol works; Triton is the one tested.

* Start-up waits up to `startup_timeout_s` for the server and the model to be ready, then reads
  the model's metadata (input / output names and shapes) and config (`max_batch_size`,
  `parameters`). A server that never answers, or that lacks the model, is a `ModelLoadError`
  naming both, never a hang.
* `parameters` of the model's `config.pbtxt` are the model metadata (`class_names`,
  `box_units`, `model_name`, ...; see `detection.model_metadata`), as ONNX `metadata_props` are
  for a file.
* Each call has a deadline (`request_timeout_s`); a failed or late call raises
  `InferenceUnavailableError`, which the cloud service answers per frame with UNAVAILABLE.
* `answered_version` is the version that answered the last call: with `model_version` empty
  Triton's version policy picks it, so a version Triton loads later takes over without a
  restart here and the answers say so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import grpc
import numpy as np

from detection.errors import InferenceUnavailableError, ModelLoadError
from detection.runtimes._io import FloatArray, check_images, chunks, layout_of, to_layout
from detection.runtimes.base import InputSpec, register_runtime
from detection.runtimes.config import TritonConfig
from protos.inference.v2 import inference_pb2 as pb
from protos.inference.v2 import inference_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

_POLL_S = 0.25
_CHECK_TIMEOUT_S = 2.0
# v2 tensor data types this runtime sends or reads, with their numpy types.
_DTYPES: dict[str, type[np.floating[Any]]] = {
    "FP32": np.float32,
    "FP16": np.float16,
}
# Codes after which a call may succeed later (server restarting, model reloading, overload).
_TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
}


def _where(config: TritonConfig) -> str:
    version = config.model_version or "<policy>"
    return f"Triton at {config.url}, model {config.model_name!r} version {version}"


def _wait_until_ready(stub: pb_grpc.GRPCInferenceServiceStub, config: TritonConfig) -> None:
    """Block until the server and the model are ready, or raise `ModelLoadError` saying which
    was not, after `startup_timeout_s`."""
    deadline = time.monotonic() + config.startup_timeout_s
    problem = "no answer"
    while True:
        try:
            if not stub.ServerReady(pb.ServerReadyRequest(), timeout=_CHECK_TIMEOUT_S).ready:
                problem = "server not ready"
            else:
                ready = stub.ModelReady(
                    pb.ModelReadyRequest(name=config.model_name, version=config.model_version),
                    timeout=_CHECK_TIMEOUT_S,
                ).ready
                if ready:
                    return
                problem = "model not ready (not in the repository, not loaded or failed to load)"
        except grpc.RpcError as exc:
            problem = f"{exc.code().name}: {exc.details()}"
        if time.monotonic() >= deadline:
            raise ModelLoadError(
                f"{_where(config)}: {problem} after {config.startup_timeout_s:g} s"
            )
        time.sleep(_POLL_S)


def _input_spec(
    config: TritonConfig, metadata: pb.ModelMetadataResponse, max_batch_size: int
) -> tuple[InputSpec, str]:
    """The model's input as an `InputSpec` (and its v2 data type)."""
    if len(metadata.inputs) != 1 or not metadata.outputs:
        raise ModelLoadError(
            f"{_where(config)}: expected one image input and an output, got inputs "
            f"{[i.name for i in metadata.inputs]} and outputs {[o.name for o in metadata.outputs]}"
        )
    tensor = metadata.inputs[0]
    if tensor.datatype not in _DTYPES:
        raise ModelLoadError(
            f"{_where(config)}: input {tensor.name!r} is {tensor.datatype}; expected FP32 or FP16"
        )
    # The metadata shape has the batch axis first (-1) when the model batches.
    dims = list(tensor.shape[1:] if max_batch_size > 0 else tensor.shape)
    shape = (1, *dims)
    layout = layout_of(tuple(int(d) for d in shape))
    if layout is None:
        raise ModelLoadError(
            f"{_where(config)}: input {tensor.name!r} has shape {list(tensor.shape)}; "
            "expected (3, H, W) or (H, W, 3) per image"
        )
    h, w = (dims[1], dims[2]) if layout == "NCHW" else (dims[0], dims[1])
    spec = InputSpec(
        height=int(h) if h > 0 else None,
        width=int(w) if w > 0 else None,
        layout=layout,
        max_batch_size=max(max_batch_size, 1),
    )
    return spec, tensor.datatype


@register_runtime("triton")
class TritonRuntime:
    """A YOLO model served by Triton; batches up to the model's `max_batch_size` per call."""

    name: str = "triton"

    def __init__(self, config: TritonConfig) -> None:
        self._config = config
        limit = config.max_message_bytes
        self._channel: grpc.Channel | None = grpc.insecure_channel(
            config.url,
            options=[
                ("grpc.max_send_message_length", limit),
                ("grpc.max_receive_message_length", limit),
                # A restarted Triton is found again within ~2 s, not after gRPC's default
                # back-off of up to 120 s; calls meanwhile fail fast (UNAVAILABLE per frame).
                ("grpc.initial_reconnect_backoff_ms", 250),
                ("grpc.min_reconnect_backoff_ms", 250),
                ("grpc.max_reconnect_backoff_ms", 2000),
            ],
        )
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        try:
            _wait_until_ready(self._stub, config)
            request = {"name": config.model_name, "version": config.model_version}
            try:
                metadata = self._stub.ModelMetadata(
                    pb.ModelMetadataRequest(**request), timeout=_CHECK_TIMEOUT_S
                )
                model_config = self._stub.ModelConfig(
                    pb.ModelConfigRequest(**request), timeout=_CHECK_TIMEOUT_S
                ).config
            except grpc.RpcError as exc:
                raise ModelLoadError(
                    f"{_where(config)}: cannot read the model's metadata: "
                    f"{exc.code().name}: {exc.details()}"
                ) from exc
            self._batching = model_config.max_batch_size > 0
            self._spec, self._input_type = _input_spec(
                config, metadata, model_config.max_batch_size
            )
        except Exception:
            self.close()
            raise
        # A batching model takes any batch up to its max: the engine sizes batches by it.
        self.dynamic_batch = self._batching
        self._input_name = metadata.inputs[0].name
        self._output_name = metadata.outputs[0].name
        params = {k: v.string_value for k, v in model_config.parameters.items()}
        params.setdefault("model_name", config.model_name)
        self._metadata = MappingProxyType(params)
        self._lock = threading.Lock()
        self._answered_version: str | None = None
        logger.info(
            "Triton model %s (versions %s, %s) at %s: input %s %s, output %s, max batch %s",
            config.model_name,
            list(metadata.versions),
            metadata.platform or model_config.backend,
            config.url,
            self._input_name,
            list(metadata.inputs[0].shape),
            self._output_name,
            model_config.max_batch_size,
        )

    @property
    def input_spec(self) -> InputSpec:
        """The model's input size (None where dynamic), batch limit and layout."""
        return self._spec

    @property
    def metadata(self) -> Mapping[str, str]:
        """The `parameters` of the model's Triton config, plus its name."""
        return self._metadata

    @property
    def answered_version(self) -> str | None:
        """The model version that answered the last call (None before the first)."""
        with self._lock:
            return self._answered_version

    def infer(self, images: FloatArray) -> FloatArray:
        """Run `images (B,3,H,W)` float32 RGB 0..1 on Triton; the first output as float32.

        Raises `InferenceUnavailableError` when Triton does not answer in time or fails.
        """
        check_images(images, self._spec)
        # max_batch_size is 1 for a model without batching: one image per call, no batch axis
        size = self._spec.max_batch_size or 1
        return np.concatenate([self._call(piece) for piece in chunks(images, size)])

    def _call(self, images: FloatArray) -> FloatArray:
        if self._channel is None:
            raise RuntimeError("Triton runtime is closed")
        feed = to_layout(images, self._spec.layout).astype(_DTYPES[self._input_type], copy=False)
        shape = list(feed.shape) if self._batching else list(feed.shape[1:])
        request = pb.ModelInferRequest(
            model_name=self._config.model_name,
            model_version=self._config.model_version,
            inputs=[
                pb.ModelInferRequest.InferInputTensor(
                    name=self._input_name, datatype=self._input_type, shape=shape
                )
            ],
            outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name=self._output_name)],
            raw_input_contents=[feed.astype(feed.dtype.newbyteorder("<"), copy=False).tobytes()],
        )
        try:
            response = self._stub.ModelInfer(request, timeout=self._config.request_timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()
            kind = "unavailable" if code in _TRANSIENT else "failed"
            raise InferenceUnavailableError(
                f"{_where(self._config)}: inference {kind}: {code.name}: {exc.details()}"
            ) from exc
        output = self._output_of(response)
        if not self._batching:
            output = output[np.newaxis]
        with self._lock:
            self._answered_version = response.model_version or None
        return output

    def _output_of(self, response: pb.ModelInferResponse) -> FloatArray:
        for index, tensor in enumerate(response.outputs):
            if tensor.name != self._output_name:
                continue
            dtype = _DTYPES.get(tensor.datatype)
            if dtype is None or index >= len(response.raw_output_contents):
                raise InferenceUnavailableError(
                    f"{_where(self._config)}: output {tensor.name!r} came as {tensor.datatype} "
                    "without raw contents; expected FP32 or FP16"
                )
            raw = np.frombuffer(
                response.raw_output_contents[index], dtype=np.dtype(dtype).newbyteorder("<")
            )
            return raw.reshape(tuple(tensor.shape)).astype(np.float32)
        raise InferenceUnavailableError(
            f"{_where(self._config)}: the answer has no output {self._output_name!r}"
        )

    def close(self) -> None:
        """Close the gRPC channel."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
