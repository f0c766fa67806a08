"""YAML loading: every kind of error is reported with the line it is on."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

import pytest
from pydantic import BaseModel, Field, ModelWrapValidatorHandler, ValidationError, model_validator

from configkit import ConfigError, SecretError, SecretRef, StrictModel, load_config, parse_config
from configkit.cli import validate_config_command
from configkit.secrets import find_secret_refs
from configkit.yaml_loader import (
    KeyPath,
    LocatedMessage,
    config_error_at,
    config_errors,
    field_of,
    format_key_path,
    parse_yaml,
    validate_with_checks,
)


class Item(StrictModel):
    """A list item."""

    name: str = Field(description="Name.")
    size: int = Field(default=1, ge=1, le=10, description="Size.")


class Inner(StrictModel):
    """A nested section with a cross-field check that points below itself."""

    level: int = Field(default=0, ge=0, le=5, description="Level.")
    items: list[Item] = Field(default_factory=list, description="Items.")

    @model_validator(mode="after")
    def _no_big_item_at_top_level(self) -> Self:
        for index, item in enumerate(self.items):
            if item.size > self.level + 5:
                raise config_error_at(("items", index, "size"), f"item {item.name!r} too big")
        return self


class Root(StrictModel):
    """The document."""

    name: str = Field(description="Name.")
    ratio: float = Field(default=0.5, ge=0.0, le=1.0, description="Ratio.")
    inner: Inner = Field(default_factory=Inner, description="Nested section.")
    token: SecretRef | None = Field(default=None, description="A secret.")


CASES = [
    pytest.param(
        "name: a\ninner:\n  level: 1\n  bogus: 2\n",
        ["t.yaml:4: inner.bogus: unknown key"],
        id="unknown-key",
    ),
    pytest.param(
        "name: a\nratio: 3\n",
        ["t.yaml:2: ratio: Input should be less than or equal to 1 (got 3)"],
        id="out-of-range",
    ),
    pytest.param(
        "name: a\ninner:\n  level: high\n",
        [
            "t.yaml:3: inner.level: Input should be a valid integer, unable to parse string as an "
            "integer (got 'high')"
        ],
        id="wrong-type",
    ),
    pytest.param(
        "ratio: 0.1\ninner:\n  level: 1\n",
        ["t.yaml:1: name: required field is missing"],
        id="missing-top-level",
    ),
    pytest.param(
        "name: a\ninner:\n  items:\n    - size: 2\n    - name: b\n",
        ["t.yaml:4: inner.items[0].name: required field is missing"],
        id="missing-in-list-item",
    ),
    pytest.param(
        "name: a\ninner:\n  items:\n    - name: x\n    - name: y\n      size: 99\n",
        ["t.yaml:6: inner.items[1].size: Input should be less than or equal to 10 (got 99)"],
        id="bad-nested-list-item",
    ),
    pytest.param(
        "name: a\nratio: 0.1\nname: b\n",
        ["t.yaml:3: name: duplicate key 'name' (first defined on line 1)"],
        id="duplicate-key",
    ),
    pytest.param(
        "name: a\ninner:\n  level: 1\n  level: 2\n",
        ["t.yaml:4: inner.level: duplicate key 'level' (first defined on line 3)"],
        id="duplicate-nested-key",
    ),
    pytest.param(
        "name: a\ninner: [1, 2\nratio: 3\n",
        [
            "t.yaml:3: YAML syntax error: expected ',' or ']', but got ':' "
            "(while parsing a flow sequence on line 2)"
        ],
        id="syntax-error",
    ),
    pytest.param(
        "name: a\n  indented: x\n",
        ["t.yaml:2: YAML syntax error: mapping values are not allowed here"],
        id="syntax-error-indent",
    ),
    pytest.param(
        "name: a\ninner:\n  level: 0\n  items:\n    - name: big\n      size: 7\n",
        ["t.yaml:6: inner.items[0].size: item 'big' too big"],
        id="cross-field-error-points-below-model",
    ),
    pytest.param(
        "name: a\ntoken:\n  env: A\n  credential: b\n",
        ["t.yaml:2: token: set exactly one of `env` or `credential`"],
        id="secret-ref-two-sources",
    ),
    pytest.param(
        "ratio: 2\ninner:\n  wrong: 1\n",
        [
            "t.yaml:1: name: required field is missing",
            "t.yaml:1: ratio: Input should be less than or equal to 1 (got 2)",
            "t.yaml:3: inner.wrong: unknown key",
        ],
        id="several-errors-in-line-order",
    ),
    pytest.param(
        "",
        ["t.yaml:1: name: required field is missing"],
        id="empty-file",
    ),
    pytest.param(
        "- 1\n- 2\n",
        ["t.yaml:1: Input should be a valid dictionary or instance of Root"],
        id="not-a-mapping",
    ),
    pytest.param(
        "a: 1\n---\nb: 2\n",
        [
            "t.yaml:2: YAML syntax error: but found another document "
            "(expected a single document in the stream on line 1)"
        ],
        id="two-documents",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_errors_name_the_line(text: str, expected: list[str]) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(text, Root, "t.yaml")
    assert str(raised.value).splitlines() == expected
    assert [issue.line for issue in raised.value.issues] == [
        int(line.split(":")[1]) for line in expected
    ]


def test_valid_document_and_positions() -> None:
    text = "name: a\ninner:\n  items:\n    - name: x\n    - &b {name: y, size: 2}\n"
    config = parse_config(text, Root)
    assert config.inner.items[1].size == 2
    loaded = parse_yaml(text)
    assert loaded.positions[("inner", "items", 1, "size")].line == 5
    assert loaded.position_of(("inner", "items", 0, "nonexistent")).line == 4


def test_unsafe_tags_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"t.yaml:1: YAML syntax error: could not determine"):
        parse_config("name: !!python/object/apply:os.system [echo]\n", Root, "t.yaml")


def test_load_config_reads_files(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("name: a\nratio: 9\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2: ratio: "):
        load_config(path, Root)
    with pytest.raises(OSError):
        load_config(tmp_path / "absent.yaml", Root)


def test_format_key_path() -> None:
    assert format_key_path(("a", "b", 2, "c")) == "a.b[2].c"
    assert format_key_path((0, "x")) == "[0].x"
    assert format_key_path(()) == ""


# --- secrets ---------------------------------------------------------------------------------


def test_secret_from_env() -> None:
    assert SecretRef(env="TOKEN").resolve({"TOKEN": "s3cret"}) == "s3cret"


def test_secret_from_credentials_dir(tmp_path: Path) -> None:
    (tmp_path / "mqtt-password").write_text("hunter2\n")
    ref = SecretRef(credential="mqtt-password")
    assert ref.resolve({"CREDENTIALS_DIRECTORY": str(tmp_path)}) == "hunter2"
    assert ref.resolve({}, credentials_dir=tmp_path) == "hunter2"


@pytest.mark.parametrize(
    ("ref", "environ", "message"),
    [
        (SecretRef(env="TOKEN"), {}, "environment variable TOKEN is not set"),
        (SecretRef(env="TOKEN"), {"TOKEN": ""}, "environment variable TOKEN is empty"),
        (SecretRef(credential="pw"), {}, r"needs \$CREDENTIALS_DIRECTORY"),
        (SecretRef(credential="pw"), {"CREDENTIALS_DIRECTORY": "/nonexistent"}, "not found"),
    ],
)
def test_missing_secret(ref: SecretRef, environ: dict[str, str], message: str) -> None:
    with pytest.raises(SecretError, match=message):
        ref.resolve(environ)


@pytest.mark.parametrize(
    "data",
    [{}, {"env": "A", "credential": "b"}, {"env": "not a name"}, {"credential": "../etc/passwd"}],
)
def test_secret_ref_rejects(data: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        SecretRef.model_validate(data)


def test_find_secret_refs() -> None:
    config = parse_config("name: a\ntoken: {env: T}\n", Root)
    assert list(find_secret_refs(config)) == [(("token",), SecretRef(env="T"))]


# --- every error in one pass: cross-field checks on raw input, several errors per validator ---


def _duplicate_names(data: object) -> list[LocatedMessage]:
    items = field_of(data, "items")
    seen: set[object] = set()
    issues: list[LocatedMessage] = []
    for index, item in enumerate(items if isinstance(items, list | tuple) else []):
        name = field_of(item, "name")
        if name in seen:
            issues.append((("items", index, "name"), f"duplicate name {name!r}"))
        seen.add(name)
    return issues


def _level_below_items(section: Checked) -> list[LocatedMessage]:
    if section.level < len(section.items):
        return [(("level",), f"level {section.level} is below the {len(section.items)} items")]
    return []


class Checked(StrictModel):
    """A section whose name checks run even when a field is invalid."""

    level: int = Field(default=5, ge=0, le=5, description="Level.")
    items: list[Item] = Field(default_factory=list, description="Items.")

    @model_validator(mode="wrap")
    @classmethod
    def _check(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        return validate_with_checks(
            data, handler, cls.__name__, _duplicate_names, _level_below_items
        )


class CheckedRoot(StrictModel):
    """A document holding a checked section."""

    section: Checked = Field(description="Section.")
    other: Inner = Field(default_factory=Inner, description="Another section.")


ALL_IN_ONE = """\
section:
  level: 9
  items:
    - name: a
      size: 20
    - name: b
    - name: a
