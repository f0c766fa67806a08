"""`edge-agent run`: the service — load the config, run the frame loop, stop cleanly on SIGTERM.

Start-up order: config (exit 1 on an invalid file, 2 on an unreadable one), metrics endpoint,
detector and broker client (exit 1 with one line on a bad model file or secret), cameras; then
`READY=1` to systemd. The frame loop pings the systemd watchdog from inside the loop, so a hung
loop stops the pings and systemd restarts the service. On SIGTERM / SIGINT: `STOPPING=1`, the
cameras close, lasting events end, the outbox flushes (bounded), `offline` is published.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from configkit.secrets import SecretError
from configkit.signals import stop_on_signals
from configkit.yaml_loader import ConfigError, load_config
from detection.errors import DetectionError
from edge_agent.config import EdgeAgentConfig
from edge_agent.metrics import EdgeMetrics, start_edge_metrics_exporter
from edge_agent.pipeline import EdgeAgent
from edge_agent.service import SystemdNotifier

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNREADABLE = 2
_STATUS_EVERY_S = 5.0


def status_line(agent: EdgeAgent) -> str:
    """One line for systemd's `STATUS=` and the log: cameras by state, frame rate, outbox."""
    states: dict[str, int] = {}
    for status in agent.status.values():
        states[status.state] = states.get(status.state, 0) + 1
    cameras = ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
    fps = sum(status.fps() for status in agent.status.values())
    broker = "broker up" if agent.publisher.connected else "broker down"
    return (
        f"cameras: {cameras}; {fps:.1f} frames/s analysed; {broker}, "
        f"outbox {agent.publisher.outbox.depth()}; cloud {agent.cloud_state}"
    )


def run_agent(
    config_path: str | Path,
    *,
    environ: Mapping[str, str] | None = None,
    stop: threading.Event | None = None,
    max_runtime_s: float | None = None,
    flush_timeout_s: float = 10.0,
    err: TextIO | None = None,
) -> int:
    """Run the agent of `config_path` until SIGTERM/SIGINT, `stop`, or `max_runtime_s`."""
    env = os.environ if environ is None else environ
    say: Callable[[str], object] = (
        err.write if err is not None else (lambda text: logger.error("%s", text.rstrip()))
    )
    try:
        config = load_config(config_path, EdgeAgentConfig)
    except OSError as exc:
        say(f"edge-agent run: cannot read {config_path}: {exc}\n")
        return EXIT_UNREADABLE
    except ConfigError as exc:
        say(f"{exc}\n")
        return EXIT_FAILED
    metrics = EdgeMetrics()
    try:
        exporter = start_edge_metrics_exporter(metrics, config.metrics)
    except OSError as exc:
        say(
            f"edge-agent run: cannot serve metrics on "
            f"{config.metrics.listen_host}:{config.metrics.listen_port}: {exc}\n"
        )
        return EXIT_FAILED
    try:
        return _run(
            config, env, metrics, stop or threading.Event(), max_runtime_s, flush_timeout_s, say
        )
    finally:
        if exporter is not None:
            exporter.close()


def _run(
    config: EdgeAgentConfig,
    environ: Mapping[str, str],
    metrics: EdgeMetrics,
    stop: threading.Event,
    max_runtime_s: float | None,
    flush_timeout_s: float,
    say: Callable[[str], object],
) -> int:
    try:
        agent = EdgeAgent.from_config(config, environ=environ, metrics=metrics)
    except DetectionError as exc:
        say(f"edge-agent run: cannot load the detector: {exc}\n")
        return EXIT_FAILED
    except SecretError as exc:
        say(f"edge-agent run: cannot read a secret: {exc}\n")
        return EXIT_FAILED
    notifier = SystemdNotifier(environ)
    deadline = None if max_runtime_s is None else time.monotonic() + max_runtime_s
    next_status = 0.0

    def on_idle() -> None:
        nonlocal next_status
        notifier.watchdog()
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            stop.set()
        if now >= next_status:
            next_status = now + _STATUS_EVERY_S
            notifier.status(status_line(agent))

    with stop_on_signals(stop, what="stopping the agent"):
        agent.start()
        notifier.ready(f"{len(agent.workers)} camera(s) started")
        logger.info("edge agent %s running %d camera(s)", config.agent.id, len(agent.workers))
        try:
            agent.run(stop, on_idle=on_idle)
        finally:
            notifier.stopping("flushing alerts")
            notifier.extend_timeout(flush_timeout_s + 10.0)
            agent.close(flush_timeout_s=flush_timeout_s)
    logger.info("edge agent stopped")
    return EXIT_OK
