"""Escalation budget: token buckets per camera and agent, all-or-nothing grants, AIMD back-off."""

from __future__ import annotations

import pytest

from edge_agent.config.escalation import EscalationBackoffConfig, EscalationConfig
from edge_agent.escalation.budget import AimdBackoff, EscalationBudget, SendWindow, TokenBucket


def _config(**fields: object) -> EscalationConfig:
    base: dict[str, object] = {
        "per_camera_frames_per_s": 2.0,
        "per_camera_bytes_per_s": 100_000,
        "per_agent_frames_per_s": 3.0,
        "per_agent_bytes_per_s": 1_000_000,
        "burst_s": 1.0,
    }
    return EscalationConfig.model_validate({**base, **fields})


@pytest.mark.parametrize(
    ("rate", "capacity", "spend", "wait_s", "cost", "allowed"),
    [
        pytest.param(2.0, 2.0, 0.0, 0.0, 1.0, True, id="starts-full"),
        pytest.param(2.0, 2.0, 2.0, 0.0, 1.0, False, id="empty"),
        pytest.param(2.0, 2.0, 2.0, 0.49, 1.0, False, id="not-yet-refilled"),
        pytest.param(2.0, 2.0, 2.0, 0.5, 1.0, True, id="refilled"),
        pytest.param(2.0, 2.0, 0.0, 100.0, 3.0, True, id="over-capacity-passes-when-full"),
        pytest.param(2.0, 2.0, 0.5, 100.0, 3.0, True, id="refill-capped-then-full"),
        pytest.param(2.0, 2.0, 0.5, 0.0, 3.0, False, id="over-capacity-needs-full-bucket"),
    ],
)
def test_token_bucket(
    rate: float, capacity: float, spend: float, wait_s: float, cost: float, allowed: bool
) -> None:
    bucket = TokenBucket(rate, capacity, now=10.0)
    bucket.take(spend)
    bucket.refill(10.0 + wait_s)
    assert bucket.allows(cost) is allowed
    assert bucket.tokens() <= capacity


def test_token_bucket_debt_keeps_the_long_run_rate() -> None:
    bucket = TokenBucket(rate_per_s=1.0, capacity=1.0, now=0.0)
    bucket.take(3.0)  # a cost three times the capacity: 2 tokens of debt
    bucket.refill(2.9)
    assert not bucket.allows(1.0)
    bucket.refill(3.0)
    assert bucket.allows(1.0)


@pytest.mark.parametrize(
    ("rate", "capacity"), [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0)], ids=["zero", "neg", "cap"]
)
def test_token_bucket_rejects_bad_arguments(rate: float, capacity: float) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        TokenBucket(rate, capacity, now=0.0)


def test_camera_budget_limits_frames_per_camera() -> None:
    budget = EscalationBudget.from_config(_config(), now=0.0)
    # burst 1 s at 2 frames/s: two frames at once, then one every 0.5 s.
    assert [budget.try_acquire("a", 1_000, 0.0) for _ in range(3)] == [True, True, False]
    assert budget.try_acquire("a", 1_000, 0.25) is False
    assert budget.try_acquire("a", 1_000, 0.5) is True
    assert budget.stats(0.5).refused_camera == 2


def test_agent_budget_is_shared_by_cameras() -> None:
    budget = EscalationBudget.from_config(_config(), now=0.0)
    grants = [budget.try_acquire(camera, 1_000, 0.0) for camera in ("a", "a", "b", "b", "c")]
    # 3 frames/s agent-wide with a 1 s burst: the fourth and fifth frames are refused.
    assert grants == [True, True, True, False, False]
    assert budget.stats(0.0).refused_agent == 2


def test_refusal_consumes_nothing() -> None:
    budget = EscalationBudget.from_config(_config(per_agent_frames_per_s=2.0), now=0.0)
    assert budget.try_acquire("a", 1_000, 0.0)
    assert budget.try_acquire("a", 1_000, 0.0)
    # Camera "b" is allowed by its own bucket but not by the agent's: its bucket stays full.
    assert not budget.try_acquire("b", 1_000, 0.0)
    assert budget.try_acquire("b", 1_000, 0.5)
    assert budget.try_acquire("b", 1_000, 1.0)


