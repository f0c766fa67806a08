"""`FocusBudget`: focus crops only in the time the camera's frame period leaves."""

from __future__ import annotations

import pytest

from edge_agent.pipeline.pace import FocusBudget


def test_every_planned_crop_runs_until_the_costs_are_known() -> None:
    budget = FocusBudget()
    assert budget.allowed(0.1, 6) == (1, 6)
    budget.observe(step_s=0.05, focus_s=0.0, runs=0)  # no crop cost measured yet
    assert budget.allowed(0.1, 6) == (1, 6)
    assert budget.skipped == 0


@pytest.mark.parametrize(
    ("step_s", "focus_s", "crops", "period_s", "allowed"),
    [
        (0.07, 0.03, 3, 0.1, 6),  # 40 ms without crops, 10 ms a crop: six fit in 100 ms
        (0.10, 0.06, 3, 0.1, 3),  # 20 ms a crop: three fit in the 60 ms left
        (0.30, 0.24, 6, 0.1, 1),  # 40 ms a crop, 40 ms left: one fits
        (0.40, 0.24, 6, 0.1, 0),  # a step alone is past the period: the box is behind
        (0.20, 0.12, 6, 0.04, 0),  # a 25 fps camera: nothing left
    ],
)
def test_crops_fill_the_spare_time_of_the_period(
    step_s: float, focus_s: float, crops: int, period_s: float, allowed: int
) -> None:
    budget = FocusBudget(smoothing=1.0)  # the last measurement only
    budget.observe(step_s, focus_s, crops)
    assert budget.allowed(period_s, 6) == (1, allowed)
    assert budget.skipped == 6 - allowed


def test_costs_are_smoothed_and_bad_timings_ignored() -> None:
    budget = FocusBudget(smoothing=0.5)
    budget.observe(0.1, 0.05, 5)
    budget.observe(0.3, 0.05, 5)
    assert budget.step_s == pytest.approx(0.15) and budget.run_s == pytest.approx(0.01)
    budget.observe(float("nan"), 0.0, 0)
    budget.observe(-1.0, 0.0, 0)
    assert budget.step_s == pytest.approx(0.15)


def test_a_bad_smoothing_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"smoothing must be in \(0, 1\], got 0"):
        FocusBudget(smoothing=0)


def test_crops_run_alone_while_the_runs_suffice_and_are_packed_when_they_do_not() -> None:
    budget = FocusBudget(smoothing=1.0)
    assert budget.allowed(0.1, 6, max_side=2) == (1, 6)  # nothing measured: all, alone
    budget.observe(step_s=0.06, focus_s=0.02, runs=1)  # the rest 40 ms, a run 20 ms
    assert budget.runs(0.1) == 3 and budget.runs(0.03) == 0
    assert budget.allowed(0.1, 3, max_side=2) == (1, 3)  # three runs: each crop alone
    assert budget.allowed(0.1, 6, max_side=2) == (2, 6)  # three runs of up to four
    assert budget.allowed(0.065, 6, max_side=2) == (2, 4)  # one run: four of the six
    assert budget.allowed(0.065, 6, max_side=1) == (1, 1)  # never packed: one
    assert budget.skipped == 2 + 5
