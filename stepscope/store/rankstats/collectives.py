"""Every collective event of a rank, with what it is: the per-rank half of cross-rank matching.

A collective event is a communication kernel, or a gloo transfer (a ``gloo:*`` annotation on
gloo's worker thread). What a kernel is (collective, bytes, dtype, process group, sequence
number) comes from its own args, else from the innermost communication op enclosing its launch
on the launching thread (older traces), else nothing; the ``sources`` row's process-group table
fills in a group's size and name later (the analysis, :mod:`stepscope.analysis.matching`, which
matches these rows across ranks). All of that reads one rank's events only, so it is computed
when the trace is converted: table ``rank_collectives``, one row per collective event, which
the cross-rank analyses (skew, waits, stragglers, clock offsets) read instead of the events.
"""

from __future__ import annotations

from stepscope.store.rankstats.breakdown import sql_list
from stepscope.store.rankstats.parts import COMMUNICATION_OPS, HOST
from stepscope.store.rankstats.phase import gpu_phase_ctes
from stepscope.store.rankstats.sweep import COMPUTE_KERNELS_SQL, sweep_ctes

HOST_SIDE_SQL = "e.kind = 'user_annotation' AND e.name LIKE 'gloo:%'"
"""Host-side transfers counted as collectives: gloo's worker-thread annotations (``gloo:all_reduce``),
the only record of the transfer itself in a gloo run (``c10d::allreduce_`` only enqueues it, and
``nccl:*`` annotations are the host side of a kernel that is counted already)."""

def collective_point_ctes() -> str:
    """CTEs (names starting ``_c_``) ending in ``_c_m``: every collective event of ``events`` for
    ``$run`` (any ranks), numbered ``point_id`` in (rank, source, time) order, with what it is:
    ``group_size0, pg_name0, pg_desc0, pg_ranks0`` as the event or its launching op says
    (the process-group table of ``sources`` is applied after, across ranks), and the training
    ``phase`` of its launch (:mod:`.phase`; null for gloo transfers and unlaunched kernels)."""
    return f"""
_c_ev AS MATERIALIZED (
  SELECT row_number() OVER (ORDER BY e.rank, e.source, e.ts_ns, e.stream, e.correlation, e.tid) AS point_id,
         e.run, e.rank, e.source, e.pid, e.tid, e.step, e.name, e.ts_ns, e.dur_ns, e.ts_ns + e.dur_ns AS end_ns,
         e.stream, e.correlation, e.kind <> 'kernel' AS host_side,
         e.collective::VARCHAR AS collective, e.bytes, e.dtype::VARCHAR AS dtype, e.group_size,
         e.pg_name::VARCHAR AS pg_name, e.pg_desc::VARCHAR AS pg_desc, e.pg_ranks::VARCHAR AS pg_ranks,
         e.comm_seq, coalesce(e.args LIKE '%"Collective name"%', FALSE) AS own_args
  FROM events e
  WHERE e.run = $run AND e.category = 'communication' AND e.dur_ns IS NOT NULL
    AND (e.kind = 'kernel' OR ({HOST_SIDE_SQL}))
),
_c_launch AS (
  SELECT c.point_id, c.source, arg_min(l.pid, l.ts_ns) AS pid, arg_min(l.tid, l.ts_ns) AS tid,
         min(l.ts_ns) AS ts_ns
  FROM _c_ev c JOIN events l
    ON l.run = $run AND l.rank = c.rank AND l.source = c.source AND l.correlation = c.correlation
   AND l.kind IN ('cuda_runtime', 'cuda_driver')
  WHERE NOT c.host_side
  GROUP BY c.point_id, c.source
),
_c_ops AS (
  SELECT e.source, e.pid, e.tid, e.ts_ns, e.ts_ns + e.dur_ns AS end_ns, e.collective::VARCHAR AS collective,
         e.bytes, e.dtype::VARCHAR AS dtype, e.group_size, e.pg_name::VARCHAR AS pg_name,
         e.pg_desc::VARCHAR AS pg_desc, e.pg_ranks::VARCHAR AS pg_ranks, e.comm_seq
  FROM events e
  WHERE e.run = $run AND e.kind IN ('cpu_op', 'user_annotation') AND e.category = 'communication'
    AND e.dur_ns IS NOT NULL AND NOT ({HOST_SIDE_SQL})
),
_c_link AS (
  -- the innermost (latest-starting) enclosing op that says each thing
  SELECT l.point_id,
         arg_max(o.collective, o.ts_ns) FILTER (WHERE o.collective IS NOT NULL) AS collective,
         arg_max(o.bytes, o.ts_ns) FILTER (WHERE o.bytes IS NOT NULL) AS bytes,
         arg_max(o.dtype, o.ts_ns) FILTER (WHERE o.dtype IS NOT NULL) AS dtype,
         arg_max(o.group_size, o.ts_ns) FILTER (WHERE o.group_size IS NOT NULL) AS group_size,
         arg_max(o.pg_name, o.ts_ns) FILTER (WHERE o.pg_name IS NOT NULL) AS pg_name,
         arg_max(o.pg_desc, o.ts_ns) FILTER (WHERE o.pg_desc IS NOT NULL) AS pg_desc,
         arg_max(o.pg_ranks, o.ts_ns) FILTER (WHERE o.pg_ranks IS NOT NULL) AS pg_ranks,
         arg_max(o.comm_seq, o.ts_ns) FILTER (WHERE o.comm_seq IS NOT NULL) AS comm_seq
  FROM _c_launch l JOIN _c_ops o
    ON o.source = l.source AND o.pid = l.pid AND o.tid = l.tid AND o.ts_ns <= l.ts_ns AND o.end_ns >= l.ts_ns
  GROUP BY l.point_id
),
_c_m0 AS (
  SELECT c.* EXCLUDE (collective, bytes, dtype, group_size, pg_name, pg_desc, pg_ranks, comm_seq, own_args),
         CASE WHEN c.own_args THEN c.collective ELSE coalesce(k.collective, c.collective) END AS collective,
         coalesce(c.bytes, k.bytes) AS bytes, coalesce(c.dtype, k.dtype) AS dtype,
         coalesce(c.group_size, k.group_size) AS group_size0, coalesce(c.pg_name, k.pg_name) AS pg_name0,
         coalesce(c.pg_desc, k.pg_desc) AS pg_desc0, coalesce(c.pg_ranks, k.pg_ranks) AS pg_ranks0,
         coalesce(c.comm_seq, k.comm_seq) AS comm_seq, k.point_id IS NOT NULL AS linked
  FROM _c_ev c LEFT JOIN _c_link k USING (point_id)
),
{gpu_phase_ctes('_c_m0', '_c_ph')},
_c_m AS (SELECT m.*, ph.phase FROM _c_m0 m LEFT JOIN _c_ph ph USING (point_id))"""


