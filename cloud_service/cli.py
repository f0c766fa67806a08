"""`cloud-service` command line: one function per subcommand, all registered in `_SUBCOMMANDS`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from cloud_service.auth import AuthConfigError
from cloud_service.config import CloudServiceConfig
from cloud_service.server import ServerBindError
from configkit.cli import (
    SubcommandRegistrar,
    add_log_level_argument,
    build_parser,
    locate_problems,
    run_cli,
    validate_config_subcommand,
)
from configkit.yaml_loader import ConfigError, LocatedMessage, load_config
from detection.errors import DetectionError

if TYPE_CHECKING:
    from configkit.cli import Subparsers


def _model_checks(config: BaseModel) -> list[LocatedMessage]:
    """The engine's model file exists and loads (imported only when the check runs)."""
    from detection.model_metadata import model_file_issues

    return model_file_issues(config)


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
    except DetectionError as exc:
        # the field and YAML line of a missing or unreadable model, as validate-config says it
        located = locate_problems(args.config, config, _model_checks)
        print(f"cloud-service serve: {located or exc}", file=sys.stderr)
        return 1
    except (ServerBindError, AuthConfigError) as exc:
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


def _triton_repository(args: argparse.Namespace) -> int:
    from cloud_service.triton_repository import add_version

    try:
        folder = add_version(
            args.repository,
            args.name,
            args.onnx,
            args.version,
            backend=args.backend,
            max_batch_size=args.max_batch_size,
            max_queue_delay_us=args.max_queue_delay_us,
            instances=args.instances,
            version_policy=args.version_policy,
            intra_op_threads=args.intra_op_threads,
        )
    except (DetectionError, FileExistsError, ValueError) as exc:
        print(f"cloud-service triton-repository: {exc}", file=sys.stderr)
        return 1
    print(f"{folder} written; Triton serves it once it (re)loads model {args.name!r}")
    return 0


def _add_triton_repository(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "triton-repository",
        help="add an ONNX detector to a Triton model repository as a new version",
        description=(
            "Copy ONNX into REPOSITORY/NAME/VERSION/ (config.pbtxt with the first version: "
            "input/output, dynamic batching, version policy, the model's metadata as "
            "parameters). Backend `python` runs it with ONNX Runtime in Triton's Python backend "
            "(any Triton, PyTriton's included); `onnxruntime` uses Triton's ONNX Runtime backend."
        ),
    )
    parser.add_argument("--onnx", type=Path, required=True, help="the ONNX detector")
    parser.add_argument("--repository", type=Path, required=True, help="model repository folder")
    parser.add_argument("--name", required=True, help="model name in the repository")
    parser.add_argument("--version", type=int, required=True, help="new version number (>= 1)")
    parser.add_argument("--backend", choices=("python", "onnxruntime"), default="python")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-queue-delay-us", type=int, default=2000)
    parser.add_argument("--instances", type=int, default=1, help="model instances (CPU)")
    parser.add_argument(
        "--version-policy",
        choices=("latest", "all"),
        default="latest",
        help="`latest`: the newest version serves; `all`: every version stays loaded (A/B)",
    )
    parser.add_argument("--intra-op-threads", type=int, default=0, help="python backend only")
    parser.set_defaults(handler=_triton_repository)


# Add a subcommand by writing `_add_<name>` (which sets `handler`) and listing it here.
_SUBCOMMANDS: tuple[SubcommandRegistrar, ...] = (
    validate_config_subcommand(
        CloudServiceConfig,
        CloudServiceConfig.summary,
        model_checks=_model_checks,
        component="cloud service",
        host="host",
    ),
    _add_serve,
    _add_triton_repository,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `cloud-service` command line; returns the process exit code."""
    parser = build_parser(
        "cloud-service", "Cloud detection service: batched inference over gRPC.", _SUBCOMMANDS
    )
    return run_cli(parser, argv)
