"""`validate-config`, shared by the edge agent and cloud service CLIs."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

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

__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_UNREADABLE", "validate_config_command"]

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
