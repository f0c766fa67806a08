"""`edge-agent run`: the service — load the config, run the frame loop, stop cleanly on SIGTERM.

Start-up order: config (exit 1 on an invalid file, 2 on an unreadable one), metrics endpoint,
detector and broker client (exit 1 with one line on a bad model file or secret), cameras; then
`READY=1` to systemd. The frame loop pings the systemd watchdog from inside the loop, so a hung
loop stops the pings and systemd restarts the service. On SIGTERM / SIGINT: `STOPPING=1`, the
cameras close, lasting events end, the outbox flushes (bounded), `offline` is published.

On SIGHUP (`systemctl reload edge-agent`) the config file is read again and its camera and
detector changes are applied without a restart (`pipeline.reload`; a new model is loaded in a
reload thread and swapped in between frames, `pipeline.model_swap`): `RELOADING=1`, then
`READY=1` with the outcome as the status line. A new config that does not validate, that
changes more than cameras and the detector, or whose model does not load or names other
classes, is refused with its reasons in the log, and the running one stays.

With `fleet.enabled` the box boots on the fleet model its state keeps (its hash checked again,
`edge_agent.fleet.boot`), and a `FleetUpdater` follows the rollouts; a reload then keeps the
fleet's model file under the file's detector settings.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from configkit.cli import locate_problems
from configkit.secrets import SecretError
from configkit.signals import set_on_signals, stop_on_signals
from configkit.yaml_loader import ConfigError, load_config
from detection.config import DetectorConfig
from detection.errors import DetectionError
from detection.model_metadata import model_file_issues
from edge_agent.config import EdgeAgentConfig
from edge_agent.fleet import FleetUpdater, boot_config
from edge_agent.metrics import EdgeMetrics, start_edge_metrics_exporter
from edge_agent.pipeline import EdgeAgent
from edge_agent.pipeline.reload import ReloadPlan, ReloadRefused
from edge_agent.service import SystemdNotifier
from edge_agent.web import attach_status_page

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


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    """What a reload request came to: the plan applied, or why nothing was."""

    plan: ReloadPlan | None
    error: str | None

    @property
    def ok(self) -> bool:
        """Whether the new config was applied."""
        return self.error is None

    def document(self) -> dict[str, object]:
        """The outcome as JSON, for `POST /api/reload` on the status page."""
        plan = self.plan
        return {
            "ok": self.ok,
            "message": self.message(),
            "added": list(plan.added) if plan else [],
            "removed": list(plan.removed) if plan else [],
            "restarted": list(plan.changed) if plan else [],
            "untouched": list(plan.unchanged) if plan else [],
        }

    def log(self) -> None:
        """Log the outcome: info when applied, error (with every reason) when refused."""
        logger.log(logging.INFO if self.ok else logging.ERROR, "%s", self.message())

    def message(self) -> str:
        """One line (the refusal may span lines: a config error lists each bad YAML line)."""
        if self.plan is not None:
            return f"reloaded: {self.plan.summary()}"
        return f"reload refused, the running config stays: {self.error}"


def reload_from_file(
    agent: EdgeAgent,
    config_path: str | Path,
    *,
    timeout_s: float = 30.0,
    adjust: Callable[[EdgeAgentConfig], EdgeAgentConfig] | None = None,
) -> ReloadOutcome:
    """Read `config_path` again and apply its camera and detector changes to `agent`.

    Call it from any thread but the frame loop's: the new config (and model) is handed to the
    loop and waited for, up to `timeout_s`. `adjust` changes the config read before it is
    applied (the fleet updater keeps its model).
    """
    try:
        config = load_config(config_path, EdgeAgentConfig)
    except OSError as exc:
        return ReloadOutcome(None, f"cannot read {config_path}: {exc}")
    except ConfigError as exc:
        return ReloadOutcome(None, str(exc))
    if adjust is not None:
        config = adjust(config)
    try:
        plan = agent.request_reload(config).result(timeout_s)
    except ReloadRefused as exc:
        return ReloadOutcome(None, str(exc))
    except TimeoutError:
        return ReloadOutcome(None, f"the frame loop did not take the reload within {timeout_s} s")
    return ReloadOutcome(plan, None)


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
            config,
            Path(config_path),
            env,
            metrics,
            stop or threading.Event(),
            max_runtime_s,
            flush_timeout_s,
            say,
        )
    finally:
        if exporter is not None:
            exporter.close()


def _run(
    config: EdgeAgentConfig,
    config_path: Path,
    environ: Mapping[str, str],
    metrics: EdgeMetrics,
    stop: threading.Event,
    max_runtime_s: float | None,
    flush_timeout_s: float,
    say: Callable[[str], object],
) -> int:
    own_detector = config.detector
    try:
        config, fleet_state = boot_config(config)
    except OSError as exc:
        say(f"edge-agent run: cannot read or write the fleet state: {exc}\n")
        return EXIT_FAILED
    try:
        agent = _build_agent(config, own_detector, environ, metrics)
    except DetectionError as exc:
        # the field and YAML line of a missing or unreadable model, as validate-config says it
        located = locate_problems(config_path, config, model_file_issues)
        say(f"edge-agent run: cannot load the detector: {located or exc}\n")
        return EXIT_FAILED
    except SecretError as exc:
        say(f"edge-agent run: cannot read a secret: {exc}\n")
        return EXIT_FAILED

    try:
        updater = (
            FleetUpdater(agent, own_detector, fleet_state, environ=environ, metrics=metrics)
            if config.fleet.enabled
            else None
        )
    except (SecretError, OSError, ValueError) as exc:  # a secret, the state folder, a CA file
        agent.publisher.outbox.close()
        agent.detector.close()
        say(f"edge-agent run: cannot start the fleet updater: {exc}\n")
        return EXIT_FAILED
    adjust = updater.keep_model if updater is not None else None

    def reload_over_http() -> dict[str, object]:
        outcome = reload_from_file(agent, config_path, adjust=adjust)
        outcome.log()
        return outcome.document()

    try:
        resolver = agent.media.resolve if agent.media is not None else None
        page = attach_status_page(
            agent, config.web, environ=environ, media_resolver=resolver, reload=reload_over_http
        )
    except (SecretError, OSError) as exc:
        agent.publisher.outbox.close()
        agent.detector.close()
        where = f"{config.web.host}:{config.web.port}"
        say(f"edge-agent run: cannot serve the status page on {where}: {exc}\n")
        return EXIT_FAILED
    try:
        return _serve(
            agent, config, config_path, environ, stop, max_runtime_s, flush_timeout_s, updater
        )
    finally:
        if page is not None:
            page.close()


def _build_agent(
    config: EdgeAgentConfig,
    own_detector: DetectorConfig,
    environ: Mapping[str, str],
    metrics: EdgeMetrics,
) -> EdgeAgent:
    """The agent of `config`; a fleet model that does not load (its hash was checked: a bad
    runtime install) falls back to the config's own model, logged."""
    try:
        return EdgeAgent.from_config(config, environ=environ, metrics=metrics)
    except DetectionError as exc:
        if config.detector == own_detector:
            raise
        logger.error("fleet: the kept model does not load (%s); booting on the config's model", exc)
        own = config.model_copy(update={"detector": own_detector})
        return EdgeAgent.from_config(own, environ=environ, metrics=metrics)


