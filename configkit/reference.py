"""A configuration reference page rendered from the config models, and a check that it is fresh.

Each service names its page in a small module of its own (`edge_agent.config.reference`,
`cloud_service.config_reference`: `configkit` may not import them); the rendering lives here,
once. A page has a section per model reached from the root (nested sections, list items, each
variant of a union), and per field its name, type, default, bounds and description, read from
pydantic's own field info, so the page says what the validator enforces.

    python -m edge_agent.config.reference [--check]
    python -m cloud_service.config_reference [--check]

`--check` writes nothing and exits 1 naming the stale page, like `python -m protos.generate
--check`. Pydantic's JSON schema was the other candidate: it renders the same facts, but as
`$defs` keyed by class name, without the YAML path a reader looks for.
"""

from __future__ import annotations

import argparse
import enum
import json
import re
import types
import typing
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

REPO_ROOT = Path(__file__).resolve().parent.parent

# bound metadata -> how the page writes it
_BOUNDS: tuple[tuple[type[Any], str, str], ...] = (
    (annotated_types.Gt, "gt", "> {}"),
    (annotated_types.Ge, "ge", ">= {}"),
    (annotated_types.Lt, "lt", "< {}"),
    (annotated_types.Le, "le", "<= {}"),
    (annotated_types.MultipleOf, "multiple_of", "multiple of {}"),
    (annotated_types.MinLen, "min_length", "length >= {}"),
    (annotated_types.MaxLen, "max_length", "length <= {}"),
)


@dataclass(frozen=True)
class ReferencePage:
    """One generated page: the root model, where the page goes, and what it says above the
    sections."""

    model: type[BaseModel]
    path: Path  # relative to the repository root
    title: str
    intro: str
    command: str  # the command that regenerates it, named in the page


@dataclass
class _Section:
    model: type[BaseModel]
    paths: list[str] = field(default_factory=list)
    heading: str = ""