other:
  level: 1
  items:
    - {name: x, size: 9}
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            ALL_IN_ONE,
            [
                "t.yaml:2: section.level: Input should be less than or equal to 5 (got 9)",
                "t.yaml:5: section.items[0].size: Input should be less than or equal to 10 "
                "(got 20)",
                "t.yaml:7: section.items[2].name: duplicate name 'a'",
                "t.yaml:11: other.items[0].size: item 'x' too big",
            ],
            id="field-errors-with-duplicates-and-another-section",
        ),
        pytest.param(
            "section:\n  level: 1\n  items: [{name: a}, {name: a}]\n",
            [
                "t.yaml:2: section.level: level 1 is below the 2 items",
                "t.yaml:3: section.items[1].name: duplicate name 'a'",
            ],
            id="typed-check-with-raw-check",
        ),
        pytest.param(
            "section:\n  items: 7\n",
            ["t.yaml:2: section.items: Input should be a valid list (got 7)"],
            id="raw-check-tolerates-wrong-types",
        ),
    ],
)
def test_checks_report_with_field_errors_in_one_pass(text: str, expected: list[str]) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(text, CheckedRoot, "t.yaml")
    assert str(raised.value).splitlines() == expected


def test_checks_see_models_already_built() -> None:
    items = [Item(name="a"), Item(name="a")]
    with pytest.raises(ValidationError, match="duplicate name 'a'"):
        Checked(items=items)
    assert Checked(items=[Item(name="a"), Item(name="b")]).level == 5


