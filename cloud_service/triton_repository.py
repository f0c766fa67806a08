"""Put an ONNX detector into a Triton model repository as a new version.

Layout written (Triton's own)::

    <repository>/<name>/config.pbtxt        shared by every version of the model
    <repository>/<name>/<version>/model.onnx
    <repository>/<name>/<version>/model.py  (backend `python` only: runs model.onnx)

`config.pbtxt` is written with the first version: the input and output from the ONNX graph
(batch axis left to Triton: `max_batch_size`), Triton's dynamic batching, the version policy
and the model's metadata (`class_names`, `box_units`, ...) as `parameters`, which the service's
`triton` engine reads as the model's metadata. A later version must have the same input and
output (names, types, dims): Triton serves all versions with one config; it is refused
otherwise.

Backends: `onnxruntime` for a Triton with the ONNX Runtime backend (the NGC images), `python`
for one without it (PyTriton's bundled server): `triton_python_model.py` runs the file. A
TensorRT plan is built on the target GPU instead (see deploy/triton/README.md).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from detection.errors import ModelLoadError

Backend = Literal["python", "onnxruntime"]
VersionPolicy = Literal["latest", "all"]
PYTHON_MODEL = Path(__file__).with_name("triton_python_model.py")
_ONNX_TYPES = {"tensor(float)": "TYPE_FP32", "tensor(float16)": "TYPE_FP16"}


@dataclass(frozen=True)
class TensorSignature:
    """A model input or output: name, Triton data type, dims without the batch axis."""

    name: str
    data_type: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class OnnxSignature:
    """What the repository needs to know about an ONNX detector."""

    input: TensorSignature
    output: TensorSignature
    metadata: dict[str, str]


def read_onnx_signature(path: Path) -> OnnxSignature:
    """The first input and output of an ONNX model (batch axis dropped) and its metadata."""
    import onnxruntime as ort

    if not path.is_file():
        raise ModelLoadError(f"ONNX model file not found: {path}")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT's own pybind exception types
        raise ModelLoadError(f"cannot load ONNX model {path}: {exc}") from exc

    def signature(arg: Any) -> TensorSignature:
        name, kind, shape = arg.name, arg.type, arg.shape
        if kind not in _ONNX_TYPES:
            raise ModelLoadError(f"{path}: tensor {name!r} is {kind}; expected float or float16")
        dims = tuple(d if isinstance(d, int) and d > 0 else -1 for d in shape[1:])
        return TensorSignature(name=name, data_type=_ONNX_TYPES[kind], dims=dims)

    metadata = {str(k): str(v) for k, v in session.get_modelmeta().custom_metadata_map.items()}
    return OnnxSignature(
        input=signature(session.get_inputs()[0]),
        output=signature(session.get_outputs()[0]),
        metadata=metadata,
    )


def _text(value: str) -> str:
    """A protobuf text-format string literal."""
    return json.dumps(value, ensure_ascii=False)


def render_config(
    name: str,
    signature: OnnxSignature,
    *,
    backend: Backend,
    max_batch_size: int,
    max_queue_delay_us: int,
    instances: int,
    version_policy: VersionPolicy,
    intra_op_threads: int = 0,
) -> str:
    """The `config.pbtxt` text for `name` (Triton's model configuration)."""
    tensors = []
    for kind, tensor in (("input", signature.input), ("output", signature.output)):
        dims = ", ".join(str(d) for d in tensor.dims)
        tensors.append(
            f"{kind} {{ name: {_text(tensor.name)} data_type: {tensor.data_type} "
            f"dims: [ {dims} ] }}"
        )
    parameters = dict(signature.metadata)
    if backend == "python":
        parameters["intra_op_threads"] = str(intra_op_threads)
    params = "\n".join(
        f"parameters {{ key: {_text(k)} value {{ string_value: {_text(v)} }} }}"
        for k, v in sorted(parameters.items())
    )
    policy = "latest { num_versions: 1 }" if version_policy == "latest" else "all { }"
    delay = f"max_queue_delay_microseconds: {max_queue_delay_us}"
    lines = [
        f"name: {_text(name)}",
        f"backend: {_text(backend)}",
        f"max_batch_size: {max_batch_size}",
        *tensors,
        f"dynamic_batching {{ {delay} }}" if max_batch_size > 0 else "",
        f"instance_group {{ kind: KIND_CPU count: {instances} }}",
        f"version_policy {{ {policy} }}",
        params,
    ]
    return "\n".join(line for line in lines if line) + "\n"


def _check_same_signature(config_path: Path, signature: OnnxSignature) -> Backend:
    """Refuse a version whose inputs or outputs (names, types, dims) differ from the config;
    returns the config's backend (a later version is laid out for it)."""
    from google.protobuf import text_format

    from protos.inference.v2 import inference_pb2 as pb

    config = text_format.Parse(config_path.read_text(), pb.ModelConfig(), allow_unknown_field=True)

    def described(tensors: Any) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(t.name, pb.DataType.Name(t.data_type), tuple(t.dims)) for t in tensors]

    have = (described(config.input), described(config.output))
    want = (
        [(signature.input.name, signature.input.data_type, signature.input.dims)],
        [(signature.output.name, signature.output.data_type, signature.output.dims)],
    )
    if have != want:
        raise ModelLoadError(
            f"{config_path}: the model takes inputs/outputs {have}, the new version {want}; "
            "every version of a Triton model shares one config: give it another model name"
        )
    return "onnxruntime" if config.backend == "onnxruntime" else "python"


def add_version(
    repository: Path,
    name: str,
    onnx_path: Path,
    version: int,
    *,
    backend: Backend = "python",
    max_batch_size: int = 16,
    max_queue_delay_us: int = 2000,
    instances: int = 1,
    version_policy: VersionPolicy = "latest",
    intra_op_threads: int = 0,
) -> Path:
    """Copy `onnx_path` into `repository/name/version/` (writing `config.pbtxt` for the first
    version; a later one follows its backend, the other options are the first's); returns the
    version folder. The version folder is written under a temporary name
    and renamed, so a Triton polling the repository never sees half a version."""
    if version < 1:
        raise ValueError(f"Triton versions start at 1, got {version}")
    signature = read_onnx_signature(onnx_path)
    model_dir = repository / name
    final = model_dir / str(version)
    if final.exists():
        raise FileExistsError(f"{final} exists: versions are immutable, pick a new number")
    model_dir.mkdir(parents=True, exist_ok=True)
    config_path = model_dir / "config.pbtxt"
    if config_path.exists():
        backend = _check_same_signature(config_path, signature)
    else:
        config_path.write_text(
            render_config(
                name,
                signature,
                backend=backend,
                max_batch_size=max_batch_size,
                max_queue_delay_us=max_queue_delay_us,
                instances=instances,
                version_policy=version_policy,
                intra_op_threads=intra_op_threads,
            )
        )
    staging = model_dir / f".{version}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    shutil.copyfile(onnx_path, staging / "model.onnx")
    if backend == "python":
        shutil.copyfile(PYTHON_MODEL, staging / "model.py")
    staging.rename(final)
    return final
