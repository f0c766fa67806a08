"""`cloud-service` command line: one function per subcommand, all registered in `_SUBCOMMANDS`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cloud_service.auth import AuthConfigError
from cloud_service.config import CloudServiceConfig
from cloud_service.server import ServerBindError
from configkit.cli import (
    SubcommandRegistrar,
    add_log_level_argument,
    build_parser,
    run_cli,
    validate_config_command,
)
from configkit.yaml_loader import ConfigError, load_config
from detection.errors import DetectionError

if TYPE_CHECKING:
    from configkit.cli import Subparsers


def _validate_config(args: argparse.Namespace) -> int:
    from detection.model_metadata import model_file_issues

    return validate_config_command(
        args.files,
        CloudServiceConfig,
        CloudServiceConfig.summary,
        checks=None if args.skip_model_check else model_file_issues,
    )


def _add_validate_config(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "validate-config",
        help="check config files and report every error with its line",
        description=(
            "Exit 0 when every FILE is valid, 1 when one is not, 2 when one cannot be read. "
            "The engine's model file must exist and load (relative paths from the working "
            "directory, as the service reads them)."
        ),
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="cloud service YAML config")
    parser.add_argument(
        "--skip-model-check",
        action="store_true",
        help="do not open the model files (validating a config away from the host that runs it)",
    )
    parser.set_defaults(handler=_validate_config)


def _serve(args: argparse.Namespace) -> int:
    from cloud_service.app import serve  # the engine stack loads only for `serve`

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load_config(args.config, CloudServiceConfig)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        serve(config, reload_config=lambda: load_config(args.config, CloudServiceConfig))
    except (DetectionError, ServerBindError, AuthConfigError) as exc:
        print(f"cloud-service serve: {exc}", file=sys.stderr)
        return 1
    return 0


def _add_serve(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the gRPC inference service until SIGTERM",
        description=(
            "Load the engine, serve analytics.v1.InferenceService, drain on SIGTERM; SIGHUP "
            "reloads the config and swaps in its models without dropping a frame."
        ),
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="cloud service YAML")
    add_log_level_argument(parser, "INFO")
    parser.set_defaults(handler=_serve)


# Add a subcommand by writing `_add_<name>` (which sets `handler`) and listing it here.
_SUBCOMMANDS: tuple[SubcommandRegistrar, ...] = (_add_validate_config, _add_serve)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `cloud-service` command line; returns the process exit code."""
    parser = build_parser(
        "cloud-service", "Cloud detection service: batched inference over gRPC.", _SUBCOMMANDS
    )
    return run_cli(parser, argv)
