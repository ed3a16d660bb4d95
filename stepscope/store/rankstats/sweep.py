"""The interval sweep, and the time of intervals hidden under a rank's compute, in SQL.

The sweep is the one piece of interval arithmetic every breakdown needs: given intervals tagged
with a class (``iv(rank, t0, t1, cls)``) and windows (``win(rank, step, w0, w1)``), it cuts each
rank's time line at every interval start/end and every window edge, and for each elementary
segment counts how many intervals of each class are active. Exclusive, overlapped and idle
times are then plain ``sum(len) FILTER (...)`` over segments, so every figure is an exact
integer and the parts of a window tile it by construction (no segment straddles a window edge).
Everything runs inside DuckDB as one sort plus window functions, with no per-event Python.

``hidden_ns`` of an interval ``[t0, t1)`` on a rank is ``|[t0, t1) ∩ U(compute kernels)|``: the
part of it that the rank's compute kernels hide (HTA's and TraceLens' notion of overlapped
communication and memcpy). The union comes from the sweep run over the compute kernels inside one
window per rank spanning all of them and all targets. A running sum of covered time over the
sweep's segments gives ``C(t)``, the compute-covered time up to ``t``; then
``hidden = C(t1) - C(t0)``, found with two ASOF joins. That is exact, costs one sort, and needs no
join of every target with every compute kernel.
"""

from __future__ import annotations

CLASS_BITS = 15
"""Bits per class in the packed running count: up to 32,767 intervals of one class active at
once on one rank (a GPU runs at most a few hundred kernels concurrently). Eight classes fit the
120 bits: the GPU's seven and one more (the waits, in the tests' reference sweep of the step
timeline)."""


def sweep_ctes(n_classes: int, *, iv: str = "iv", win: str = "win", outside: bool = False) -> str:
    """CTEs ``_pts, _deltas, _seg, _segflag, seg`` over relations ``iv`` and ``win`` (module docs).

    ``iv(rank, t0, t1, cls)``: half-open intervals ``[t0, t1)``, ``cls`` in ``0..n_classes-1``.
    ``win(rank, step, w0, w1)``: disjoint windows per rank.
    Result ``seg(rank, step, s0, s1, len, n0..n{k-1}, busy)``: the elementary segments that lie
    inside a window, with the number of active intervals of each class. ``busy`` is true when
    any class is active. ``outside``: keep the segments outside the windows too (``step`` 0
    there), with a column ``inwin`` (1 inside a window, 0 outside): the whole time line from
    the rank's first point to its last, cut at the window edges, in one pass.

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
    {"SELECT * FROM _segflag" if outside else "SELECT * EXCLUDE (inwin) FROM _segflag WHERE inwin > 0"}
)"""


COMPUTE_KERNELS_SQL = "e.kind = 'kernel' AND e.category = 'compute'"
"""What hides GPU work: the compute kernels (HTA's and TraceLens' overlap)."""


def hidden_ctes(targets: str, out: str, under: str = COMPUTE_KERNELS_SQL) -> str:
    """CTEs ending in ``out(point_id, hidden_ns)`` for the intervals of CTE ``targets``.

    ``targets`` has columns ``point_id, run, rank, t0, t1`` and holds one run. The events that
    hide them are those of ``events`` (alias ``e``) for the same run and ranks matching the SQL
    predicate ``under`` (by default the compute kernels). The sweep's CTE names
    (``iv, win, seg, ...``) are used here, so one query can hold one ``hidden_ctes``.
    """
    return f"""
iv AS (
  SELECT e.rank, e.ts_ns AS t0, e.ts_ns + e.dur_ns AS t1, 0 AS cls
  FROM events e
  WHERE e.run = (SELECT any_value(run) FROM {targets})
    AND e.rank IN (SELECT rank FROM {targets})
    AND ({under}) AND e.dur_ns > 0
),
win AS (
  SELECT rank, 0 AS step, min(t0) AS w0, max(t1) AS w1
  FROM (SELECT rank, t0, t1 FROM iv UNION ALL SELECT rank, t0, t1 FROM {targets})
  GROUP BY rank
),
{sweep_ctes(1)},
{out}_cum AS (
  SELECT rank, s0, n0 > 0 AS covered,
         (sum(CASE WHEN n0 > 0 THEN len ELSE 0 END) OVER (PARTITION BY rank ORDER BY s0 ROWS UNBOUNDED PRECEDING)
           - CASE WHEN n0 > 0 THEN len ELSE 0 END)::BIGINT AS before_ns
  FROM seg
),
{out} AS (
  SELECT t.point_id,
         ((e.before_ns + CASE WHEN e.covered THEN t.t1 - e.s0 ELSE 0 END)
         - (b.before_ns + CASE WHEN b.covered THEN t.t0 - b.s0 ELSE 0 END))::BIGINT AS hidden_ns
  FROM {targets} t
  ASOF JOIN {out}_cum b ON b.rank = t.rank AND t.t0 >= b.s0
  ASOF JOIN {out}_cum e ON e.rank = t.rank AND t.t1 >= e.s0
)"""
