"""How sure a benchmark's score is: paired bootstraps over the truth's frames or the scenes.

The real-footage benches score a few dozen frames per clip, so a difference of a hundredth of
mAP50 between two variants can be the luck of which frames were labelled. `bootstrap` redraws
each clip's truth frames with replacement (the same draw for every variant: the comparison is
paired, as the variants ran on the same frames), sums the per-frame `Tally`s of each variant
and evaluates a statistic on them; the spread of the statistic over the draws is its interval.

`scene_bootstrap` does the same over whole units (the generated scenes of the test world, each
scored once per variant): the scenes are drawn again, and a statistic of their per-scene scores
is taken on each draw.

Pure: the caller scores the frames (`frame_tallies`) and names the statistic; the random
generator is seeded, so a table is reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from bench.models.truth import ClipTruth, Tally, restricted, score_frames
from detection.detections import Detections

FrameTallies = Mapping[str, Tally]
"""One frame's tallies by class group (`bench.models.truth.GROUPS`)."""
Summed = Mapping[str, Mapping[str, Mapping[str, Tally]]]
"""clip -> variant -> class group -> the tally over the drawn frames."""
Statistic = Callable[[Summed], float]
K = TypeVar("K")

RESAMPLES = 1000
LEVEL = 0.9


def frame_tallies(
    truth: ClipTruth, found: Mapping[int, Detections], names: Sequence[str]
) -> list[FrameTallies]:
    """Per truth frame (in the truth's order, as `score_frames` takes them), the tallies of
    `found` on it alone; `summed` adds them up to `score_frames`' tallies of the whole."""
    return [
        score_frames(restricted(truth, [index]), {index: found[index]}, names)
        for index in truth.frames
    ]


@dataclass(frozen=True)
class Interval:
    """A bootstrap percentile interval; `defined` is the share of draws where the statistic
    was a number (a gap closed is undefined in a draw where the cloud is not above the edge)."""

    low: float
    high: float
    defined: float

    def as_dict(self) -> dict[str, float | None]:
        """For the JSON beside a table (NaN as null, 4 decimals)."""
        return {
            key: None if math.isnan(value) else round(value, 4)
            for key, value in (("low", self.low), ("high", self.high), ("defined", self.defined))
        }


def bootstrap(
    frames: Mapping[str, Mapping[str, Sequence[FrameTallies]]],
    statistic: Statistic,
    *,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """The `level` percentile interval of `statistic` over `resamples` paired draws
    (`bootstrap_all` of one statistic)."""
    return bootstrap_all(frames, {0: statistic}, resamples=resamples, level=level, seed=seed)[0]


def bootstrap_all(
    frames: Mapping[str, Mapping[str, Sequence[FrameTallies]]],
    statistics: Mapping[K, Statistic],
    *,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> dict[K, Interval]:
    """Per statistic, the `level` percentile interval over `resamples` paired draws; every
    statistic is taken on the same draws, whose tallies are summed once each.

    `frames`: clip -> variant -> per-frame tallies, every variant of a clip on the same frames
    in the same order. The draws depend only on `seed` and the clips' frame counts, so calls
    with the same seed on the same clips draw the same frames.
    """
    _check(resamples, level)
    sizes = {}
    for clip, by_variant in frames.items():
        lengths = {len(tallies) for tallies in by_variant.values()}
        if len(lengths) != 1:
            raise ValueError(f"{clip}: the variants were scored on different numbers of frames")
        sizes[clip] = lengths.pop()
        if sizes[clip] == 0:
            raise ValueError(f"{clip}: no frames to draw from")
    rng = np.random.default_rng(seed)
    values: dict[K, list[float]] = {name: [] for name in statistics}
    for _ in range(resamples):
        draw = {clip: rng.integers(0, n, size=n) for clip, n in sizes.items()}
        totals = {
            clip: {
                variant: summed([tallies[i] for i in draw[clip]])
                for variant, tallies in by_variant.items()
            }
            for clip, by_variant in frames.items()
        }
        for name, statistic in statistics.items():
            values[name].append(statistic(totals))
    return {name: _interval(drawn, level) for name, drawn in values.items()}


def scene_bootstrap(
    units: int,
    statistic: Callable[[npt.NDArray[np.int64]], float],
    *,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """The `level` percentile interval of `statistic` over `resamples` draws of `units` units
    with replacement; `statistic` gets the drawn unit indices (the same for every variant it
    compares)."""
    _check(resamples, level)
    if units < 1:
        raise ValueError(f"units must be at least 1, got {units}")
    rng = np.random.default_rng(seed)
    return _interval(
        [statistic(rng.integers(0, units, size=units)) for _ in range(resamples)], level
    )


def _check(resamples: int, level: float) -> None:
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")


def _interval(values: Sequence[float], level: float) -> Interval:
    """The percentile interval of the draws' values, NaNs counted as undefined."""
    defined = [v for v in values if not math.isnan(v)]
    if not defined:
        return Interval(math.nan, math.nan, 0.0)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(defined, [tail, 1.0 - tail])
    return Interval(float(low), float(high), len(defined) / len(values))


def summed(frames: Sequence[FrameTallies]) -> dict[str, Tally]:
    """The tallies of several frames added up, by class group."""
    out: dict[str, Tally] = {}
    for tallies in frames:
        for group, tally in tallies.items():
            out[group] = out[group] + tally if group in out else tally
    return out
