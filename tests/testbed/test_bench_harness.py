"""`bench.harness`: the command line a result names, the machine line, and the .md/.json pair."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import harness
from bench.edge import frame_drops


def test_command_line_names_the_module_and_its_arguments() -> None:
    line = harness.command_line("bench.edge.frame_drops", ["--runs", "2"])
    assert line == "python -m bench.edge.frame_drops --runs 2"
    assert harness.command_line("bench.hybrid.uplink", []) == "python -m bench.hybrid.uplink"


@pytest.mark.process
def test_a_bench_names_its_grouped_module_whether_imported_or_run() -> None:
    assert frame_drops.__spec__ is not None
    assert frame_drops.__spec__.name == "bench.edge.frame_drops"
    shown = subprocess.run(
        [sys.executable, "-m", "bench.edge.frame_drops", "--help"],
        cwd=harness.REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert "usage" in shown.stdout


def test_results_are_written_as_a_table_with_its_json_beside_it(tmp_path: Path) -> None:
    out = tmp_path / "new" / "results"
    md_path, json_path = harness.write_results("demo", "| a |\n|---|", {"rows": [1, 2]}, out)
    assert md_path == out / "demo.md"
    assert md_path.read_text() == "| a |\n|---|\n"
    assert json.loads(json_path.read_text()) == {"rows": [1, 2]}
    harness.write_results("demo", "done\n", [], out)  # a final newline is not doubled
    assert md_path.read_text() == "done\n"


def test_paths_and_machine_line() -> None:
    assert (harness.REPO_ROOT / "bench" / "harness.py").is_file()
    assert harness.RESULTS == harness.REPO_ROOT / "bench" / "results"
    assert "CPUs" in harness.machine()
    assert harness.machine("OpenCV 4").endswith(", OpenCV 4")
    assert harness.load_average() >= 0.0