def test_bytes_budget() -> None:
    budget = EscalationBudget.from_config(_config(), now=0.0)
    assert budget.try_acquire("a", 60_000, 0.0)
    assert not budget.try_acquire("a", 60_000, 0.0)  # 100 kB/s, 1 s burst
    assert budget.try_acquire("a", 60_000, 0.2)  # 40 kB left + 20 kB earned


def test_adjust_bytes_corrects_an_estimate() -> None:
    budget = EscalationBudget.from_config(_config(), now=0.0)
    assert budget.try_acquire("a", 10_000, 0.0)
    budget.adjust_bytes("a", 80_000)  # the real JPEG was 90 kB
    assert not budget.try_acquire("a", 20_000, 0.0)
    assert budget.try_acquire("a", 10_000, 0.0)


def _backoff_config(**fields: object) -> EscalationBackoffConfig:
    base: dict[str, object] = {
        "max_rtt_ms": 500.0,
        "max_queue_time_ms": 100.0,
        "decrease_factor": 0.5,
        "min_rate_fraction": 0.1,
        "recover_per_s": 0.1,
        "hold_ms": 1_000,
    }
    return EscalationBackoffConfig.model_validate({**base, **fields})


@pytest.mark.parametrize(
    ("rtt_s", "queue_time_ms", "overloaded", "congested"),
    [
        pytest.param(0.1, 10.0, False, False, id="fast"),
        pytest.param(None, None, False, False, id="no-data"),
        pytest.param(0.6, 10.0, False, True, id="slow-rtt"),
        pytest.param(0.1, 150.0, False, True, id="long-queue"),
        pytest.param(None, None, True, True, id="overloaded"),
        pytest.param(0.5, 100.0, False, False, id="at-thresholds"),
    ],
)
def test_congestion_signals(
    rtt_s: float | None, queue_time_ms: float | None, overloaded: bool, congested: bool
) -> None:
    backoff = AimdBackoff(_backoff_config(), now=0.0)
    assert backoff.is_congestion(rtt_s, queue_time_ms, overloaded) is congested


def test_aimd_halves_holds_floors_and_recovers() -> None:
    backoff = AimdBackoff(_backoff_config(), now=0.0)
    assert backoff.congested(0.0)
    assert backoff.multiplier(0.0) == pytest.approx(0.5)
    assert not backoff.congested(0.5)  # held: the same slow spell
    assert backoff.multiplier(0.5) == pytest.approx(0.55)
    assert backoff.congested(1.0)  # hold over: (0.5 + 0.1) / 2
    assert backoff.multiplier(1.0) == pytest.approx(0.3)
    assert backoff.multiplier(5.0) == pytest.approx(0.7)  # +0.1 per second
    assert backoff.multiplier(100.0) == 1.0
    assert backoff.decreases == 2


def test_aimd_never_falls_below_the_floor() -> None:
    backoff = AimdBackoff(_backoff_config(hold_ms=0), now=0.0)
    for _ in range(20):
        backoff.congested(0.0)
    assert backoff.multiplier(0.0) == pytest.approx(0.1)


def test_budget_backs_off_on_slow_answers_and_recovers() -> None:
    config = _config(
        per_camera_frames_per_s=10.0,
        per_agent_frames_per_s=10.0,
        backoff=_backoff_config(min_rate_fraction=0.1, recover_per_s=0.09, hold_ms=0).model_dump(),
    )
    budget = EscalationBudget.from_config(config, now=0.0)
    budget.observe(0.0, rtt_s=0.05, queue_time_ms=5.0)
    assert budget.rate_multiplier(0.0) == 1.0
    for _ in range(4):
        budget.observe(0.0, rtt_s=2.0)
    assert budget.rate_multiplier(0.0) == pytest.approx(0.1)
    # The burst is cut too: at 0.1 x 10 frames/s with tokens capped at 1 frame.
    grants = sum(budget.try_acquire("a", 100, 0.0) for _ in range(10))
    assert grants == 1
    assert not budget.try_acquire("a", 100, 0.5)
    assert budget.stats(10.0).rate_multiplier == pytest.approx(1.0)
    assert budget.stats(10.0).backoffs == 4


