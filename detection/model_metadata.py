"""What a model file says about itself, and how it combines with the detector config.

Models carry key/value metadata (ONNX `metadata_props`, the TFLite metadata table), read by the
runtimes (`detection.runtimes.base.runtime_metadata`). The keys used here:

* `class_names`: a JSON list of the class names by id, e.g. `["person", "bicycle", ...]`;
* `box_units`: `pixels` or `normalized`, the units of the boxes the model outputs;
* `model_name`, `model_version`: the identity the cloud service reports with its answers.

Ultralytics exports carry `names` instead of `class_names` (a Python literal such as
`{0: 'person', 1: 'car'}`); it is read where `class_names` is absent.

The config wins where it says something (`class_names`, `box_units` other than `auto`), but a
config naming a different number of classes than the model is an error, not a silent mismatch.
`inspect_detector_model` runs the same checks for `validate-config` without building a detector.
"""

from __future__ import annotations

import ast
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from pydantic import BaseModel

from configkit.yaml_loader import KeyPath, LocatedMessage
from detection.config import DetectorConfig, unknown_class_message
from detection.decode import BoxUnits
from detection.errors import ModelConfigError, ModelLoadError, RuntimeUnavailableError
from detection.runtimes.base import read_model_metadata

__all__ = [
    "BOX_UNITS_KEY",
    "CLASS_NAMES_KEY",
    "MODEL_NAME_KEY",
    "MODEL_VERSION_KEY",
    "ModelInspection",
    "find_detector_configs",
    "inspect_detector_model",
    "metadata_class_names",
    "model_file_issues",
    "model_file_of",
    "model_identity",
    "resolve_box_units",
    "resolve_class_filter",
    "resolve_class_names",
]

CLASS_NAMES_KEY: Final = "class_names"
BOX_UNITS_KEY: Final = "box_units"
MODEL_NAME_KEY: Final = "model_name"
MODEL_VERSION_KEY: Final = "model_version"
_ULTRALYTICS_NAMES_KEY: Final = "names"
_BOX_UNITS: Final[tuple[BoxUnits, ...]] = ("pixels", "normalized")
_SHOWN_NAMES = 5

logger = logging.getLogger(__name__)


def _preview(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_SHOWN_NAMES])
    return shown + (", ..." if len(names) > _SHOWN_NAMES else "")


def _ultralytics_names(text: str) -> tuple[str, ...] | None:
    """`{0: 'person', 1: 'car'}` (or a list) as names by id; None unless ids run 0..n-1."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if isinstance(value, list | tuple):
        value = dict(enumerate(value))
    if not isinstance(value, dict) or not value:
        return None
    try:
        by_id = {int(k): v for k, v in value.items()}
    except (TypeError, ValueError):
        return None
    if sorted(by_id) != list(range(len(by_id))) or not all(
        isinstance(v, str) for v in by_id.values()
    ):
        return None
    return tuple(str(by_id[i]) for i in range(len(by_id)))


def metadata_class_names(metadata: Mapping[str, str]) -> tuple[str, ...] | None:
    """The class names the model's metadata gives (`class_names`, else ultralytics `names`).

    None where it names none; `ModelConfigError` when `class_names` is not a JSON list of
    strings (an ultralytics `names` that cannot be read is ignored).
    """
    text = metadata.get(CLASS_NAMES_KEY)
    if text is None:
        names = metadata.get(_ULTRALYTICS_NAMES_KEY)
        return None if names is None else _ultralytics_names(names)
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ModelConfigError(
            f"the model's `{CLASS_NAMES_KEY}` metadata is not a JSON list of names: {text[:80]!r}"
        )
    return tuple(value)


def resolve_class_names(
    configured: Sequence[str], metadata: Mapping[str, str], model: str = "the model"
) -> tuple[str, ...]:
    """The detector's class names: `configured` when given, else the model's (else none).

    Raises `ModelConfigError` when both are given and their counts differ; `model` names the
    model in the message.
    """
    from_model = metadata_class_names(metadata)
    if not configured:
        return from_model or ()
    if from_model is not None and len(from_model) != len(configured):
        raise ModelConfigError(
            f"class_names in the config names {len(configured)} classes ({_preview(configured)}) "
            f"but {model} has {len(from_model)} ({_preview(from_model)}); "
            "leave class_names empty to use the model's own"
        )
    return tuple(configured)


def resolve_box_units(configured: BoxUnits, metadata: Mapping[str, str]) -> BoxUnits:
    """`configured`, or for `auto` the model's `box_units` metadata where it has one."""
    if configured != "auto":
        return configured
    value = metadata.get(BOX_UNITS_KEY)
    if value is None:
        return "auto"
    for units in _BOX_UNITS:
        if value == units:
            return units
    raise ModelConfigError(
        f"the model's `{BOX_UNITS_KEY}` metadata is {value!r}; expected one of {_BOX_UNITS}"
    )


