"""Load a YAML config, remember where each key sits, and validate it with a pydantic model.

Errors come back as one `ConfigError` whose lines read `FILE:LINE: a.b[2].c: message (got VALUE)`,
so an operator (or systemd's `ExecStartPre`) sees every problem at once with its place in the file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast, get_args

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError
from pydantic_core.core_schema import ErrorType

__all__ = [
    "ConfigError",
    "ConfigIssue",
    "KeyPath",
    "LoadedYaml",
    "config_error_at",
    "config_errors",
    "field_of",
    "format_key_path",
    "load_config",
    "parse_config",
    "parse_yaml",
    "validate_loaded",
    "validate_with_checks",
]

KeyPath = tuple[str | int, ...]
"""Where a value sits in the document: mapping keys and list indices from the root."""

ModelT = TypeVar("ModelT", bound=BaseModel)

LocatedMessage = tuple[KeyPath, str]
"""A problem found by a cross-field check: where (below the model checked) and what."""

_AT_CONTEXT_KEY = "at"
_REFERENCE_ERROR = "config_reference"
_KNOWN_ERROR_TYPES: frozenset[str] = frozenset(get_args(ErrorType))
_MAX_VALUE_CHARS = 60
_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True, slots=True)
class Position:
    """A 1-based line and column in the YAML source."""

    line: int
    column: int


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One problem in a config file, with the place it refers to."""

    file: str
    line: int
    column: int
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{self.file}:{self.line}: {where}{self.message}"


class ConfigError(Exception):
    """A config file that cannot be used; `str()` gives one `FILE:LINE: path: message` per issue."""

    def __init__(self, issues: Sequence[ConfigIssue]) -> None:
        self.issues: tuple[ConfigIssue, ...] = tuple(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))


@dataclass(frozen=True, slots=True)
class LoadedYaml:
    """The plain data of a YAML document plus the position of every key path in it."""

    data: Any
    positions: Mapping[KeyPath, Position]
    file: str

    def position_of(self, path: KeyPath) -> Position:
        """Position of `path`, or of its nearest ancestor that exists in the document."""
        for end in range(len(path), -1, -1):
            found = self.positions.get(path[:end])
            if found is not None:
                return found
        return Position(1, 1)


def config_error_at(path: KeyPath, message: str) -> PydanticCustomError:
    """An error for a `model_validator` that points below the model, e.g. `("rules", 2, "zone")`.

    Raise it from a cross-field check so the message names the exact YAML line of the bad value
    rather than the line of the whole model.
    """
    return PydanticCustomError(
        _REFERENCE_ERROR, "{reason}", {"reason": message, _AT_CONTEXT_KEY: path}
    )


def _reference_error(path: KeyPath, message: str) -> InitErrorDetails:
    error = PydanticCustomError(_REFERENCE_ERROR, "{reason}", {"reason": message})
    return InitErrorDetails(type=error, loc=path, input=None)


def config_errors(title: str, issues: Iterable[LocatedMessage]) -> ValidationError:
    """Several cross-field errors at once, each at its own path below the model (`title`).

    Raise it from a `model_validator` that finds more than one problem, so `validate-config`
    reports them all in one pass, each with its YAML line; pydantic puts the model's own
    location in front of every path.
    """
    return ValidationError.from_exception_data(
        title, [_reference_error(path, message) for path, message in issues]
    )


def _reraisable(error: ValidationError) -> list[InitErrorDetails]:
    """The errors of `error`, in the form `ValidationError.from_exception_data` takes back."""
    details: list[InitErrorDetails] = []
    for detail in error.errors():
        loc, value, ctx = tuple(detail["loc"]), detail["input"], detail.get("ctx")
        if detail["type"] in _KNOWN_ERROR_TYPES:
            known = InitErrorDetails(type=cast(ErrorType, detail["type"]), loc=loc, input=value)
            if ctx:
                known["ctx"] = ctx
            details.append(known)
        elif ctx:
            custom = PydanticCustomError(
                detail["type"], "{reason}", {**ctx, "reason": detail["msg"]}
            )
            details.append(InitErrorDetails(type=custom, loc=loc, input=value))
        else:
            custom = PydanticCustomError(detail["type"], detail["msg"])
            details.append(InitErrorDetails(type=custom, loc=loc, input=value))
    return details


def validate_with_checks(
    data: Any,
    handler: Callable[[Any], ModelT],
    title: str,
    check: Callable[[Any], Iterable[LocatedMessage]],
    check_built: Callable[[ModelT], Iterable[LocatedMessage]] | None = None,
) -> ModelT:
    """The body of a `mode="wrap"` model validator whose cross-field checks run in any case.

    An `after` validator only runs once every field is valid, and stops at its first error, so
    an operator fixes a file in rounds: field errors, then duplicate names, then dangling
    references. Here `handler` (pydantic's field validation) and `check(data)` both run, on the
    input as given (a mapping from YAML, or keyword arguments that may hold models already:
    read it with `field_of`), and every error of both is raised at once. `check` must tolerate
    values of the wrong type (field validation reports those) and return `(path, message)`
    pairs, paths relative to the model (`title` names it). `check_built`, for checks that need
    typed values (comparing two numbers), runs on the built model when the fields are valid.
    """
    issues = list(check(data))
    try:
        model = handler(data)
    except ValidationError as error:
        if not issues:
            raise
        extra = [_reference_error(path, message) for path, message in issues]
        raise ValidationError.from_exception_data(
            error.title, [*_reraisable(error), *extra]
        ) from None
    if check_built is not None:
        issues += check_built(model)
    if issues:
        raise config_errors(title, issues)
    return model


