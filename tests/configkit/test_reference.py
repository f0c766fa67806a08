"""The configuration reference: what a page says of a model, and the staleness check."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import Field

from cloud_service.config_reference import PAGE as CLOUD_PAGE
from configkit.base import StrictModel
from configkit.reference import ReferencePage, main, render, stale_pages
from edge_agent.config.reference import PAGE as EDGE_PAGE


class _Leaf(StrictModel):
    """A leaf section."""

    size_px: int = Field(default=96, ge=1, le=4096, description="Box size | in pixels.")


class _VariantA(StrictModel):
    """First variant."""

    type: Literal["a"] = Field(default="a", description="Variant a.")


class _VariantB(StrictModel):
    """Second variant."""

    type: Literal["b"] = Field(default="b", description="Variant b.")


class _Root(StrictModel):
    """The root of a small config."""

    name: str = Field(pattern=r"^(x|y)$", description="Required name.")
    ratio: float = Field(default=0.5, gt=0.0, lt=1.0, description="A share.")
    mode: Literal["fast", "slow"] = Field(default="fast", description="How.")
    leaf: _Leaf = Field(default_factory=_Leaf, description="Nested.")
    leaves: list[_Leaf] = Field(default_factory=list, max_length=8, description="A list.")
    variant: Annotated[_VariantA | _VariantB, Field(discriminator="type")] = Field(
        default_factory=_VariantA, description="A union."
    )
    optional: _Leaf | None = Field(default=None, description="Off by default.")
    either: list[int | str] = Field(default_factory=list, description="Numbers or names.")


PAGE = ReferencePage(
    model=_Root,
    path=Path("docs/reference/small.md"),
    title="Small reference",
    intro="What this page is.",
    command="python -m small.reference",
)


def test_a_page_has_a_section_per_model_and_a_row_per_field() -> None:
    text = render(PAGE)
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == [
        "## Top level (_Root)",
        "## `leaf`",
        "## `variant` (_VariantA)",
        "## `variant` (_VariantB)",
    ]
    # the leaf model is one section, reached at three paths
    assert "also at `leaves[]`, `optional`" in text
    assert "| `name` | string | **required** | pattern below | Required name. |" in text
    assert "- `name` matches ``^(x|y)$``" in text
    assert "| `ratio` | number | `0.5` | > 0.0, < 1.0 | A share. |" in text
    assert '| `mode` | `"fast"` \\| `"slow"` | `"fast"` | – | How. |' in text
    assert "| `leaf` | [_Leaf](#leaf) | its section's defaults | – | Nested. |" in text
    assert "| `leaves` | list of [_Leaf](#leaf) | `[]` | length <= 8 | A list. |" in text
    assert "[_VariantA](#variant-_varianta) \\| [_VariantB](#variant-_variantb)" in text
    assert "| `optional` | [_Leaf](#leaf) \\| null | `null` |" in text
    assert "| `either` | list of (integer \\| string) | `[]` |" in text
    # a pipe in a description is escaped, so it cannot split the table row
    assert "| `size_px` | integer | `96` | >= 1, <= 4096 | Box size \\| in pixels. |" in text
    assert "python -m small.reference --check" in text


def test_the_check_names_a_stale_or_missing_page_and_passes_a_fresh_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stale_pages([PAGE], tmp_path) == ["missing: docs/reference/small.md"]
    assert main([PAGE], ["--check", "--root", str(tmp_path)]) == 1
    assert "missing: docs/reference/small.md" in capsys.readouterr().out

    assert main([PAGE], ["--root", str(tmp_path)]) == 0
    assert main([PAGE], ["--check", "--root", str(tmp_path)]) == 0

    target = tmp_path / PAGE.path
    target.write_text(target.read_text(encoding="utf-8") + "edited by hand\n", encoding="utf-8")
    assert main([PAGE], ["--check", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "stale: docs/reference/small.md" in out
    assert "run python -m small.reference" in out


def test_the_services_pages_render() -> None:
    """Both real config trees render: every nested model reached, every field a row."""
    edge = render(EDGE_PAGE)
    for heading in ("## `cameras[]`", "## `escalation.fusion`", "## `detector.runtime` ("):
        assert heading in edge
    cloud = render(CLOUD_PAGE)
    assert "## `batching`" in cloud
    assert "| `max_queue_delay_ms` |" in cloud
