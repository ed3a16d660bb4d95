"""Small, dependency-free statistics for the regression gate: spread and Mann-Whitney U.

Why not scipy: it is a heavy dependency for two formulas, and the gate must give the same answer
on every machine. Everything here is exact arithmetic on Python floats, no randomness.

The Mann-Whitney U test asks whether values drawn from one run tend to be larger than values
drawn from the other, without assuming a distribution (step times are skewed and have outliers).
For small samples without ties the p-value is exact (the distribution of U is counted by dynamic
programming); otherwise the normal approximation with tie and continuity corrections is used
(the same approximation as ``scipy.stats.mannwhitneyu(method="asymptotic")``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from stepscope.analysis.quantiles import median, quantile

EXACT_MAX_N = 50
"""Below this many values per side (and without ties) the p-value is exact, not approximated."""


@dataclass(frozen=True)
class Spread:
    """Median and spread of a sample: quartiles (linear interpolation), extremes and size."""

    n: int
    median: float
    p25: float
    p75: float
    min: float
    max: float

    def to_json(self) -> dict[str, float | int]:
        return {"n": self.n, "median": self.median, "p25": self.p25, "p75": self.p75,
                "min": self.min, "max": self.max}


def spread(values: Sequence[float]) -> Spread:
    """Median, quartiles and extremes of ``values`` (at least one), by the one quantile rule of
    :mod:`stepscope.analysis.quantiles` (an even count's median is the mean of the middle two)."""
    s = sorted(values)
    return Spread(len(s), median(s), quantile(s, 0.25), quantile(s, 0.75), s[0], s[-1])


@dataclass(frozen=True)
class MannWhitney:
    """Result of a one-sided Mann-Whitney U test that ``y`` tends to exceed ``x``.

    ``u`` counts the pairs (x_i, y_j) with y_j > x_i (ties count one half); ``p_value`` is the
    one-sided p-value of that count under "same distribution"; ``method`` is ``exact`` or
    ``normal``; ``min_p`` is the smallest p-value these sample sizes can ever give (when it is
    above the significance level, the test cannot detect anything and says so).
    """

    n_x: int
    n_y: int
    u: float
    p_value: float
    method: str
    min_p: float


def _ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Mid-ranks (1-based, ties get their average rank) and the sizes of the tie groups."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    ties: list[int] = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        rank = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[order[k]] = rank
        ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


def _exact_upper_tail(n_x: int, n_y: int, u: int) -> float:
    """P(U >= u) under "same distribution", counted exactly.

    The number of arrangements of the two samples with U = k is the coefficient of q^k in the
    Gaussian binomial [n_x + n_y choose n_y]_q = prod_{i=1..n_y} (1 - q^(n_x+i)) / (1 - q^i):
    integer polynomial products and exact divisions, O(n_y * n_x * n_y) operations.
    """
    poly = [1]
    for i in range(1, n_y + 1):
        shift = n_x + i
        grown = poly + [0] * shift
        for k in range(len(grown) - 1, shift - 1, -1):
            grown[k] -= grown[k - shift]
        # Divide by (1 - q^i): r[k] = grown[k] + r[k - i]; the division is exact.
        for k in range(i, len(grown)):
            grown[k] += grown[k - i]
        poly = grown[: len(grown) - i]
    return sum(poly[u:]) / math.comb(n_x + n_y, n_x)


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> MannWhitney:
    """One-sided Mann-Whitney U test of "y tends to be larger than x" (both non-empty)."""
    n_x, n_y = len(x), len(y)
    if n_x == 0 or n_y == 0:
        raise ValueError("Mann-Whitney needs values on both sides")
    ranks, ties = _ranks([*x, *y])
    rank_sum_y = sum(ranks[n_x:])
    u = rank_sum_y - n_y * (n_y + 1) / 2
    min_p = 1 / math.comb(n_x + n_y, n_x)
    if max(n_x, n_y) <= EXACT_MAX_N and all(t == 1 for t in ties):
        return MannWhitney(n_x, n_y, u, _exact_upper_tail(n_x, n_y, int(u)), "exact", min_p)
    n = n_x + n_y
    mean = n_x * n_y / 2
    tie_term = sum(t**3 - t for t in ties) / (n * (n - 1))
    var = n_x * n_y / 12 * ((n + 1) - tie_term)
    if var <= 0:  # every value equal: nothing differs
        return MannWhitney(n_x, n_y, u, 1.0, "normal", min_p)
    z = (u - mean - 0.5) / math.sqrt(var)
    return MannWhitney(n_x, n_y, u, 0.5 * math.erfc(z / math.sqrt(2)), "normal", min_p)


def mann_whitney_less(x: Sequence[float], y: Sequence[float]) -> MannWhitney:
    """One-sided test of "y tends to be smaller than x" (the mirror of :func:`mann_whitney_greater`)."""
    return mann_whitney_greater([-v for v in x], [-v for v in y])


MIN_NOISE = 0.02
"""Smallest run-to-run noise of a timed metric, as a fraction of the baseline's value: three runs
can agree by chance more closely than runs of that code do (2 %: a quiet machine's spread)."""

UNSEEN_NOISE = 0.05
"""Run-to-run noise a timed metric is assumed to have when neither side has two runs to measure
it (5 % of the baseline's value); the gate says it assumed it."""


@dataclass(frozen=True)
class Noise:
    """How much a metric moves between runs of the same code, as far as these runs show.

    ``spread`` is the larger range (max - min) of the per-run values on either side (None when
    neither side has two runs: not measured); ``margin`` is what a change must exceed beyond its
    budget to fail, and stay below under it to pass: the spread, at least :data:`MIN_NOISE` of
    the baseline for a timed metric, or :data:`UNSEEN_NOISE` of it when not measured.
    """

    baseline_runs: int
    candidate_runs: int
    spread: float | None
    margin: float

    @property
    def measured(self) -> bool:
        return self.spread is not None

    def to_json(self) -> dict[str, float | int | bool | None]:
        return {"baseline_runs": self.baseline_runs, "candidate_runs": self.candidate_runs,
                "measured": self.measured, "spread": self.spread, "margin": self.margin}


def run_noise(base: Sequence[float], cand: Sequence[float], *, timed: bool) -> Noise:
    """The :class:`Noise` of a metric from its per-run values (each side at least one);
    ``timed``: a time or a rate measured from times, which the machine's load moves."""
    ranges = [max(side) - min(side) for side in (base, cand) if len(side) >= 2]
    spread = max(ranges) if ranges else None
    reference = abs(median(list(base)))
    if not timed:
        return Noise(len(base), len(cand), spread, spread or 0.0)
    if spread is None:
        return Noise(len(base), len(cand), None, UNSEEN_NOISE * reference)
    return Noise(len(base), len(cand), spread, max(spread, MIN_NOISE * reference))
