"""The `Runtime` protocol every model backend implements, and the registry that builds them."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from detection.errors import RuntimeUnavailableError

logger = logging.getLogger(__name__)

Layout = Literal["NCHW", "NHWC"]


@dataclass(frozen=True)
class InputSpec:
    """What a model takes: spatial size (None where dynamic), batch limit and memory layout."""

    height: int | None
    width: int | None
    layout: Layout
    max_batch_size: int | None  # None: any batch size (dynamic axis)


@runtime_checkable
class Runtime(Protocol):
    """A loaded model that turns a batch of images into the raw YOLO head output.

    `infer` takes float32 RGB images in 0..1, shaped `(B, 3, H, W)`, whatever the model's own
    layout or quantisation: the runtime converts (NHWC, int8) and returns float32 output.

    The built-in runtimes also expose `metadata: Mapping[str, str]`, the key/value metadata stored
    in the model file (`HasModelMetadata`); it is not a required member, so runtimes written
    before it still fit: read it with `runtime_metadata(runtime)`.
    """

    name: str

    @property
    def input_spec(self) -> InputSpec: ...

    def infer(self, images: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]: ...

    def close(self) -> None: ...


@runtime_checkable
class HasModelMetadata(Protocol):
    """A runtime that exposes the metadata stored in its model file.

    Keys the detection core reads (see `detection.model_metadata`): `class_names` (a JSON list of
    names by class id), `model_name`, `model_version` and `box_units` (`pixels` / `normalized`).
    """

    @property
    def metadata(self) -> Mapping[str, str]: ...


EMPTY_METADATA: Mapping[str, str] = MappingProxyType({})


def runtime_metadata(runtime: object) -> Mapping[str, str]:
    """The model metadata of `runtime`: its `metadata` mapping, or an empty one where it has none.

    Non-string keys or values (a runtime that does not keep to the protocol) are left out.
    """
    metadata = getattr(runtime, "metadata", None)
    if not isinstance(metadata, Mapping):
        return EMPTY_METADATA
    return MappingProxyType(
        {k: v for k, v in metadata.items() if isinstance(k, str) and isinstance(v, str)}
    )


def read_model_metadata(config: Any) -> Mapping[str, str]:
    """The metadata of the model file named by `config`, read without building the runtime.

    Cheap enough for `validate-config`: ONNX Runtime opens a CPU-only session without graph
    optimisation, LiteRT parses the flatbuffer's metadata table, TensorRT has none (empty).
    Raises `ModelLoadError` when the file is missing or unreadable and `RuntimeUnavailableError`
    when the runtime's package is not installed.
    """
    type_name: str = config.type
    module_name = _BUILTIN_MODULES.get(type_name)
    if module_name is None:
        return EMPTY_METADATA
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RuntimeUnavailableError(
            f"runtime {type_name!r} is not available here ({exc}); cannot read its model metadata"
        ) from exc
    reader: Callable[[Any], Mapping[str, str]] | None = getattr(module, "read_metadata", None)
    return EMPTY_METADATA if reader is None else MappingProxyType(dict(reader(config)))


RuntimeFactory = Callable[[Any], Runtime]

_FACTORIES: dict[str, RuntimeFactory] = {}
# type name -> module that registers it; imported lazily: a missing backend never breaks others
_BUILTIN_MODULES: dict[str, str] = {
    "onnxruntime": "detection.runtimes.onnx",
    "litert": "detection.runtimes.litert",
    "tensorrt": "detection.runtimes.tensorrt",
    "triton": "detection.runtimes.triton",
}


def register_runtime(type_name: str) -> Callable[[RuntimeFactory], RuntimeFactory]:
    """Class decorator: make a runtime buildable from a config whose `type` is `type_name`."""

    def decorator(factory: RuntimeFactory) -> RuntimeFactory:
        _FACTORIES[type_name] = factory
        return factory

    return decorator


def _load_builtin(type_name: str) -> None:
    module = _BUILTIN_MODULES.get(type_name)
    if module is None or type_name in _FACTORIES:
        return
    try:
        importlib.import_module(module)
    except ImportError as exc:
        logger.info("runtime %s unavailable: %s", type_name, exc)


def available_runtimes() -> list[str]:
    """Names of runtimes whose backend imports on this machine."""
    for type_name in _BUILTIN_MODULES:
        _load_builtin(type_name)
    return sorted(_FACTORIES)


def create_runtime(config: Any) -> Runtime:
    """Build the runtime named by `config.type` (a model from `detection.runtimes.config`)."""
    type_name: str = config.type
    _load_builtin(type_name)
    factory = _FACTORIES.get(type_name)
    if factory is None:
        raise RuntimeUnavailableError(
            f"runtime {type_name!r} is not available here; importable: {available_runtimes()}"
        )
    return factory(config)
