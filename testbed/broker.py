"""An MQTT broker on a free loopback port for the demo: Mosquitto where installed, else amqtt.

`start_broker(kind, work_dir)` returns a started `LocalBroker` (`host`, `port`, `kind`,
`stop()`, `log_tail()`). `auto` picks Mosquitto when the binary is on the PATH (or in
/usr/sbin) and the embedded, pure-Python amqtt broker otherwise. Both run as child processes,
so a slow broker never competes with the demo's frame loop for the GIL. Mosquitto is run with
`max_queued_messages 0` (its default of 1000 drops QoS 1 messages to a slow subscriber).

The embedded broker is also a command (what the child process runs):

    python -m testbed.broker --port 1883        # prints `READY mqtt://127.0.0.1:1883`
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import logging
import os
import pwd
import shutil
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from testbed.processes import ManagedProcess, free_tcp_port, tcp_port_accepts

logger = logging.getLogger(__name__)

BrokerKind = Literal["auto", "mosquitto", "amqtt"]
BROKER_HOST = "127.0.0.1"
_MOSQUITTO_FALLBACK = Path("/usr/sbin/mosquitto")


class BrokerUnavailableError(RuntimeError):
    """The asked-for broker cannot run here; the message says what to install."""


@dataclass
class LocalBroker:
    """A started broker process on `host:port`."""

    kind: Literal["mosquitto", "amqtt"]
    host: str
    port: int
    process: ManagedProcess

    def stop(self, *, term_timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL; clients see their connection close."""
        self.process.stop(term_timeout_s=term_timeout_s)

    def log_tail(self, lines: int = 40) -> str:
        """The broker's last log lines, for error messages."""
        return self.process.output_tail(lines)


def mosquitto_executable() -> str | None:
    """The Mosquitto binary, or None when it is not installed."""
    found = shutil.which("mosquitto")
    if found is not None:
        return found
    return str(_MOSQUITTO_FALLBACK) if _MOSQUITTO_FALLBACK.is_file() else None


def amqtt_available() -> bool:
    """Whether the embedded broker (the `amqtt` package) can be imported."""
    try:
        return importlib.util.find_spec("amqtt.broker") is not None
    except ModuleNotFoundError:
        return False


def mosquitto_config(host: str, port: int, extra: Sequence[str] = ()) -> str:
    """A `mosquitto.conf`: one anonymous listener, no persistence, no queue limit, logging to
    stdout; `extra` lines are appended."""
    lines = [
        f"listener {port} {host}",
        "allow_anonymous true",
        "persistence false",
        "max_queued_messages 0",
        "log_dest stdout",
        "log_type error",
        "log_type warning",
        "log_type notice",
    ]
    if os.geteuid() == 0:
        # As root Mosquitto drops to its own `mosquitto` user, which cannot write into the
        # caller's private temp folders; stay the user that runs the demo or the tests.
        lines.append(f"user {pwd.getpwuid(os.geteuid()).pw_name}")
    return "\n".join([*lines, *extra]) + "\n"


def start_broker(kind: BrokerKind, work_dir: Path, *, ready_timeout_s: float = 15.0) -> LocalBroker:
    """Start a broker of `kind` on a free loopback port and wait until it accepts connections.

    Raises `BrokerUnavailableError` when the broker cannot run here, `ProcessStartError` (with
    its output) when it does not start.
    """
    executable = mosquitto_executable()
    if kind == "auto":
        kind = "mosquitto" if executable is not None else "amqtt"
    port = free_tcp_port(BROKER_HOST)
    if kind == "mosquitto":
        if executable is None:
            raise BrokerUnavailableError("mosquitto not found (apt-get install mosquitto)")
        work_dir.mkdir(parents=True, exist_ok=True)
        config = work_dir / f"mosquitto-{port}.conf"
        config.write_text(mosquitto_config(BROKER_HOST, port))
        argv = [executable, "-c", str(config)]
        process = ManagedProcess(
            f"mosquitto:{port}",
            argv,
            ready_check=lambda: tcp_port_accepts(BROKER_HOST, port),
        )
    else:
        if not amqtt_available():
            raise BrokerUnavailableError(
                "no MQTT broker: mosquitto is not installed (apt-get install mosquitto) and the "
                "embedded one needs the `amqtt` package (pip install amqtt)"
            )
        argv = [sys.executable, "-m", "testbed.broker", "--host", BROKER_HOST, "--port", str(port)]
        process = ManagedProcess(
            f"amqtt:{port}",
            argv,
            ready_pattern=r"^READY mqtt://",
            ready_check=lambda: tcp_port_accepts(BROKER_HOST, port),
        )
    process.start(ready_timeout_s=ready_timeout_s)
    logger.info("%s broker on %s:%d", kind, BROKER_HOST, port)
    return LocalBroker(kind, BROKER_HOST, port, process)


def amqtt_config(host: str, port: int) -> dict[str, object]:
    """The embedded broker's config: one anonymous TCP listener, no $SYS topics."""
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


async def serve_amqtt(host: str, port: int) -> None:
    """Run the embedded broker until SIGTERM or SIGINT."""
    # Imported here: an optional dependency, and untyped (no stubs).
    amqtt_broker: Any = importlib.import_module("amqtt.broker")
    broker = amqtt_broker.Broker(amqtt_config(host, port))
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"READY mqtt://{host}:{port}", flush=True)  # the parent waits for this line
    await stop.wait()
    with contextlib.suppress(Exception):  # best effort: the process ends anyway
        await broker.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m testbed.broker`: the embedded (amqtt) broker on one loopback port."""
    parser = argparse.ArgumentParser(description="Embedded MQTT broker (amqtt) for the demo.")
    parser.add_argument("--host", default=BROKER_HOST, help="address to listen on")
    parser.add_argument("--port", type=int, default=1883, help="TCP port to listen on")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not amqtt_available():
        print("the embedded broker needs the `amqtt` package", file=sys.stderr)
        return 3
    asyncio.run(serve_amqtt(args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
