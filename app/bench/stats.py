"""Statistics of repeated benchmark rounds: medians, their intervals, ratios and warnings.

Pure (numpy only). A cell runs its workload several times after a warm-up; its
figure is the median of the rounds, with a distribution-free interval from the
order statistics (the ranks ``k`` and ``n - k + 1`` whose binomial coverage is at
least ``CONFIDENCE``; six rounds give min..max at 96.9 %, five can reach only
93.8 % and say so). A comparison is the ratio of two medians with a bootstrap
percentile interval (both sides resampled, a fixed seed so a report re-renders
the same); it is "not significant" when that interval contains 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CONFIDENCE",
    "MIN_ROUND_SECONDS",
    "NOISY_SPREAD",
    "Estimate",
    "Ratio",
    "cell_warnings",
    "median_interval",
    "ratio_interval",
]

CONFIDENCE = 0.95
#: A round shorter than this is mostly timer, scheduling and start-up noise.
MIN_ROUND_SECONDS = 0.2
#: An interval wider than this fraction of its median, either side, cannot carry a claim of that size.
NOISY_SPREAD = 0.10
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True, slots=True)
class Estimate:
    """A median and its interval; ``coverage`` is the interval's exact confidence."""

    median: float
    low: float
    high: float
    coverage: float
    rounds: int

    @property
    def spread(self) -> float:
        """Largest distance from the median to an end, as a fraction of the median."""
        if self.median == 0:
            return 0.0
        return max(self.median - self.low, self.high - self.median) / abs(self.median)


@dataclass(frozen=True, slots=True)
class Ratio:
    """``other / base`` of two medians with a bootstrap interval."""

    value: float
    low: float
    high: float

    @property
    def significant(self) -> bool:
        return not self.low <= 1.0 <= self.high

    def describe(self) -> str:
        verdict = "" if self.significant else " not significant"
        return f"{self.value:.2f}x [{self.low:.2f}, {self.high:.2f}]{verdict}"


def _binomial_tail(n: int, k: int) -> float:
    """P(X < k) for X ~ Binomial(n, 1/2): the chance the median lies below order statistic k."""
    return sum(math.comb(n, i) for i in range(k)) / (1 << n)


def median_interval(samples: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """The median with the order-statistic interval of the highest rank reaching ``confidence``.

    With too few samples to reach it the widest interval (min..max) is returned
    with its lower, exact coverage.
    """
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    n = len(ordered)
    median = float(np.median(ordered))
    k = 1
    while k + 1 <= n // 2 and 1 - 2 * _binomial_tail(n, k + 1) >= confidence:
        k += 1
    coverage = 1 - 2 * _binomial_tail(n, k) if n > 1 else 0.0
    return Estimate(median, ordered[k - 1], ordered[n - k], round(coverage, 4), n)


def ratio_interval(
    base: Sequence[float], other: Sequence[float], confidence: float = CONFIDENCE
) -> Ratio | None:
    """``median(other) / median(base)`` with a bootstrap percentile interval; None without a base."""
    if not base or not other:
        return None
    base_array = np.asarray(base, dtype=float)
    other_array = np.asarray(other, dtype=float)
    base_median = float(np.median(base_array))
    if base_median == 0:
        return None
    rng = np.random.default_rng(0)
    base_draws = rng.choice(base_array, size=(BOOTSTRAP_RESAMPLES, base_array.size))
    other_draws = rng.choice(other_array, size=(BOOTSTRAP_RESAMPLES, other_array.size))
    base_medians = np.median(base_draws, axis=1)
    ratios = np.median(other_draws, axis=1) / np.where(base_medians == 0, np.nan, base_medians)
    tail = (1 - confidence) / 2 * 100
    low, high = np.nanpercentile(ratios, [tail, 100 - tail])
    value = float(np.median(other_array)) / base_median
    return Ratio(value, min(float(low), value), max(float(high), value))


def cell_warnings(estimate: Estimate, round_seconds: float, measured: bool) -> list[str]:
    """What keeps a cell from carrying its claim: too few rounds, too short, too noisy."""
    warnings = []
    if estimate.coverage < CONFIDENCE:
        warnings.append(
            f"{estimate.rounds} rounds: the interval covers only "
            f"{estimate.coverage * 100:.0f} % (6 or more reach 95 %)"
        )
    if measured and round_seconds < MIN_ROUND_SECONDS:
        warnings.append(
            f"too short: a round took {round_seconds * 1e3:.0f} ms (under "
            f"{MIN_ROUND_SECONDS * 1e3:.0f} ms timer and scheduling noise dominates); "
            "raise size or runtime"
        )
    if estimate.spread > NOISY_SPREAD:
        warnings.append(
            f"noisy: the interval reaches {estimate.spread * 100:.0f} % from the median; "
            "a difference smaller than that is not established"
        )
    return warnings