def test_overloaded_answer_backs_off() -> None:
    budget = EscalationBudget.from_config(_config(), now=0.0)
    budget.observe(1.0, overloaded=True)
    assert budget.rate_multiplier(1.0) == pytest.approx(0.5)


def test_a_frame_is_refused_early_only_for_want_of_frame_tokens() -> None:
    budget = EscalationBudget.from_config(_config(), now=0.0)
    assert not budget.refuses_frame("a", 0.0)  # a check, not a grant: nothing taken
    assert [budget.try_acquire("a", 1_000, 0.0) for _ in range(2)] == [True, True]
    assert budget.refuses_frame("a", 0.0)
    assert not budget.refuses_frame("b", 0.0)  # agent: 3 frames/s, one left
    budget.try_acquire("b", 1_000, 0.0)
    assert budget.refuses_frame("c", 0.0)
    stats = budget.stats(0.0)
    assert (stats.granted, stats.refused_camera, stats.refused_agent) == (3, 1, 1)
    assert not budget.refuses_frame("a", 0.5)  # refilled


def test_the_window_starts_small_grows_per_answer_and_halves_on_congestion() -> None:
    window = SendWindow(initial=2, maximum=5)
    assert window.allows(1) and not window.allows(2)
    for size in (3, 4, 5, 5):
        window.grow()
        assert window.size == size
    window.cut()
    assert window.size == 2
    window.cut()
    window.cut()
    assert window.size == 1  # never shut
    window.restart()
    assert window.size == 2
    with pytest.raises(ValueError, match="initial"):
        SendWindow(initial=3, maximum=2)


def test_the_budget_refuses_while_the_window_is_full_and_slow_starts() -> None:
    """Slow start: a new stream takes `initial_in_flight` frames at once, one more per answer
    that came back uncongested; a congested answer halves it with the rate; a new stream
    starts it small again. Frame tokens are untouched by a window refusal."""
    config = _config(
        per_camera_frames_per_s=10.0,
        per_agent_frames_per_s=10.0,
        initial_in_flight=2,
        max_in_flight=4,
        backoff=_backoff_config(hold_ms=0).model_dump(),
    )
    budget = EscalationBudget.from_config(config, now=0.0)
    assert not budget.refuses_frame("a", 0.0, in_flight=1)
    assert budget.refuses_frame("a", 0.0, in_flight=2)
    for _ in range(3):
        budget.observe(0.1, rtt_s=0.05, queue_time_ms=5.0, answered=True)
    assert budget.stats(0.1).window == 4
    assert not budget.refuses_frame("a", 0.1, in_flight=3)
    budget.observe(0.2, rtt_s=0.05, queue_time_ms=5.0)  # a failure: the window stays
    budget.observe(0.2, queue_time_ms=900.0, answered=True)  # congested: rate and window cut
    assert budget.stats(0.2).window == 2
    assert budget.refuses_frame("a", 0.2, in_flight=2)
    budget.observe(0.3, rtt_s=0.05, queue_time_ms=5.0, answered=True)
    assert budget.stats(0.3).window == 3
    budget.follow_stream(1)  # a new stream
    assert budget.stats(0.3).window == 2
    budget.observe(0.4, rtt_s=0.05, queue_time_ms=5.0, answered=True)
    budget.follow_stream(1)  # the same stream: the window stays
    assert budget.stats(0.4).window == 3
    stats = budget.stats(0.2)
    assert stats.refused_window == 2 and stats.refused_camera == 0


def test_initial_in_flight_above_max_in_flight_is_a_config_error() -> None:
    with pytest.raises(ValueError, match=r"initial_in_flight \(9\) exceeds max_in_flight \(8\)"):
        _config(initial_in_flight=9)
