"""`validate-config`, shared by the edge agent and cloud service CLIs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

from configkit.secrets import SecretError, find_secret_refs
from configkit.yaml_loader import (
    ConfigError,
    ConfigIssue,
    LoadedYaml,
    format_key_path,
    parse_yaml,
    validate_loaded,
)

__all__ = [
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_UNREADABLE",
    "add_log_level_argument",
    "build_parser",
    "run_cli",
    "validate_config_command",
]

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_UNREADABLE = 2

ModelT = TypeVar("ModelT", bound=BaseModel)


def _secret_issues(loaded: LoadedYaml, config: BaseModel) -> list[ConfigIssue]:
    issues = []
    for path, ref in find_secret_refs(config):
        try:
            ref.resolve()
        except SecretError as error:
            pos = loaded.position_of(path)
            issues.append(
                ConfigIssue(loaded.file, pos.line, pos.column, format_key_path(path), str(error))
            )
    return issues


def validate_config_command(
    path: str | Path,
    model: type[ModelT],
    summarize: Callable[[ModelT], str] | None = None,
    *,
    check_secrets: bool = False,
) -> int:
    """Validate the YAML file at `path` with `model` and report on stdout / stderr.

    Prints `FILE: OK (summary)` and returns 0 for a valid file; prints one
    `FILE:LINE: path: message` line per error to stderr and returns 1 for an invalid one; returns 2
    when the file cannot be read. With `check_secrets`, every secret the config names must also
    resolve now (as under systemd's `ExecStartPre`, which sees the service's credentials).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        print(f"{path}: cannot read: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    try:
        loaded = parse_yaml(text, str(path))
        config = validate_loaded(loaded, model)
        if check_secrets:
            missing = _secret_issues(loaded, config)
            if missing:
                raise ConfigError(missing)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return EXIT_INVALID
    summary = f" ({summarize(config)})" if summarize is not None else ""
    print(f"{path}: OK{summary}")
    return EXIT_OK


if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

Handler = Callable[[argparse.Namespace], int]
SubcommandRegistrar = Callable[["Subparsers"], None]
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def add_log_level_argument(parser: argparse.ArgumentParser, default: str) -> None:
    """The `--log-level` option every long-running subcommand takes."""
    parser.add_argument("--log-level", default=default, choices=LOG_LEVELS)


def build_parser(
    prog: str, description: str, subcommands: Sequence[SubcommandRegistrar]
) -> argparse.ArgumentParser:
    """A parser whose subcommands are added by `subcommands` (each sets a `handler` default)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in subcommands:
        register(subparsers)
    return parser


def run_cli(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse `argv` and run the chosen subcommand's handler; returns the exit code."""
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    return handler(args)
