"""Turning SIGTERM / SIGINT into a stop event, for the services' main threads."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

logger = logging.getLogger(__name__)

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_on_signals(
    stop: threading.Event, signals: Sequence[signal.Signals] = STOP_SIGNALS, *, what: str = ""
) -> Iterator[threading.Event]:
    """Set `stop` when one of `signals` arrives, while inside the block; restores the handlers.

    Installs signal handlers, so use it from the main thread. `what` is said in the log line.
    """
    with set_on_signals(stop, signals, what=what):
        yield stop


@contextmanager
def set_on_signals(
    event: threading.Event, signals: Sequence[signal.Signals], *, what: str = ""
) -> Iterator[threading.Event]:
    """Set `event` when one of `signals` arrives (e.g. SIGHUP: reload), inside the block."""

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("received %s%s", signal.Signals(signum).name, f": {what}" if what else "")
        event.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in signals}
    try:
        yield event
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
