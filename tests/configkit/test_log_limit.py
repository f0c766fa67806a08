"""`RateLimitedLog`: one line per interval, the next line says how many were left out."""

from __future__ import annotations

import logging

import pytest

from configkit.log_limit import RateLimitedLog


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_repeats_within_the_interval_are_counted_not_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, left_out = _Clock(), []
    log = RateLimitedLog(
        logging.getLogger("test.limit"),
        interval_s=10.0,
        clock=clock,
        on_suppressed=lambda: left_out.append(1),
    )
    caplog.set_level(logging.WARNING, logger="test.limit")

    peers = [f"peer-{i}" for i in range(200)]
    logged = [log.log("stream from %s refused", peer) for peer in peers]
    clock.now += 10.0
    logged.append(log.log("stream from %s refused", "peer-late"))
    clock.now += 10.0
    logged.append(log.log("stream from %s refused", "peer-quiet"))

    assert logged == [True] + [False] * 199 + [True, True]
    assert [r.getMessage() for r in caplog.records] == [
        "stream from peer-0 refused",
        "stream from peer-late refused (199 more like this since the previous line were not "
        "logged)",
        "stream from peer-quiet refused",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert len(left_out) == 199 and log.suppressed_total == 199


def test_a_zero_interval_logs_everything_and_a_negative_one_is_refused() -> None:
    log = RateLimitedLog(logging.getLogger("test.limit"), interval_s=0.0, clock=_Clock())
    assert all(log.log("x") for _ in range(5))
    with pytest.raises(ValueError, match="interval_s must be >= 0, got -1"):
        RateLimitedLog(logging.getLogger("test.limit"), interval_s=-1)
