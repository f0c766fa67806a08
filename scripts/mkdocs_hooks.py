"""MkDocs hooks (`hooks:` in mkdocs.yml): the site's home page is README.md, and the committed
benchmark results are pages and files of the site, so strict mode checks links to both.

Pages under `docs/` link to `../README.md` and `../bench/results/NAME` as they would on a Git
forge; README links to `docs/PAGE.md`. Both keep working there, and here:

- README.md becomes `index.md` (links into `docs/` lose the prefix, links elsewhere in the
  repository gain `../`, so they resolve like the docs pages' own);
- every file of `bench/results/` is added as `../bench/results/NAME`, written to
  `bench-results/NAME` in the site (a `.md` result renders as a page);
- a link to `../README.md` from a docs page points at the home page.

Anything else outside `docs/` is not part of the site: a link to it fails the strict build, so the
pages name source files as code (`edge_agent/pipeline/core.py`) rather than linking them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.pages import Page

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "bench" / "results"
_LINK = re.compile(r"(\]\()([^)\s#]+)")  # the target of an inline markdown link or image


def _readme_link(match: re.Match[str]) -> str:
    target = match.group(2)
    if "://" in target or target.startswith(("/", "mailto:")):
        return match.group(0)
    if target.startswith("docs/"):
        return match.group(1) + target.removeprefix("docs/")
    return match.group(1) + "../" + target


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    """Add README.md as the home page and the benchmark results as pages and files."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "index.md", content=_LINK.sub(_readme_link, readme)))
    for path in sorted(RESULTS.rglob("*")):
        if not path.is_file() or path.suffix not in {".md", ".json", ".png", ".csv"}:
            continue
        relative = path.relative_to(RESULTS).as_posix()
        # not in the nav by design; without a level the `.*` default of exclude_docs drops `../`
        result = File.generated(
            config,
            f"../bench/results/{relative}",
            abs_src_path=str(path),
            inclusion=InclusionLevel.NOT_IN_NAV,
        )
        stem = relative.removesuffix(".md")
        result.dest_uri = (
            f"bench-results/{stem}.html" if path.suffix == ".md" else (f"bench-results/{relative}")
        )
        result.url = result.dest_uri
        result.abs_dest_path = str(Path(config.site_dir) / result.dest_uri)
        files.append(result)
    return files


def on_page_markdown(markdown: str, page: Page, **_: Any) -> str:
    """A docs page's link to `../README.md` is a link to the home page."""
    if page.file.src_uri == "index.md":
        return markdown
    depth = page.file.src_uri.count("/")
    readme = "../" * (depth + 1) + "README.md"
    home = "../" * depth + "index.md"
    return markdown.replace(f"]({readme}", f"]({home}")
