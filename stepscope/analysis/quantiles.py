"""One median and one quantile rule for every figure stepscope reports.

**The median** of n values is the middle value when n is odd and **the mean of the two middle
values when n is even** (median of 10, 20, 30, 40 is 25). **A quantile** q interpolates linearly
between the two closest ranks: with the values sorted, position ``(n - 1) * q`` (0-based), so the
median is the 0.5 quantile. It is numpy's default (``np.percentile``), DuckDB's
``quantile_cont``/``median`` and ``pyarrow.compute.quantile``'s default, so Python code and SQL
agree to the last bit on the same values.

The summary (step-time statistics, finding evidence), the gate (every metric's median and
quartiles), the communication and copy analyses and the dashboard (which shows these frames)
all use it: the same run reports the same median everywhere, whatever the number of steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0 <= q <= 1) of ``values`` (at least one), linearly interpolated."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of no values")
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q}: must be between 0 and 1")
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: Iterable[float]) -> float:
    """The median: the middle value, or the mean of the two middle values for an even count."""
    return quantile(values, 0.5)


def quantile_sql(expression: str, q: float) -> str:
    """The same rule as a DuckDB aggregate over ``expression`` (``quantile_cont``)."""
    return f"quantile_cont({expression}, {q!r})"


def median_sql(expression: str) -> str:
    """:func:`median` as a DuckDB aggregate over ``expression``."""
    return quantile_sql(expression, 0.5)
