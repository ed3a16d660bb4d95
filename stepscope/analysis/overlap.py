"""How much of each interval (a collective, a copy) runs under compute, in SQL.

``hidden_ns`` of an interval ``[t0, t1)`` on a rank is ``|[t0, t1) ∩ U(compute kernels)|``: the
part of it that the rank's compute kernels hide (HTA's and TraceLens' notion of overlapped
communication and memcpy). The union comes from the shared interval sweep
(:func:`stepscope.analysis._sql.sweep_ctes`) run over the compute kernels inside one window per
rank spanning all of them and all targets. A running sum of covered time over the sweep's
segments gives ``C(t)``, the compute-covered time up to ``t``; then ``hidden = C(t1) - C(t0)``,
found with two ASOF joins. That is exact, costs one sort, and needs no join of every target
with every compute kernel.
"""

from __future__ import annotations

from stepscope.analysis._sql import sweep_ctes


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
