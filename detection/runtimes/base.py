"""The `Runtime` protocol every model backend implements, and the registry that builds them."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
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
    """

    name: str

    @property
    def input_spec(self) -> InputSpec: ...

    def infer(self, images: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]: ...

    def close(self) -> None: ...


RuntimeFactory = Callable[[Any], Runtime]

_FACTORIES: dict[str, RuntimeFactory] = {}
# type name -> module that registers it; imported lazily: a missing backend never breaks others
_BUILTIN_MODULES: dict[str, str] = {
    "onnxruntime": "detection.runtimes.onnx",
    "litert": "detection.runtimes.litert",
    "tensorrt": "detection.runtimes.tensorrt",
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