def _serve(
    agent: EdgeAgent,
    config: EdgeAgentConfig,
    config_path: Path,
    environ: Mapping[str, str],
    stop: threading.Event,
    max_runtime_s: float | None,
    flush_timeout_s: float,
    updater: FleetUpdater | None = None,
) -> int:
    notifier = SystemdNotifier(environ)
    deadline = None if max_runtime_s is None else time.monotonic() + max_runtime_s
    next_status = 0.0
    reload_requested = threading.Event()

    reloader: threading.Thread | None = None

    def reload() -> None:
        # Off the frame loop: a new model loads here while frames go on; the loop swaps it in.
        notifier.reloading()
        outcome = reload_from_file(
            agent, config_path, adjust=updater.keep_model if updater is not None else None
        )
        outcome.log()
        notifier.ready(f"{outcome.message().splitlines()[0]}; {status_line(agent)}")

    def on_idle() -> None:
        nonlocal next_status, reloader
        notifier.watchdog()
        if reload_requested.is_set() and (reloader is None or not reloader.is_alive()):
            reload_requested.clear()
            reloader = threading.Thread(target=reload, name="config-reload", daemon=True)
            reloader.start()
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            stop.set()
        if now >= next_status:
            next_status = now + _STATUS_EVERY_S
            notifier.status(status_line(agent))

    with (
        stop_on_signals(stop, what="stopping the agent"),
        set_on_signals(reload_requested, (signal.SIGHUP,), what="reloading the config"),
    ):
        agent.start()
        if updater is not None:
            updater.start()
        notifier.ready(f"{len(agent.workers)} camera(s) started")
        logger.info("edge agent %s running %d camera(s)", config.agent.id, len(agent.workers))
        try:
            agent.run(stop, on_idle=on_idle)
        finally:
            if updater is not None:
                updater.close()
            notifier.stopping("flushing alerts")
            notifier.extend_timeout(flush_timeout_s + 10.0)
            agent.close(flush_timeout_s=flush_timeout_s)
    logger.info("edge agent stopped")
    return EXIT_OK
