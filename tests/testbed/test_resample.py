"""The paired bootstrap over truth frames (`bench.models.resample`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.models.resample import (
    Summed,
    bootstrap,
    bootstrap_all,
    frame_tallies,
    scene_bootstrap,
)
from bench.models.truth import ClipTruth, TruthBox, score_frames
from detection.detections import Detections

NAMES = ["person", "bicycle", "car", "motorcycle", "bus", "truck"]


def _truth(frames: int) -> ClipTruth:
    """One person per frame at a place that moves with the frame index."""
    return ClipTruth(
        "t",
        200,
        100,
        {i: (TruthBox((10.0 + i, 10.0, 40.0 + i, 80.0), "person"),) for i in range(frames)},
    )


def _found(truth: ClipTruth, hit: set[int], score: float = 0.9) -> dict[int, Detections]:
    """A detector that finds the person on the frames in `hit` and puts a false box on the
    others."""
    out = {}
    for index, (box,) in truth.frames.items():
        xyxy = box.xyxy if index in hit else (150.0, 10.0, 180.0, 80.0)
        out[index] = Detections(
            np.asarray([xyxy], dtype=np.float32),
            np.asarray([score], dtype=np.float32),
            np.asarray([0]),
        )
    return out


def _f1(summed: Summed, variant: str) -> float:
    return summed["t"][variant]["person"].f1


def test_per_frame_tallies_add_up_to_the_whole_clips() -> None:
    truth = _truth(6)
    found = _found(truth, {0, 2, 3})
    per_frame = frame_tallies(truth, found, NAMES)
    assert len(per_frame) == 6
    whole = score_frames(truth, found, NAMES)["person"]
    summed = per_frame[0]["person"]
    for tallies in per_frame[1:]:
        summed = summed + tallies["person"]
    assert (summed.truth, summed.true_positives, summed.false_positives) == (
        whole.truth,
        whole.true_positives,
        whole.false_positives,
    )


def test_identical_variants_differ_by_nothing_in_every_draw() -> None:
    truth = _truth(10)
    tallies = frame_tallies(truth, _found(truth, {1, 4, 5, 8}), NAMES)
    interval = bootstrap(
        {"t": {"a": tallies, "b": tallies}},
        lambda s: _f1(s, "a") - _f1(s, "b"),
        resamples=200,
    )
    assert (interval.low, interval.high, interval.defined) == (0.0, 0.0, 1.0)


def test_the_draws_are_paired_a_variant_better_on_every_frame_is_surely_better() -> None:
    truth = _truth(20)
    worse = frame_tallies(truth, _found(truth, set(range(0, 20, 2))), NAMES)
    better = frame_tallies(truth, _found(truth, set(range(20))), NAMES)
    interval = bootstrap(
        {"t": {"better": better, "worse": worse}},
        lambda s: _f1(s, "better") - _f1(s, "worse"),
        resamples=300,
    )
    # unpaired draws would let "worse" land on its lucky frames while "better" did not
    assert 0.0 < interval.low <= interval.high
    assert interval.high <= 1.0


def test_the_interval_is_reproducible_and_widens_with_the_level() -> None:
    truth = _truth(15)
    tallies = {"t": {"a": frame_tallies(truth, _found(truth, set(range(0, 15, 3))), NAMES)}}

    def stat(s: Summed) -> float:
        return _f1(s, "a")

    first = bootstrap(tallies, stat, resamples=200, seed=3)
    assert bootstrap(tallies, stat, resamples=200, seed=3) == first
    wide = bootstrap(tallies, stat, resamples=200, seed=3, level=0.99)
    assert wide.low <= first.low <= first.high <= wide.high


def test_statistics_drawn_together_equal_each_drawn_alone() -> None:
    """`bootstrap_all` sums each draw once for every statistic: the same intervals as one
    `bootstrap` per statistic with the seed."""
    truth = _truth(12)
    tallies = {
        "t": {
            "a": frame_tallies(truth, _found(truth, set(range(0, 12, 2))), NAMES),
            "b": frame_tallies(truth, _found(truth, set(range(0, 12, 3))), NAMES),
        }
    }
    statistics = {"a": lambda s: _f1(s, "a"), "b - a": lambda s: _f1(s, "b") - _f1(s, "a")}
    together = bootstrap_all(tallies, statistics, resamples=200, seed=5)
    assert together == {
        name: bootstrap(tallies, statistic, resamples=200, seed=5)
        for name, statistic in statistics.items()
    }


def test_an_undefined_statistic_is_counted_not_averaged() -> None:
    truth = _truth(4)
    tallies = {"t": {"a": frame_tallies(truth, _found(truth, {0}), NAMES)}}
    nothing = bootstrap(tallies, lambda s: math.nan, resamples=50)
    assert math.isnan(nothing.low) and math.isnan(nothing.high) and nothing.defined == 0.0
    assert nothing.as_dict() == {"low": None, "high": None, "defined": 0.0}


def test_variants_scored_on_different_frames_and_bad_settings_are_refused() -> None:
    truth = _truth(4)
    tallies = frame_tallies(truth, _found(truth, {0}), NAMES)
    with pytest.raises(ValueError, match="different numbers of frames"):
        bootstrap({"t": {"a": tallies, "b": tallies[:3]}}, lambda s: 0.0)
    with pytest.raises(ValueError, match="no frames"):
        bootstrap({"t": {"a": []}}, lambda s: 0.0)
    with pytest.raises(ValueError, match="resamples"):
        bootstrap({"t": {"a": tallies}}, lambda s: 0.0, resamples=0)
    with pytest.raises(ValueError, match="level"):
        bootstrap({"t": {"a": tallies}}, lambda s: 0.0, level=1.0)


def test_scene_draws_give_an_interval_around_the_mean_and_nothing_when_constant() -> None:
    scores = np.asarray([0.2, 0.4, 0.6, 0.8])
    interval = scene_bootstrap(len(scores), lambda draw: float(scores[draw].mean()), seed=1)
    assert 0.2 <= interval.low < 0.5 < interval.high <= 0.8 and interval.defined == 1.0
    same = scene_bootstrap(3, lambda draw: 0.5, resamples=20)
    assert (same.low, same.high) == (0.5, 0.5)
    with pytest.raises(ValueError, match="units"):
        scene_bootstrap(0, lambda draw: 0.0)
