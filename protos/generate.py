"""Regenerate the Python code of every `.proto` under `protos/`, or check that it is fresh.

Usage (from the repository root)::

    python -m protos.generate          # rewrite the generated files in place
    python -m protos.generate --check  # exit 1 listing stale, missing or orphaned files

Generation runs `grpc_tools.protoc` with `-I <repo root>` so that the modules import as
`protos.analytics.v1.analytics_pb2`; typing stubs come from mypy-protobuf. The output depends
only on the `.proto` files and the pinned tool versions, so `--check` compares byte for byte.
"""

from __future__ import annotations

import argparse
import filecmp
import logging
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTOS_DIR = REPO_ROOT / "protos"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


class GenerationError(RuntimeError):
    """protoc or one of its plugins failed."""


def find_proto_files(protos_dir: Path = PROTOS_DIR) -> list[Path]:
    """Every `.proto` under `protos_dir`, sorted, relative to the repository root."""
    return sorted(p.relative_to(protos_dir.parent) for p in protos_dir.rglob("*.proto"))


def _plugin(name: str) -> str:
    """Path of a protoc plugin installed beside this interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise GenerationError(f"protoc plugin {name!r} not found; install mypy-protobuf")
    return found


def generate(out_dir: Path, repo_root: Path = REPO_ROOT) -> list[Path]:
    """Generate code for all protos into `out_dir`; return the written files relative to it."""
    protos = find_proto_files(repo_root / "protos")
    if not protos:
        raise GenerationError(f"no .proto files under {repo_root / 'protos'}")
    well_known = resources.files("grpc_tools") / "_proto"
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-I.",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *(str(p) for p in protos),
    ]
    completed = subprocess.run(  # noqa: S603 - fixed argv, no shell
        command, cwd=repo_root, capture_output=True, text=True, check=False
    )
    if completed.returncode != 0:
        raise GenerationError(f"protoc failed ({completed.returncode}): {completed.stderr.strip()}")
    return sorted(p.relative_to(out_dir) for p in out_dir.rglob("*") if p.is_file())


def _generated_in_tree(repo_root: Path) -> set[Path]:
    protos_dir = repo_root / "protos"
    return {
        p.relative_to(repo_root)
        for p in protos_dir.rglob("*")
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


def stale_files(repo_root: Path = REPO_ROOT) -> list[str]:
    """Describe every generated file that differs from fresh output; empty when all are fresh."""
    with tempfile.TemporaryDirectory(prefix="protos-check-") as tmp:
        fresh_dir = Path(tmp)
        fresh = set(generate(fresh_dir, repo_root))
        problems: list[str] = []
        for rel in sorted(fresh):
            in_tree = repo_root / rel
            if not in_tree.is_file():
                problems.append(f"missing: {rel}")
            elif not filecmp.cmp(fresh_dir / rel, in_tree, shallow=False):
                problems.append(f"stale: {rel}")
        problems.extend(f"orphaned: {rel}" for rel in sorted(_generated_in_tree(repo_root) - fresh))
        return problems


def write_generated(repo_root: Path = REPO_ROOT) -> list[Path]:
    """Regenerate into the tree, removing orphaned generated files; return the written files."""
    with tempfile.TemporaryDirectory(prefix="protos-gen-") as tmp:
        fresh_dir = Path(tmp)
        fresh = generate(fresh_dir, repo_root)
        for rel in sorted(_generated_in_tree(repo_root) - set(fresh)):
            logger.info("removing orphaned %s", rel)
            (repo_root / rel).unlink()
        for rel in fresh:
            target = repo_root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fresh_dir / rel, target)
            logger.info("wrote %s", rel)
        return fresh


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m protos.generate", description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="do not write; exit 1 if generated code is stale"
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=REPO_ROOT,
        help="repository root holding protos/ (default: this checkout)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.check:
            problems = stale_files(args.root)
            for problem in problems:
                print(problem)  # noqa: T201 - CLI output
            if problems:
                print("generated code is stale: run `python -m protos.generate`")  # noqa: T201
                return 1
            return 0
        write_generated(args.root)
    except GenerationError as exc:
        logger.error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