def _slug(text: str) -> str:
    """The anchor Python-Markdown's `toc` (MkDocs) and GitHub give a heading of `text`."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _strip_annotated(annotation: Any) -> tuple[Any, list[Any]]:
    metadata: list[Any] = []
    while typing.get_origin(annotation) is typing.Annotated:
        annotation, *extra = typing.get_args(annotation)
        metadata.extend(extra)
    return annotation, metadata


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _models_in(annotation: Any, suffix: str = "") -> Iterator[tuple[type[BaseModel], str]]:
    """The models an annotation holds, each with what its path adds (`[]` for a list item)."""
    annotation, _ = _strip_annotated(annotation)
    if _is_model(annotation):
        yield annotation, suffix
        return
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (list, tuple, set, frozenset, Sequence):
        for arg in args:
            if arg is not Ellipsis:
                yield from _models_in(arg, suffix + "[]")
    elif origin is dict:
        yield from _models_in(args[1], suffix + ".*")
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            yield from _models_in(arg, suffix)


def _collect(root: type[BaseModel]) -> list[_Section]:
    """Every model reached from `root`, depth first in field order (a section follows its
    parent's), with each path to it."""
    sections: dict[type[BaseModel], _Section] = {}

    def visit(model: type[BaseModel], path: str) -> None:
        if model in sections:
            sections[model].paths.append(path)
            return
        sections[model] = _Section(model, [path])
        for name, info in model.model_fields.items():
            for child, suffix in _models_in(info.annotation):
                visit(child, f"{path}.{name}{suffix}" if path else f"{name}{suffix}")

    visit(root, "")
    ordered = list(sections.values())
    taken: dict[str, int] = {}
    for section in ordered:
        first = section.paths[0]
        base = "(top level)" if not first else first
        taken[base] = taken.get(base, 0) + 1
    for section in ordered:
        first = section.paths[0] or "(top level)"
        # variants of one union share a path: the class name tells them apart
        section.heading = (
            f"`{first}` ({section.model.__name__})" if taken[first] > 1 else f"`{first}`"
        )
        if first == "(top level)":
            section.heading = f"Top level ({section.model.__name__})"
    return ordered


def _type_text(annotation: Any, link: Callable[[type[BaseModel]], str]) -> str:
    annotation, _ = _strip_annotated(annotation)
    if annotation is type(None):
        return "null"
    if _is_model(annotation):
        return link(annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(f"`{json.dumps(_plain(a))}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a, link) for a in args)
    if origin in (list, set, frozenset, Sequence):
        return f"list of {_inner_text(args[0], link)}"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {_inner_text(args[0], link)}"
        return "[" + ", ".join(_inner_text(a, link) for a in args) + "]"
    if origin is dict:
        return f"map of {_inner_text(args[0], link)} to {_inner_text(args[1], link)}"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(f"`{json.dumps(_plain(m.value))}`" for m in annotation)
    if isinstance(annotation, type):
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__
        )
    return f"`{annotation}`"


def _inner_text(annotation: Any, link: Callable[[type[BaseModel]], str]) -> str:
    """An element's type; a union in parentheses, so `list of (A | B)` reads one way."""
    text = _type_text(annotation, link)
    bare, _ = _strip_annotated(annotation)
    return f"({text})" if typing.get_origin(bare) in (typing.Union, types.UnionType) else text


def _plain(value: Any) -> Any:
    """A default as the YAML would write it."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list | set | frozenset):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _default_text(info: FieldInfo) -> str:
    if info.default_factory is not None:
        if info.default_factory_takes_validated_data:
            return "derived"
        value = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "its section's defaults"
    elif info.default is PydanticUndefined:
        return "**required**"
    else:
        value = info.default
    text = json.dumps(_plain(value), ensure_ascii=False)
    return f"`{text}`" if len(text) <= 60 else f"`{text[:57]}...`"


def _bounds_text(info: FieldInfo) -> str:
    _, inner = _strip_annotated(info.annotation)
    bounds: list[str] = []
    for item in [*info.metadata, *inner]:
        for kind, attribute, template in _BOUNDS:
            if isinstance(item, kind):
                bounds.append(template.format(getattr(item, attribute)))
        if isinstance(getattr(item, "pattern", None), str):
            # below the table: a `|` in a code span splits a GitHub table cell
            bounds.append("pattern below")
    return ", ".join(bounds) or "–"


def _pattern(info: FieldInfo) -> str | None:
    _, inner = _strip_annotated(info.annotation)
    for item in [*info.metadata, *inner]:
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            return pattern
    return None


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(page: ReferencePage) -> str:
    """The page's markdown."""
    sections = _collect(page.model)
    by_model = {section.model: section for section in sections}

    def link(model: type[BaseModel]) -> str:
        return f"[{model.__name__}](#{_slug(by_model[model].heading)})"

    lines = [
        f"# {page.title}",
        "",
        f"<!-- generated by `{page.command}` from the config models: do not edit -->",
        "",
        page.intro.strip(),
        "",
        f"Regenerate with `{page.command}`; `{page.command} --check` (run by `scripts/test`) "
        "fails when this page is stale.",
        "",
    ]
    for section in sections:
        model = section.model
        lines += [f"## {section.heading}", ""]
        doc = (model.__doc__ or "").strip()
        if doc:
            lines += [" ".join(doc.split()), ""]
        where = f"`{model.__module__}.{model.__name__}`"
        if len(section.paths) > 1:
            where += "; also at " + ", ".join(f"`{p}`" for p in section.paths[1:])
        lines += [f"Model: {where}.", ""]
        lines += ["| field | type | default | bounds | description |", "|---|---|---|---|---|"]
        patterns: list[str] = []
        for name, info in model.model_fields.items():
            key = info.alias or name
            lines.append(
                f"| `{key}` | {_cell(_type_text(info.annotation, link))} | "
                f"{_cell(_default_text(info))} | {_cell(_bounds_text(info))} | "
                f"{_cell(info.description or '')} |"
            )
            pattern = _pattern(info)
            if pattern is not None:
                patterns.append(f"- `{key}` matches ``{pattern}``")
        lines.append("")
        if patterns:
            lines += ["Patterns (Python regular expressions):", "", *patterns, ""]
    return "\n".join(lines)


def stale_pages(pages: Sequence[ReferencePage], root: Path = REPO_ROOT) -> list[str]:
    """One line per page whose file differs from what the models render now."""
    problems: list[str] = []
    for page in pages:
        target = root / page.path
        if not target.is_file():
            problems.append(f"missing: {page.path}")
        elif target.read_text(encoding="utf-8") != render(page):
            problems.append(f"stale: {page.path}")
    return problems


def main(pages: Sequence[ReferencePage], argv: Sequence[str] | None = None) -> int:
    """CLI of a service's reference module; returns the process exit status."""
    parser = argparse.ArgumentParser(
        prog=pages[0].command if pages else "reference",
        description="Write the configuration reference page(s), or check they are fresh.",
    )
    parser.add_argument(
        "--check", action="store_true", help="do not write; exit 1 naming each stale page"
    )
    parser.add_argument(
        "--root", type=Path, default=REPO_ROOT, help="repository root (default: this checkout)"
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = stale_pages(pages, args.root)
        for problem in problems:
            print(problem)  # noqa: T201 - CLI output
        if problems:
            commands = sorted({page.command for page in pages})
            print("configuration reference is stale: run " + " and ".join(commands))  # noqa: T201
            return 1
        return 0
    for page in pages:
        target = args.root / page.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(page), encoding="utf-8")
        print(f"wrote {page.path}")  # noqa: T201 - CLI output
    return 0
