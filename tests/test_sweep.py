"""The interval sweep on tiny hand-made inputs: exact parts, rank separation, loud failure."""

from __future__ import annotations

import duckdb
import pytest

from stepscope.analysis._sql import sweep_ctes


def _run(intervals: list[tuple[int, int, int, int]], windows: list[tuple[int, int, int, int]]) -> list[tuple]:
    iv = " UNION ALL ".join(f"SELECT {r} AS rank, {a}::BIGINT AS t0, {b}::BIGINT AS t1, {c} AS cls" for r, a, b, c in intervals)
    win = " UNION ALL ".join(f"SELECT {r} AS rank, {s} AS step, {a}::BIGINT AS w0, {b}::BIGINT AS w1" for r, s, a, b in windows)
    query = f"""WITH iv AS ({iv}), win AS ({win}), {sweep_ctes(2)}
    SELECT rank, step, sum(len) FILTER (n0 > 0)::BIGINT, sum(len) FILTER (n0 = 0 AND n1 > 0)::BIGINT,
           sum(len) FILTER (NOT busy)::BIGINT
    FROM seg GROUP BY rank, step ORDER BY rank, step"""
    return duckdb.connect().execute(query).fetchall()


def test_priority_windows_and_ranks() -> None:
    # rank 0: class 0 on [10, 30), class 1 on [20, 50); windows [0, 25) and [25, 60)
    # rank 1 starts before rank 0 ends on the clock: the ranks must not mix.
    rows = _run(
        [(0, 10, 30, 0), (0, 20, 50, 1), (1, 5, 15, 1)],
        [(0, 1, 0, 25), (0, 2, 25, 60), (1, 7, 0, 20)],
    )
    assert rows == [(0, 1, 15, None, 10), (0, 2, 5, 20, 10), (1, 7, None, 10, 10)]


def test_an_interval_ending_before_it_starts_fails_loudly() -> None:
    with pytest.raises(duckdb.Error, match="interval sweep out of order"):
        _run([(0, 30, 10, 0)], [(0, 1, 0, 40)])
