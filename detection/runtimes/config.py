"""Config models of the runtimes, one per backend, told apart by their `type` field."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from configkit.base import StrictModel


class OnnxRuntimeConfig(StrictModel):
    """ONNX Runtime: any machine; CUDA / TensorRT execution providers where installed."""

    type: Literal["onnxruntime"] = "onnxruntime"
    model_path: Path = Field(description="ONNX model file.")
    providers: list[str] = Field(
        default_factory=lambda: ["CPUExecutionProvider"],
        min_length=1,
        description="Execution providers in order of preference; unavailable ones are skipped.",
    )
    intra_op_threads: int = Field(
        default=0, ge=0, le=256, description="Threads per operator; 0 lets ONNX Runtime choose."
    )
    allow_spinning: bool = Field(
        default=True,
        description=(
            "Let idle worker threads spin for work (ONNX Runtime's default): lowest latency on a "
            "dedicated machine; turn off on a small shared edge CPU, where spinning starves the "
            "other stages."
        ),
    )


class LiteRTConfig(StrictModel):
    """LiteRT (TFLite) interpreter: INT8 models on CPUs, Qualcomm, Edge TPU via delegates."""

    type: Literal["litert"] = "litert"
    model_path: Path = Field(description="`.tflite` model file.")
    num_threads: int = Field(default=2, ge=1, le=64, description="CPU interpreter threads.")
    delegate_path: Path | None = Field(
        default=None,
        description="External delegate library (QNN/Hexagon, GPU, Edge TPU); none runs on CPU.",
    )
    delegate_options: dict[str, str] = Field(
        default_factory=dict, description="Options passed to the external delegate."
    )


class TensorRTConfig(StrictModel):
    """TensorRT 10 engine on an NVIDIA GPU (Jetson or data-centre)."""

    type: Literal["tensorrt"] = "tensorrt"
    engine_path: Path = Field(description="Serialized TensorRT engine built on the target GPU.")
    device_id: int = Field(default=0, ge=0, le=63, description="CUDA device ordinal.")
    max_batch_size: int = Field(
        default=1, ge=1, le=256, description="Largest batch the engine's profile accepts."
    )


class TritonConfig(StrictModel):
    """A model served by NVIDIA Triton Inference Server (or any Open Inference Protocol v2
    server), reached over gRPC: the service keeps decoding, letterboxing and batching and sends
    the preprocessed batch; Triton runs it (TensorRT plan, ONNX, Python backend, ...)."""

    type: Literal["triton"] = "triton"
    url: str = Field(
        pattern=r"^[A-Za-z0-9_.\[\]:-]+:[0-9]{1,5}$",
        description="Triton's gRPC endpoint, `host:port` (port 8001 by default in Triton).",
    )
    model_name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$",
        description="Model name in Triton's model repository.",
    )
    model_version: str = Field(
        default="",
        pattern=r"^([0-9]{1,18})?$",
        description=(
            "Version to ask for; empty: Triton's version policy picks (the newest loaded), so a "
            "new version Triton loads takes the traffic without a restart here."
        ),
    )
    request_timeout_s: float = Field(
        default=5.0,
        gt=0.0,
        le=600.0,
        description="Longest wait for one inference call; past it the frames get UNAVAILABLE.",
    )
    startup_timeout_s: float = Field(
        default=60.0,
        ge=0.0,
        le=3600.0,
        description=(
            "How long start-up waits for Triton and the model to be ready before it fails "
            "with a clear error (0: check once)."
        ),
    )
    max_message_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024 * 1024,
        le=2**31 - 1,
        description="gRPC message limit both ways (a batch of 640x640 FP32 frames is 4.9 MB each).",
    )


RuntimeConfig = Annotated[
    OnnxRuntimeConfig | LiteRTConfig | TensorRTConfig | TritonConfig, Field(discriminator="type")
]