def resolve_class_filter(
    classes: Sequence[str], class_names: Sequence[str], source: str = "the model"
) -> tuple[int, ...] | None:
    """Ids of the `classes:` filter's names; None when it is empty (keep every class).

    Raises `ModelConfigError` for a name not in `class_names` (naming the known ones), or a
    filter on a model whose classes have no names.
    """
    if not classes:
        return None
    if not class_names:
        raise ModelConfigError(
            f"classes {list(classes)} needs class names, but neither the config "
            "(class_names) nor the model's metadata gives any"
        )
    ids = {name: i for i, name in reversed(list(enumerate(class_names)))}
    for name in classes:
        if name not in ids:
            raise ModelConfigError(unknown_class_message(name, tuple(class_names), source))
    return tuple(sorted({ids[name] for name in classes}))


def model_file_of(runtime: object) -> tuple[str, Path] | None:
    """The field naming a runtime config's model file, and the file (`model_path`,
    `engine_path`); None for a runtime config with neither."""
    for name in ("model_path", "engine_path"):
        value = getattr(runtime, name, None)
        if isinstance(value, Path):
            return name, value
    return None


def model_identity(
    metadata: Mapping[str, str],
    model_file: Path | None,
    name: str | None = None,
    version: str | None = None,
) -> tuple[str, str]:
    """(name, version) of a model: `name` / `version` when given, else its `model_name` /
    `model_version` metadata, else the file's stem and "1"."""
    fallback = model_file.stem if model_file is not None else "model"
    return (
        name or metadata.get(MODEL_NAME_KEY) or fallback,
        version or metadata.get(MODEL_VERSION_KEY) or "1",
    )


@dataclass(frozen=True)
class ModelInspection:
    """What `inspect_detector_model` found: problems (paths below the `DetectorConfig`) and the
    class names the detector would use (None where the model could not be read)."""

    issues: list[LocatedMessage] = field(default_factory=list)
    class_names: tuple[str, ...] | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)


def _missing_file_message(path: Path) -> str:
    where = "" if path.is_absolute() else f" (relative to the working directory {Path.cwd()})"
    return f"model file not found: {path}{where}"


def inspect_detector_model(config: DetectorConfig) -> ModelInspection:
    """Check a detector's model file without building the detector (for `validate-config`).

    The file must exist and its metadata load (ONNX Runtime opens a CPU-only session; see
    `read_model_metadata`); its class count must match `class_names` where both are given,
    and the `classes:` filter must name known classes. Problems of the file are placed at the
    runtime's `model_path` / `engine_path`. A runtime not installed here is not a problem: only
    the file's presence is checked then.
    """
    found = model_file_of(config.runtime)
    if found is None:
        return ModelInspection()
    field_name, path = found
    at: KeyPath = ("runtime", field_name)
    if not path.is_file():
        return ModelInspection([(at, _missing_file_message(path))])
    try:
        metadata = read_model_metadata(config.runtime)
    except RuntimeUnavailableError as exc:
        logger.info("model metadata of %s not checked: %s", path, exc)
        return ModelInspection()
    except ModelLoadError as exc:
        return ModelInspection([(at, str(exc))])
    issues: list[LocatedMessage] = []
    try:
        resolve_box_units(config.box_units, metadata)
    except ModelConfigError as exc:
        issues.append((at, str(exc)))
    try:
        names = resolve_class_names(config.class_names, metadata, f"the model {path.name}")
    except ModelConfigError as exc:
        return ModelInspection([*issues, (at, str(exc))], None, metadata)
    if not config.class_names:  # with configured names, DetectorConfig checked the filter
        for index, name in enumerate(config.classes):
            if not names:
                issues.append(
                    (
                        ("classes", index),
                        f"class {name!r} cannot be resolved: neither class_names nor the "
                        f"metadata of {path.name} names the model's classes",
                    )
                )
            elif name not in names:
                issues.append(
                    (("classes", index), unknown_class_message(name, names, f"model {path.name}"))
                )
    return ModelInspection(issues, names, metadata)


def find_detector_configs(
    model: BaseModel, path: KeyPath = ()
) -> Iterator[tuple[KeyPath, DetectorConfig]]:
    """Every `DetectorConfig` inside a validated config, with its key path."""
    if isinstance(model, DetectorConfig):
        yield path, model
        return
    for name in type(model).model_fields:
        yield from _detectors_in(getattr(model, name), (*path, name))


def _detectors_in(value: object, path: KeyPath) -> Iterator[tuple[KeyPath, DetectorConfig]]:
    if isinstance(value, BaseModel):
        yield from find_detector_configs(value, path)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _detectors_in(item, (*path, index))


def model_file_issues(config: BaseModel) -> list[LocatedMessage]:
    """`inspect_detector_model`'s problems for every detector in `config`, at their paths."""
    return [
        ((*path, *where), message)
        for path, detector in find_detector_configs(config)
        for where, message in inspect_detector_model(detector).issues
    ]
