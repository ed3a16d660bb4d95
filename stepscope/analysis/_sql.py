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


def sweep_ctes(n_classes: int, *, iv: str = "iv", win: str = "win", gaps: bool = False) -> str:
    """CTEs ``_pts, _deltas, _seg, seg`` over relations ``iv`` and ``win`` (see module docs).

    ``iv(rank, t0, t1, cls)``: half-open intervals ``[t0, t1)``, ``cls`` in ``0..n_classes-1``.
    ``win(rank, step, w0, w1)``: disjoint windows per rank.
    Result ``seg(rank, step, s0, s1, len, n0..n{k-1}, busy)``: the elementary segments that lie
    inside a window, with the number of active intervals of each class. ``busy`` is true when
    any class is active. With ``gaps``, each segment also carries ``gap_start`` (end of the
    last busy segment before it, null if none) and ``gap_end`` (start of the next busy segment
    at or after it, null if none): for an idle segment, the idle gap of the whole time line it
    belongs to, unclipped by windows.
    """
    deltas = ",\n    ".join(f"coalesce(sum(d) FILTER (WHERE cls = {c}), 0) AS d{c}" for c in range(n_classes))
    running = ",\n    ".join(f"sum(d{c}) OVER w AS n{c}" for c in range(n_classes))
    counts = ", ".join(f"n{c}" for c in range(n_classes))
    busy = " OR ".join(f"n{c} > 0" for c in range(n_classes))
    gap_cte = (
        """
_seggap AS (
    SELECT *,
        max(CASE WHEN busy THEN s1 END) OVER (PARTITION BY rank ORDER BY s0 ROWS UNBOUNDED PRECEDING) AS gap_start,
        min(CASE WHEN busy THEN s0 END) OVER (PARTITION BY rank ORDER BY s0
            ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS gap_end
    FROM _segflag
),"""
        if gaps
        else ""
    )
    return f"""
_pts AS (
    SELECT rank, t0 AS t, cls, 1 AS d FROM {iv}
    UNION ALL SELECT rank, t1, cls, -1 FROM {iv}
    UNION ALL SELECT rank, w0, NULL, 0 FROM {win}
    UNION ALL SELECT rank, w1, NULL, 0 FROM {win}
),
_deltas AS (
    SELECT rank, t,
    {deltas}
    FROM _pts GROUP BY rank, t
),
_seg AS MATERIALIZED (
    SELECT rank, t AS s0, lead(t) OVER (PARTITION BY rank ORDER BY t) AS s1,
    {running}
    FROM _deltas
    WINDOW w AS (PARTITION BY rank ORDER BY t ROWS UNBOUNDED PRECEDING)
),
_segflag AS (
    SELECT rank, s0, s1, s1 - s0 AS len, {counts}, ({busy}) AS busy
    FROM _seg WHERE s1 IS NOT NULL
),{gap_cte}
seg AS (
    SELECT f.*, w.step
    FROM {"_seggap" if gaps else "_segflag"} f
    ASOF JOIN (SELECT rank, step, w0, w1 FROM {win} WHERE w1 > w0) w
      ON f.rank = w.rank AND f.s0 >= w.w0
    WHERE f.s0 < w.w1
)"""