def field_of(item: object, key: str) -> object:
    """`item[key]` of a raw mapping, or attribute `key` of a model already built; else None."""
    if isinstance(item, Mapping):
        return item.get(key)
    if isinstance(item, BaseModel):
        return getattr(item, key, None)
    return None


def format_key_path(path: KeyPath) -> str:
    """Render a key path as `a.b[2].c`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _position(node: yaml.Node) -> Position:
    return Position(node.start_mark.line + 1, node.start_mark.column + 1)


def _syntax_error(file: str, error: yaml.YAMLError) -> ConfigError:
    problem_mark = getattr(error, "problem_mark", None)
    context_mark = getattr(error, "context_mark", None)
    mark = problem_mark or context_mark
    line = mark.line + 1 if mark is not None else 1
    column = mark.column + 1 if mark is not None else 1
    message = f"YAML syntax error: {getattr(error, 'problem', None) or error}"
    context = getattr(error, "context", None)
    if context and context_mark is not None:
        message += f" ({context} on line {context_mark.line + 1})"
    elif context:
        message += f" ({context})"
    return ConfigError([ConfigIssue(file, line, column, "", message)])


def _key_of(node: yaml.Node) -> str | int | None:
    """The key as it would appear in a pydantic `loc`; None for keys that cannot be mapped."""
    if not isinstance(node, yaml.ScalarNode):
        return None
    if node.tag == "tag:yaml.org,2002:int":
        try:
            return int(str(node.value), 0)
        except ValueError:
            return str(node.value)
    return str(node.value)


def _walk(
    node: yaml.Node, path: KeyPath, file: str, positions: dict[KeyPath, Position], seen: set[int]
) -> Iterator[ConfigIssue]:
    """Record positions below `node` and yield a duplicate-key issue wherever one occurs."""
    if id(node) in seen:  # an alias: its positions were recorded at the anchor
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_seen: dict[str | int, Position] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = _key_of(key_node)
            if key is None:
                continue
            key_path = (*path, key)
            if key in first_seen:
                pos = _position(key_node)
                message = f"duplicate key {key!r} (first defined on line {first_seen[key].line})"
                yield ConfigIssue(file, pos.line, pos.column, format_key_path(key_path), message)
                continue
            first_seen[key] = positions[key_path] = _position(key_node)
            yield from _walk(value_node, key_path, file, positions, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            positions[(*path, index)] = _position(item)
            yield from _walk(item, (*path, index), file, positions, seen)


def parse_yaml(text: str, file: str = "<string>") -> LoadedYaml:
    """Parse one YAML document with the safe loader, keeping the line of every key.

    An empty document gives an empty mapping. Raises `ConfigError` on syntax errors, more than
    one document, or duplicate keys in a mapping.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        positions: dict[KeyPath, Position] = {(): Position(1, 1)}
        if node is None:
            return LoadedYaml({}, positions, file)
        positions[()] = _position(node)
        duplicates = list(_walk(node, (), file, positions, set()))
        if duplicates:
            raise ConfigError(duplicates)
        data = loader.construct_document(node)
    except yaml.YAMLError as error:
        raise _syntax_error(file, error) from error
    finally:
        loader.dispose()
    return LoadedYaml(data, positions, file)


def _resolve_loc(loaded: LoadedYaml, loc: KeyPath) -> tuple[KeyPath, KeyPath]:
    """Map a pydantic `loc` onto the document.

    Returns (the deepest path present in the document, the path to show). Parts of `loc` that are
    not keys in the document (union tags such as `litert`) are dropped; the last part is kept for
    display even when it is absent (a missing field), so the message names it.
    """
    found: KeyPath = ()
    shown: KeyPath = ()
    for index, part in enumerate(loc):
        candidate = (*found, part)
        if candidate in loaded.positions:
            found = shown = candidate
        elif index == len(loc) - 1:
            shown = (*found, part)
    return found, shown


def _shown_value(value: Any) -> str | None:
    if isinstance(value, Mapping | list | tuple):
        return None
    text = repr(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."


def _issue(loaded: LoadedYaml, error: ErrorDetails) -> ConfigIssue:
    loc: KeyPath = tuple(error["loc"])
    ctx = error.get("ctx") or {}
    at = ctx.get(_AT_CONTEXT_KEY)
    if isinstance(at, tuple):
        loc = (*loc, *at)
    found, shown = _resolve_loc(loaded, loc)
    position = loaded.position_of(found)
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown key"
    elif error["type"] == "missing":
        message = "required field is missing"
    elif error["type"] != "config_reference":
        shown_value = _shown_value(error["input"])
        if shown_value is not None:
            message = f"{message} (got {shown_value})"
    return ConfigIssue(loaded.file, position.line, position.column, format_key_path(shown), message)


def validate_loaded(loaded: LoadedYaml, model: type[ModelT]) -> ModelT:
    """Validate parsed YAML with `model`; raise `ConfigError` with one line per error."""
    try:
        return model.model_validate(loaded.data)
    except ValidationError as error:
        issues: list[ConfigIssue] = []
        for detail in error.errors():
            issue = _issue(loaded, detail)
            if issue not in issues:
                issues.append(issue)
        issues.sort(key=lambda issue: (issue.line, issue.column))
        raise ConfigError(issues) from None


def parse_config(text: str, model: type[ModelT], file: str = "<string>") -> ModelT:
    """Parse YAML text and validate it with `model`; raise `ConfigError` on any problem."""
    return validate_loaded(parse_yaml(text, file), model)


def load_config(path: str | Path, model: type[ModelT]) -> ModelT:
    """Read a YAML file and validate it with `model`.

    Raises `OSError` when the file cannot be read and `ConfigError` when it is not a valid config.
    """
    text = Path(path).read_text(encoding="utf-8")
    return parse_config(text, model, str(path))
