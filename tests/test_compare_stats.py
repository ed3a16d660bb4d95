"""Mann-Whitney U and spread, against brute-force counts and numpy."""

from __future__ import annotations

import itertools
import random

import pytest

from stepscope.analysis.compare.stats import mann_whitney_greater, mann_whitney_less, spread


def _u(x: list[float], y: list[float]) -> float:
    """Pairs with y > x, ties one half: the definition of U, counted pair by pair."""
    return sum((b > a) + 0.5 * (b == a) for a in x for b in y)


def _exact_p(x: list[float], y: list[float]) -> float:
    """P(U >= observed) over every way to split the pooled values: the permutation definition."""
    pooled = x + y
    observed = _u(x, y)
    hits = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(y)):
        ys = [pooled[i] for i in chosen]
        xs = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        total += 1
        hits += _u(xs, ys) >= observed
    return hits / total


@pytest.mark.parametrize("seed", range(12))
def test_exact_p_matches_enumeration(seed: int) -> None:
    rng = random.Random(seed)
    x = [rng.random() for _ in range(rng.randint(1, 6))]
    y = [rng.random() + rng.choice([0, 0.3]) for _ in range(rng.randint(1, 6))]
    result = mann_whitney_greater(x, y)
    assert result.method == "exact"
    assert result.u == _u(x, y)
    assert result.p_value == pytest.approx(_exact_p(x, y), abs=1e-12)


def test_full_separation_of_five_gives_one_in_252() -> None:
    result = mann_whitney_greater([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert result.p_value == pytest.approx(1 / 252) and result.min_p == pytest.approx(1 / 252)
    assert mann_whitney_less([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]).p_value == pytest.approx(1.0)


def test_ties_use_the_normal_approximation_close_to_enumeration() -> None:
    x = [1, 2, 2, 3, 3, 3, 4, 5, 5, 6]
    y = [3, 4, 4, 5, 5, 6, 6, 7, 7, 8]
    result = mann_whitney_greater(x, y)
    assert result.method == "normal"
    assert result.u == _u(x, y)
    # Tie-corrected normal approximation with continuity correction lands near the exact value.
    assert result.p_value == pytest.approx(_exact_p(x, y), abs=0.01)


def test_identical_samples_are_not_different() -> None:
    values = [75.6, 76.8, 76.2, 76.7, 78.4, 81.1]
    assert mann_whitney_greater(values, values).p_value > 0.4
    assert mann_whitney_greater([3.0] * 4, [3.0] * 4).p_value == 1.0


def test_large_samples_stay_exact_and_fast() -> None:
    rng = random.Random(7)
    x = [rng.gauss(100, 5) for _ in range(50)]
    y = [rng.gauss(104, 5) for _ in range(50)]
    result = mann_whitney_greater(x, y)
    assert result.method == "exact" and result.p_value < 0.01


def test_spread_matches_numpy_percentiles() -> None:
    np = pytest.importorskip("numpy")
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    s = spread(values)
    assert (s.median, s.p25, s.p75) == tuple(float(v) for v in np.percentile(values, [50, 25, 75]))
    assert (s.min, s.max, s.n) == (1.0, 9.0, 6)
