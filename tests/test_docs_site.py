"""The docs site (mkdocs.yml): built strictly, README as its home page, the benchmark results in
it, and a broken link or anchor failing the build (as `scripts/test` relies on)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mkdocs.commands.build import build
from mkdocs.config import load_config
from mkdocs.exceptions import Abort

ROOT = Path(__file__).resolve().parents[1]


def _build(config_file: Path, site_dir: Path) -> None:
    config = load_config(str(config_file), site_dir=str(site_dir))
    config.plugins.on_startup(command="build", dirty=False)
    try:
        build(config)
    finally:
        config.plugins.on_shutdown()


def test_the_site_builds_strictly_with_readme_and_results(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _build(ROOT / "mkdocs.yml", site)
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "Two commands on a fresh machine" in home  # README.md is the home page
    assert 'href="benchmarks.html"' in home  # README's docs/ links point at the pages
    assert (site / "bench-results" / "hybrid_tradeoff.html").is_file()
    assert (site / "bench-results" / "hybrid_tradeoff.json").is_file()
    assert (site / "reference" / "edge-agent.html").is_file()


@pytest.mark.parametrize(
    "line",
    [
        "[gone](no-such-page.md)",
        "[gone](architecture.md#no-such-section)",
        "[gone](../bench/results/no_such_result.md)",
    ],
)
def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path, line: str) -> None:
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    shutil.copytree(ROOT / "bench" / "results", copy / "bench" / "results")
    page = copy / "docs" / "demo.md"
    page.write_text(page.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")
    with pytest.raises(Abort, match="strict mode"):
        _build(copy / "mkdocs.yml", tmp_path / "site")