RANK_COLLECTIVES = f"""
WITH {collective_point_ctes()}
SELECT source, pid, tid, step, name, ts_ns, dur_ns, end_ns, stream, correlation, host_side, collective, bytes,
       dtype, group_size0 AS group_size, pg_name0 AS pg_name, pg_desc0 AS pg_desc, pg_ranks0 AS pg_ranks,
       comm_seq, linked, phase
FROM _c_m ORDER BY point_id
"""
"""The ``rank_collectives`` rows of one trace (``$run``; the views hold that trace only)."""


_HOST_HIDING = " OR ".join(f"({claim})" for p in HOST.earlier(COMMUNICATION_OPS) for claim in p.claims)
HIDING_SQL = f"""
  ({COMPUTE_KERNELS_SQL})
  OR (e.kind IN {sql_list(HOST.kinds)} AND ({_HOST_HIDING})
      AND e.rank NOT IN (SELECT rank FROM events WHERE run = e.run AND kind = 'kernel'))"""
"""What hides a collective: on a rank with GPU kernels its compute kernels; on a CPU-only rank the
host work the host breakdown puts before communication (data loading, optimizer, syncs, compute
ops: :data:`stepscope.store.rankstats.parts.HOST`), as gloo's thread transfers while the main thread
computes."""

RANK_HIDING_SPANS = f"""
WITH iv AS (
  SELECT e.rank, e.ts_ns AS t0, e.ts_ns + e.dur_ns AS t1, 0 AS cls
  FROM events e WHERE e.run = $run AND e.dur_ns > 0 AND ({HIDING_SQL})
),
win AS (SELECT rank, 0 AS step, min(t0) AS w0, max(t1) AS w1 FROM iv GROUP BY rank),
{sweep_ctes(1)},
_covered AS (
  SELECT s0, s1, sum(CASE WHEN s0 = prev_s1 THEN 0 ELSE 1 END) OVER (ORDER BY s0 ROWS UNBOUNDED PRECEDING) AS island
  FROM (SELECT s0, s1, lag(s1) OVER (ORDER BY s0) AS prev_s1 FROM seg WHERE n0 > 0)
)
SELECT (SELECT source FROM events LIMIT 1) AS source, s0, s1,
       (sum(s1 - s0) OVER (ORDER BY s0 ROWS UNBOUNDED PRECEDING) - (s1 - s0))::BIGINT AS before_ns
FROM (SELECT min(s0) AS s0, max(s1) AS s1 FROM _covered GROUP BY island)
ORDER BY s0
"""
"""The ``rank_hiding_spans`` rows of one trace: the union of what hides its collectives
(:data:`HIDING_SQL`) as disjoint stretches ``[s0, s1)``; the part of any interval they cover is
its hidden time (the analysis clips each collective and its wait, known across ranks, to them).
``before_ns``, the stretches' length before this one, makes that part two lookups: summed here,
over one rank's few thousand stretches, rather than by every read over every rank's (a window
over 1.1 M stretches took 0.3 s of a 64-rank summary)."""