def test_config_errors_raise_several_errors_from_one_validator() -> None:
    error = config_errors("M", [(("a", 0), "first"), (("b",), "second")])
    assert [(e["loc"], e["msg"]) for e in error.errors()] == [
        (("a", 0), "first"),
        (("b",), "second"),
    ]


# --- the shared validate-config command --------------------------------------------------------


def _files_exist(config: BaseModel) -> list[LocatedMessage]:
    """A stand-in for the model-file check: every `Item` named `missing-*` is missing."""
    items = getattr(config, "items", None) or getattr(getattr(config, "other", None), "items", [])
    prefix: KeyPath = ("items",) if hasattr(config, "items") else ("other", "items")
    return [
        ((*prefix, i, "name"), f"file {item.name} not found")
        for i, item in enumerate(items)
        if item.name.startswith("missing-")
    ]


def test_validate_config_command_several_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("section: {}\nother:\n  items: [{name: here}]\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("section: {level: 9}\nother:\n  items: [{name: missing-x}]\n")
    absent = tmp_path / "absent.yaml"

    assert validate_config_command([good, bad], CheckedRoot, checks=_files_exist) == 1
    out, err = capsys.readouterr()
    assert out == f"{good}: OK\n"
    # the section with the field error does not keep the other section from being checked
    assert err.splitlines() == [
        f"{bad}:1: section.level: Input should be less than or equal to 5 (got 9)",
        f"{bad}:3: other.items[0].name: file missing-x not found",
    ]
    assert validate_config_command([good, good], CheckedRoot) == 0
    assert capsys.readouterr().out == f"{good}: OK\n{good}: OK\n"
    assert validate_config_command([absent, bad, good], CheckedRoot) == 2  # the worst outcome
    out, err = capsys.readouterr()
    assert out == f"{good}: OK\n" and "cannot read" in err and f"{bad}:1:" in err
