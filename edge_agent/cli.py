"""`edge-agent` command line: one function per subcommand, all registered in `_SUBCOMMANDS`."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from configkit.cli import validate_config_command
from edge_agent.config import EdgeAgentConfig

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

Handler = Callable[[argparse.Namespace], int]


def _validate_config(args: argparse.Namespace) -> int:
    return validate_config_command(
        args.file, EdgeAgentConfig, EdgeAgentConfig.summary, check_secrets=args.check_secrets
    )


def _add_validate_config(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "validate-config",
        help="check a config file and report each error with its line",
        description="Exit 0 when FILE is valid, 1 when it is not, 2 when it cannot be read.",
    )
    parser.add_argument("file", metavar="FILE", help="edge agent YAML config")
    parser.add_argument(
        "--check-secrets",
        action="store_true",
        help="also require every secret named in the file to resolve now (env / credentials)",
    )
    parser.set_defaults(handler=_validate_config)


# Add a subcommand by writing `_add_<name>` (which sets `handler`) and listing it here.
_SUBCOMMANDS: tuple[Callable[[Subparsers], None], ...] = (_add_validate_config,)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="edge-agent", description="Edge video analytics agent: cameras, detection, alerts."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in _SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    return handler(args)
