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


RuntimeConfig = Annotated[
    OnnxRuntimeConfig | LiteRTConfig | TensorRTConfig, Field(discriminator="type")
]
