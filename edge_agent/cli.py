"""`edge-agent` command line: one function per subcommand, all registered in `_SUBCOMMANDS`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel

from configkit.cli import (
    SubcommandRegistrar,
    add_log_level_argument,
    build_parser,
    run_cli,
    validate_config_subcommand,
)
from configkit.yaml_loader import LocatedMessage
from detection.config import unknown_class_message
from detection.errors import DetectionError
from edge_agent.config import EdgeAgentConfig

if TYPE_CHECKING:
    from configkit.cli import Subparsers


def _model_checks(config: BaseModel) -> list[LocatedMessage]:
    """The model files of the detector exist and fit it; with the model's own class names (no
    `detector.class_names`), the rules' `classes` must be among them."""
    from detection.model_metadata import find_detector_configs, inspect_detector_model

    issues: list[LocatedMessage] = []
    for path, detector in find_detector_configs(config):
        inspection = inspect_detector_model(detector)
        issues += [((*path, *where), message) for where, message in inspection.issues]
        names = inspection.class_names
        if not isinstance(config, EdgeAgentConfig) or detector.class_names or not names:
            continue
        for camera_index, camera in enumerate(config.cameras):
            for rule_index, rule in enumerate(camera.rules):
                for class_index, class_name in enumerate(rule.classes):
                    if class_name not in names:
                        where = ("cameras", camera_index, "rules", rule_index, "classes")
                        issues.append(
                            (
                                (*where, class_index),
                                unknown_class_message(
                                    class_name, names, f"the detector's model (rule {rule.name!r})"
                                ),
                            )
                        )
    return issues


def _detect(args: argparse.Namespace) -> int:
    from pathlib import Path

    from detection.config import DetectorConfig
    from edge_agent.detect_command import SourceError, run_detect, runtime_config_for

    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = DetectorConfig(
            runtime=runtime_config_for(Path(args.model), args.threads),
            confidence_threshold=args.confidence,
            iou_threshold=args.iou,
            class_names=args.class_names.split(",") if args.class_names else [],
            classes=args.classes.split(",") if args.classes else [],
            input_size=args.imgsz,
        )
        summary = run_detect(
            config, args.source, sys.stdout, max_frames=args.max_frames, fmt=args.format
        )
    except (DetectionError, SourceError, ValueError) as exc:
        print(f"edge-agent detect: {exc}", file=sys.stderr)
        return 1
    print(summary.line(), file=sys.stderr)
    return 0


def _input_size(text: str) -> tuple[int, int]:
    """`S` (square) or `H,W`, in pixels."""
    try:
        sides = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected S or H,W in pixels, got {text!r}") from None
    if len(sides) == 1:
        sides *= 2
    if len(sides) != 2:
        raise argparse.ArgumentTypeError(f"expected S or H,W in pixels, got {text!r}")
    return sides[0], sides[1]


def _add_detect(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "detect",
        help="run a detector model over a video file or RTSP stream and print the boxes",
        description="Runtime chosen by the model file: .onnx, .tflite or .engine/.plan.",
    )
    parser.add_argument("--model", required=True, help="model file (.onnx, .tflite, .engine)")
    parser.add_argument("--source", required=True, help="video file path or rtsp:// URL")
    parser.add_argument(
        "--imgsz", type=_input_size, default=None, help="input S or H,W for dynamic models"
    )
    parser.add_argument("--confidence", type=float, default=0.25, help="lowest score kept")
    parser.add_argument("--iou", type=float, default=0.45, help="NMS IoU threshold")
    parser.add_argument(
        "--class-names",
        default="",
        help="comma-separated names by class id (default: the model's own, from its metadata)",
    )
    parser.add_argument(
        "--classes", default="", help="comma-separated class names to keep (default: all)"
    )
    parser.add_argument("--threads", type=int, default=2, help="runtime CPU threads")
    parser.add_argument("--max-frames", type=int, default=None, help="stop after N frames")
    parser.add_argument("--format", choices=["text", "jsonl"], default="text")
    add_log_level_argument(parser, "WARNING")
    parser.set_defaults(handler=_detect)


def _run(args: argparse.Namespace) -> int:
    from edge_agent.run_command import run_agent

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_agent(args.config, max_runtime_s=args.max_runtime_s, err=sys.stderr)


def _add_run(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run the agent: cameras, detection, tracking, rules, MQTT alerts (the service)",
        description="Runs until SIGTERM or SIGINT, then flushes alerts and exits 0.",
    )
    parser.add_argument("--config", required=True, help="edge agent YAML config")
    parser.add_argument(
        "--max-runtime-s",
        type=float,
        default=None,
        help="stop on its own after this many seconds (demos, tests)",
    )
    add_log_level_argument(parser, "INFO")
    parser.set_defaults(handler=_run)


def _add_alerts(subparsers: Subparsers) -> None:
    from edge_agent.alerts.subscriber import add_alerts_arguments, alerts_command

    parser = subparsers.add_parser(
        "alerts",
        help="subscribe to the agent's MQTT alerts and print them as they arrive",
        description="Reads the broker settings from an agent's config file or a consumer's own.",
    )
    add_alerts_arguments(parser)
    parser.set_defaults(handler=alerts_command)


# Add a subcommand by writing `_add_<name>` (which sets `handler`) and listing it here.
_SUBCOMMANDS: tuple[SubcommandRegistrar, ...] = (
    validate_config_subcommand(
        EdgeAgentConfig,
        EdgeAgentConfig.summary,
        model_checks=_model_checks,
        component="edge agent",
        host="box",
        check_secrets_option=True,
    ),
    _add_run,
    _add_alerts,
    _add_detect,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `edge-agent` command line; returns the process exit code."""
    parser = build_parser(
        "edge-agent", "Edge video analytics agent: cameras, detection, alerts.", _SUBCOMMANDS
    )
    return run_cli(parser, argv)
