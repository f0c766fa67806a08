"""What every bench repeats: where the repository, results and caches are, the command line, the
machine and its load, and writing the markdown table with its JSON beside it.

The benches are grouped by what they measure (`bench.edge`, `bench.cloud`, `bench.hybrid`,
`bench.models`, `bench.fleet`) and run as `python -m bench.<group>.<name>`; their results stay
flat in `bench/results/` (the docs link them there).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO_ROOT / "bench"
RESULTS = BENCH_DIR / "results"
CACHE = REPO_ROOT / ".cache"


def command_line(module: str, argv: Sequence[str] | None = None) -> str:
    """`python -m MODULE ARGS` as the bench was run (`argv` None: this process's arguments).

    Pass the bench's `__spec__.name`: the dotted module name both under `python -m` and when a
    test imports the bench and calls `main`."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    return " ".join(["python -m", module, *arguments])


def machine(*extra: str) -> str:
    """`x86_64, 2 CPUs, Python 3.11.2` and any `extra` words (library versions)."""
    parts = [platform.machine(), f"{os.cpu_count()} CPUs", f"Python {platform.python_version()}"]
    return ", ".join([*parts, *extra])


def load_average() -> float:
    """The 1-minute load average (other work on the machine skews timings)."""
    return os.getloadavg()[0]


def write_results(
    stem: str, markdown: str, document: Any, out: Path = RESULTS, *, indent: int = 1
) -> tuple[Path, Path]:
    """`out/STEM.md` (the table, with a final newline) and `out/STEM.json` beside it."""
    out.mkdir(parents=True, exist_ok=True)
    md_path = out / f"{stem}.md"
    json_path = out / f"{stem}.json"
    md_path.write_text(markdown if markdown.endswith("\n") else markdown + "\n")
    json_path.write_text(json.dumps(document, indent=indent) + "\n")
    return md_path, json_path
