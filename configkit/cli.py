"""`validate-config`, shared by the edge agent and cloud service CLIs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ValidationError

from configkit.secrets import SecretError, find_secret_refs
from configkit.yaml_loader import (
    ConfigError,
    ConfigIssue,
    KeyPath,
    LoadedYaml,
    LocatedMessage,
    format_key_path,
    parse_yaml,
    validate_loaded,
)

__all__ = [
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_UNREADABLE",
    "ModelCheck",
    "add_log_level_argument",
    "build_parser",
    "locate_problems",
    "run_cli",
    "validate_config_command",
    "validate_config_subcommand",
]

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_UNREADABLE = 2

ModelT = TypeVar("ModelT", bound=BaseModel)


ModelCheck = Callable[[BaseModel], Iterable[LocatedMessage]]
"""A check beyond the model's own validation (e.g. that model files exist): problems found in a
validated config, or in one of its top-level sections, as `(key path, message)` pairs."""


def _issue_at(loaded: LoadedYaml, path: KeyPath, message: str) -> ConfigIssue:
    pos = loaded.position_of(path)
    return ConfigIssue(loaded.file, pos.line, pos.column, format_key_path(path), message)


def locate_problems(
    path: str | Path, config: BaseModel, checks: ModelCheck | Sequence[ModelCheck]
) -> ConfigError | None:
    """The problems `checks` find in `config`, the validated content of the file `path`, each
    placed at its YAML line as `validate-config` reports it; None when there are none (or the
    file cannot be read again). For `run` / `serve` when a model fails to load: the bare error
    names the file, this names the field and the line that gave it."""
    try:
        loaded = parse_yaml(Path(path).read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, ConfigError):
        return None
    check_list = [checks] if callable(checks) else list(checks)
    issues = [
        _issue_at(loaded, where, message)
        for check in check_list
        for where, message in check(config)
    ]
    return (
        ConfigError(sorted(issues, key=lambda issue: (issue.line, issue.column)))
        if issues
        else None
    )


def _secret_issues(
    loaded: LoadedYaml, config: BaseModel, prefix: KeyPath = ()
) -> list[ConfigIssue]:
    issues = []
    for path, ref in find_secret_refs(config):
        try:
            ref.resolve()
        except SecretError as error:
            issues.append(_issue_at(loaded, (*prefix, *path), str(error)))
    return issues


def _valid_sections(loaded: LoadedYaml, model: type[BaseModel]) -> list[tuple[KeyPath, BaseModel]]:
    """The top-level sections of an invalid file that are valid on their own (a section typed
    by a model of its own), so the extra checks still cover them in the same pass."""
    if not isinstance(loaded.data, Mapping):
        return []
    sections: list[tuple[KeyPath, BaseModel]] = []
    for name, field in model.model_fields.items():
        annotation, value = field.annotation, loaded.data.get(name)
        if not isinstance(value, Mapping) or not isinstance(annotation, type):
            continue
        if not issubclass(annotation, BaseModel):
            continue
        try:
            sections.append(((name,), annotation.model_validate(value)))
        except ValidationError:
            continue
    return sections


def _validate_file(
    path: str | Path,
    model: type[ModelT],
    summarize: Callable[[ModelT], str] | None,
    check_secrets: bool,
    checks: Sequence[ModelCheck],
) -> int:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        print(f"{path}: cannot read: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    try:
        loaded = parse_yaml(text, str(path))
    except ConfigError as error:
        print(error, file=sys.stderr)
        return EXIT_INVALID
    issues: list[ConfigIssue] = []
    config: ModelT | None = None
    try:
        config = validate_loaded(loaded, model)
    except ConfigError as error:
        issues += error.issues
    targets: list[tuple[KeyPath, BaseModel]] = (
        [((), config)] if config is not None else _valid_sections(loaded, model)
    )
    for prefix, target in targets:
        if check_secrets:
            issues += _secret_issues(loaded, target, prefix)
        for check in checks:
            issues += [
                _issue_at(loaded, (*prefix, *where), message) for where, message in check(target)
            ]
    if issues or config is None:  # an invalid file always has issues
        unique = list(dict.fromkeys(issues))
        unique.sort(key=lambda issue: (issue.line, issue.column))
        print(ConfigError(unique), file=sys.stderr)
        return EXIT_INVALID
    summary = f" ({summarize(config)})" if summarize is not None else ""
    print(f"{path}: OK{summary}")
    return EXIT_OK


def validate_config_command(
    paths: str | Path | Sequence[str | Path],
    model: type[ModelT],
    summarize: Callable[[ModelT], str] | None = None,
    *,
    check_secrets: bool = False,
    checks: ModelCheck | Sequence[ModelCheck] | None = None,
) -> int:
    """Validate each YAML file in `paths` with `model` and report on stdout / stderr.

    Per file, in the order given: `FILE: OK (summary)` on stdout for a valid file, or one
    `FILE:LINE: path: message` line per error on stderr, every error of the file at once (field
    errors, cross-field checks, the extra `checks`), sorted by line. Returns the worst outcome:
    0 when every file is valid, 1 when one is invalid, 2 when one cannot be read.

    With `check_secrets`, every secret the config names must also resolve now (as under
    systemd's `ExecStartPre`, which sees the service's credentials). `checks` (e.g. that the
    model files exist and load) run on a valid config, or on the top-level sections that are
    valid on their own when the file has errors elsewhere.
    """
    files = [paths] if isinstance(paths, str | Path) else list(paths)
    if checks is None:
        check_list: list[ModelCheck] = []
    elif callable(checks):
        check_list = [checks]
    else:
        check_list = list(checks)
    outcomes = [_validate_file(f, model, summarize, check_secrets, check_list) for f in files]
    return max(outcomes, default=EXIT_OK)


if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

Handler = Callable[[argparse.Namespace], int]
SubcommandRegistrar = Callable[["Subparsers"], None]
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def validate_config_subcommand(
    model: type[ModelT],
    summarize: Callable[[ModelT], str] | None,
    *,
    model_checks: ModelCheck,
    component: str,
    host: str,
    check_secrets_option: bool = False,
) -> SubcommandRegistrar:
    """The `validate-config` subcommand of a CLI whose YAML config is `model`.

    FILE arguments and `--skip-model-check` (leaves `model_checks` out), plus `--check-secrets`
    with `check_secrets_option`. `component` names what reads the config ("edge agent"), `host`
    where it runs ("box"), for the help texts.
    """

    def handle(args: argparse.Namespace) -> int:
        return validate_config_command(
            args.files,
            model,
            summarize,
            check_secrets=check_secrets_option and args.check_secrets,
            checks=None if args.skip_model_check else model_checks,
        )

    def register(subparsers: Subparsers) -> None:
        parser = subparsers.add_parser(
            "validate-config",
            help="check config files and report every error with its line",
            description=(
                "Exit 0 when every FILE is valid, 1 when one is not, 2 when one cannot be read. "
                "Model files named in a config must exist and load (relative paths from the "
                f"working directory, as the {component} reads them)."
            ),
        )
        parser.add_argument("files", nargs="+", metavar="FILE", help=f"{component} YAML config")
        if check_secrets_option:
            parser.add_argument(
                "--check-secrets",
                action="store_true",
                help="also require every secret named in the file to resolve now (env / "
                "credentials)",
            )
        parser.add_argument(
            "--skip-model-check",
            action="store_true",
            help=f"do not open the model files (validating a config away from the {host} that "
            "runs it)",
        )
        parser.set_defaults(handler=handle)

    return register


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
