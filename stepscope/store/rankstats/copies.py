"""Every copy of a rank, with its direction, host memory and the time compute hides of it.

Definitions (docs/ANALYSIS.md, "Copies"): a copy is a ``memcpy`` GPU event; its direction is the
store's category (``memcpy_h2d``, ``memcpy_d2h``, ``memcpy_d2d``, ``memcpy_other``) and its host
memory comes from the name Kineto gives it: ``Memcpy HtoD (Pageable -> Device)`` is pageable,
``(Pinned -> Device)`` pinned; device-to-device copies have no host memory (null).
``hidden_ns`` is the part of a copy under the rank's compute-kernel union (``sweep.hidden_ctes``),
``exposed_ns = dur_ns - hidden_ns``. The hidden time is the expensive part (a sweep over the
rank's kernels): it is what the ``rank_copies`` table stores, per rank, at ingest.
"""

from __future__ import annotations

from stepscope.store.rankstats.sweep import hidden_ctes


def copies_ctes(ranks_sql: str = "TRUE") -> str:
    """CTEs ending in ``copies``: one row per copy of run ``$run`` (ranks where ``ranks_sql``)
    with ``direction``, ``host_memory``, ``hidden_ns`` and ``exposed_ns``; read from ``events``."""
    return f"""
cp AS MATERIALIZED (
  SELECT row_number() OVER (ORDER BY e.rank, e.source, e.ts_ns, e.stream, e.correlation) AS point_id,
         e.run, e.rank, e.source, e.step, e.ts_ns, e.dur_ns, e.stream, e.name, e.bytes,
         CASE e.category WHEN 'memcpy_h2d' THEN 'h2d' WHEN 'memcpy_d2h' THEN 'd2h'
                         WHEN 'memcpy_d2d' THEN 'd2d' ELSE 'other' END AS direction,
         CASE WHEN e.name ILIKE '%pageable%' THEN 'pageable'
              WHEN e.name ILIKE '%pinned%' THEN 'pinned' END AS host_memory
  FROM events e
  WHERE e.run = $run AND e.kind = 'memcpy' AND e.dur_ns IS NOT NULL AND {ranks_sql}
),
cp_iv AS (SELECT point_id, run, rank, ts_ns AS t0, ts_ns + dur_ns AS t1 FROM cp),
{hidden_ctes('cp_iv', 'hidden')},
copies AS (
  SELECT c.*, coalesce(h.hidden_ns, 0) AS hidden_ns, c.dur_ns - coalesce(h.hidden_ns, 0) AS exposed_ns
  FROM cp c LEFT JOIN hidden h USING (point_id)
)"""


RANK_COPIES = f"""
WITH {copies_ctes()}
SELECT source, step, ts_ns, dur_ns, stream, name, bytes, direction, host_memory, hidden_ns, exposed_ns
FROM copies ORDER BY ts_ns, point_id
"""
"""The ``rank_copies`` rows of one rank (``$run``; the ``events`` it reads hold that rank only)."""
