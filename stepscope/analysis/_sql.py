"""SQL building blocks shared by the analyses: rank filters and the interval sweep.

The sweep is the one piece of interval arithmetic every breakdown needs: given intervals tagged
with a class (``iv(rank, t0, t1, cls)``) and windows (``win(rank, step, w0, w1)``), it cuts each
rank's time line at every interval start/end and every window edge, and for each elementary
segment counts how many intervals of each class are active. Exclusive, overlapped and idle
times are then plain ``sum(len) FILTER (...)`` over segments, so every figure is an exact
integer and the parts of a window tile it by construction (no segment straddles a window edge).
Everything runs inside DuckDB as one sort plus window functions, with no per-event Python.
"""

from __future__ import annotations

from collections.abc import Sequence


def rank_filter(ranks: Sequence[int] | None, column: str = "rank") -> tuple[str, dict[str, object]]:
    """A SQL predicate restricting ``column`` to ``ranks`` (``TRUE`` when None), and its params."""
    if ranks is None:
        return "TRUE", {}
    return f"list_contains($ranks::INTEGER[], {column})", {"ranks": [int(r) for r in ranks]}


def sql_list(values: Sequence[str]) -> str:
    """``('a', 'b')``: a SQL list literal of names the code itself defines (never user input)."""
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


CLASS_BITS = 15
"""Bits per class in the packed running count: up to 32,767 intervals of one class active at
once on one rank (a GPU runs at most a few hundred kernels concurrently). Eight classes fit the
120 bits: the GPU's seven and the waits the step timeline (:mod:`stepscope.analysis.timeline`)
adds."""


def sweep_ctes(n_classes: int, *, iv: str = "iv", win: str = "win") -> str:
    """CTEs ``_pts, _deltas, _seg, _segflag, seg`` over relations ``iv`` and ``win`` (module docs).

    ``iv(rank, t0, t1, cls)``: half-open intervals ``[t0, t1)``, ``cls`` in ``0..n_classes-1``.
    ``win(rank, step, w0, w1)``: disjoint windows per rank.
    Result ``seg(rank, step, s0, s1, len, n0..n{k-1}, busy)``: the elementary segments that lie
    inside a window, with the number of active intervals of each class. ``busy`` is true when
    any class is active.

    Speed: the per-class counts travel packed in one HUGEINT (``CLASS_BITS`` bits per class),
    and the window edges are points on the same time line carrying +1/-1 (inside a window) and
    +step/-step (which window: windows are disjoint, so the running sum is the current step).
    All ranks go through one sorted pass of running sums (DuckDB's streaming window, no
    partitioning): every interval and window that opens on a rank closes on it, so the sums are
    back to zero when the next rank starts, and ``s1`` is cut at rank changes.
    """
    if n_classes * CLASS_BITS > 120:
        raise ValueError(f"{n_classes} classes do not fit the packed counter")
    mask = (1 << CLASS_BITS) - 1
    counts = ",\n    ".join(
        f"((packed >> {c * CLASS_BITS}) & {mask})::BIGINT AS n{c}" for c in range(n_classes)
    )
    return f"""
_pts AS (
    SELECT rank, t0 AS t, (1::HUGEINT << ({CLASS_BITS} * cls)) AS d, 0 AS wd, 0::BIGINT AS sd FROM {iv}
    UNION ALL SELECT rank, t1, -(1::HUGEINT << ({CLASS_BITS} * cls)), 0, 0 FROM {iv}
    UNION ALL SELECT rank, w0, 0::HUGEINT, 1, step FROM {win}
    UNION ALL SELECT rank, w1, 0::HUGEINT, -1, -step FROM {win}
),
_deltas AS (
    SELECT rank, t, sum(d) AS d, sum(wd) AS wd, sum(sd) AS sd
    FROM _pts GROUP BY rank, t ORDER BY rank, t
),
_seg AS (
    SELECT rank, t AS s0,
        CASE WHEN lead(rank) OVER () = rank THEN lead(t) OVER () END AS s1,
        sum(d) OVER (ROWS UNBOUNDED PRECEDING) AS packed,
        sum(wd) OVER (ROWS UNBOUNDED PRECEDING) AS inwin,
        sum(sd) OVER (ROWS UNBOUNDED PRECEDING) AS step
    FROM _deltas
),
_segflag AS (
    SELECT rank, step::BIGINT AS step, inwin, s0, s1,
    -- A running sum that goes negative means the pass did not see the points in order (or an
    -- interval ends before it starts): fail loudly rather than report wrong times.
    CASE WHEN packed < 0 OR inwin < 0 OR inwin > 1 THEN error('interval sweep out of order')
         ELSE s1 - s0 END AS len,
    {counts},
    packed <> 0 AS busy
    FROM _seg WHERE s1 IS NOT NULL
),
seg AS MATERIALIZED (
    SELECT * EXCLUDE (inwin) FROM _segflag WHERE inwin > 0
)"""
