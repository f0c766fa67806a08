"""systemd readiness, status and watchdog notifications (`sd_notify(3)`), with no extra dependency.

Under a `Type=notify` unit systemd sets `$NOTIFY_SOCKET`: a datagram socket given as a path, or as
`@name` for the abstract namespace. Each notification is one datagram of newline-separated
`KEY=VALUE` assignments (`READY=1`, `STATUS=...`, `WATCHDOG=1`, `STOPPING=1`). With `WatchdogSec=`
systemd also sets `$WATCHDOG_USEC` (and `$WATCHDOG_PID`, the process meant to ping): the service
must send `WATCHDOG=1` within that time or it is killed and, with `Restart=on-failure`, restarted.

Outside systemd (no `$NOTIFY_SOCKET`) every call is a no-op that returns False, so the agent calls
the notifier unconditionally.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

__all__ = [
    "NOTIFY_SOCKET_ENV",
    "WATCHDOG_PID_ENV",
    "WATCHDOG_USEC_ENV",
    "SystemdNotifier",
    "watchdog_timeout_s",
]

logger = logging.getLogger(__name__)

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV = "WATCHDOG_USEC"
WATCHDOG_PID_ENV = "WATCHDOG_PID"

_USEC_PER_S = 1_000_000


def watchdog_timeout_s(environ: Mapping[str, str], pid: int | None = None) -> float | None:
    """The watchdog timeout systemd expects this process to honour, in seconds, or None.

    None when `$WATCHDOG_USEC` is unset or `$WATCHDOG_PID` names another process than `pid`
    (default: this one). Raises `ValueError` naming the variable when either holds something
    other than a positive integer.
    """
    raw_usec = environ.get(WATCHDOG_USEC_ENV)
    if raw_usec is None:
        return None
    raw_pid = environ.get(WATCHDOG_PID_ENV)
    if raw_pid is not None:
        watched = _positive_int(WATCHDOG_PID_ENV, raw_pid)
        own = os.getpid() if pid is None else pid
        if watched != own:
            logger.debug("watchdog is for pid %s, not %s: not ours", watched, own)
            return None
    return _positive_int(WATCHDOG_USEC_ENV, raw_usec) / _USEC_PER_S


def _positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        raise ValueError(f"${name} must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"${name} must be a positive integer, got {raw!r}")
    return value


def _socket_address(raw: str) -> str | None:
    """The `connect` address of `$NOTIFY_SOCKET`: a path, or `\\0name` for `@name`."""
    if raw.startswith("/"):
        return raw
    if raw.startswith("@") and len(raw) > 1:
        return "\0" + raw[1:]
    return None


class SystemdNotifier:
    """Sends `sd_notify` messages to the socket in `$NOTIFY_SOCKET` of `environ`.

    Each method returns True when the datagram was sent, False when there is no socket (not run
    by systemd as `Type=notify`) or sending failed (logged; a notification never raises).
    Thread-safe: each message goes out on its own short-lived socket.
    """

    def __init__(self, environ: Mapping[str, str] | None = None, *, pid: int | None = None) -> None:
        """Read `$NOTIFY_SOCKET` and the watchdog settings from `environ` (default `os.environ`).

        `pid` is the process the watchdog must belong to (default: this one). Raises
        `ValueError` when the watchdog variables are malformed (see `watchdog_timeout_s`).
        """
        env = os.environ if environ is None else environ
        raw = env.get(NOTIFY_SOCKET_ENV) or None
        self._address = _socket_address(raw) if raw is not None else None
        if raw is not None and self._address is None:
            logger.warning("unsupported $%s %r: systemd notifications off", NOTIFY_SOCKET_ENV, raw)
        self._watchdog_timeout_s = watchdog_timeout_s(env, pid)

    @property
    def enabled(self) -> bool:
        """Whether there is a notification socket to send to."""
        return self._address is not None

    def watchdog_timeout_s(self) -> float | None:
        """`WatchdogSec=` of the unit in seconds, or None when there is no watchdog for us."""
        return self._watchdog_timeout_s

    def watchdog_interval_s(self) -> float | None:
        """How often to call `watchdog()`: half the timeout (as `sd_watchdog_enabled(3)` advises).

        None when there is no watchdog for this process.
        """
        timeout = self._watchdog_timeout_s
        return None if timeout is None else timeout / 2

    def notify(self, *assignments: str) -> bool:
        """Send `KEY=VALUE` assignments in one datagram; the other methods are shorthands."""
        if self._address is None:
            return False
        message = "\n".join(assignments).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self._address)
                sock.sendall(message)
        except OSError as error:
            logger.warning("systemd notification %r failed: %s", assignments, error)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """Tell systemd that start-up is complete (`READY=1`), with an optional status line."""
        if status is None:
            return self.notify("READY=1")
        return self.notify("READY=1", _status_assignment(status))

    def reloading(self) -> bool:
        """Tell systemd that the service is reloading its config; send `ready()` when done."""
        monotonic_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1_000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec}")

    def stopping(self, status: str | None = None) -> bool:
        """Tell systemd that shutdown has begun (`STOPPING=1`)."""
        if status is None:
            return self.notify("STOPPING=1")
        return self.notify("STOPPING=1", _status_assignment(status))

    def status(self, text: str) -> bool:
        """Set the one-line status that `systemctl status` shows (`STATUS=...`)."""
        return self.notify(_status_assignment(text))

    def watchdog(self) -> bool:
        """Ping the watchdog (`WATCHDOG=1`); call every `watchdog_interval_s()` while healthy."""
        return self.notify("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for `seconds` more before the start or stop timeout (`EXTEND_TIMEOUT_USEC=`).

        For a slow start (model loading) or a long drain of the alert outbox at shutdown.
        """
        if seconds <= 0:
            raise ValueError(f"seconds must be positive, got {seconds}")
        return self.notify(f"EXTEND_TIMEOUT_USEC={round(seconds * _USEC_PER_S)}")


def _status_assignment(text: str) -> str:
    # A newline would end the assignment and start a bogus one: keep the status on one line.
    return "STATUS=" + " ".join(text.splitlines())
