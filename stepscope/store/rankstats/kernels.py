"""Each rank's GPU work and CPU operators by name: what the top-kernels and top-ops tables rank.

Definitions: docs/ANALYSIS.md, "Kernels and ops". Counted: work that a profiled step launched
(GPU) or that starts inside one (CPU ops) when the trace has steps, all of it otherwise. The
aggregates per name need one rank's events only (a CPU op's self time needs its thread's
nesting, its sync time the synchronisation calls below it), so they are computed when the trace
is converted: ``rank_kernels`` and ``rank_cpu_ops``, one row per name; the analyses rank them.
"""

from __future__ import annotations

from stepscope.store.rankstats.breakdown import GPU_KINDS_SQL
from stepscope.store.rankstats.parts import SYNC_WAIT

THREAD_SQL = "coalesce(e.pid::VARCHAR, '') || '/' || coalesce(e.tid::VARCHAR, e.thread_label, '')"
"""A host event's thread: process and thread id, or the thread's label where the trace gave a
string id (older traces), so that nesting is found on every trace."""

_IN_STEPS = "(NOT (SELECT count(*) > 0 FROM steps) OR {alias}step IS NOT NULL)"
"""The counting rule: inside a profiled step when the trace has steps, everything otherwise."""

RANK_KERNELS = f"""
SELECT e.source, e.name, any_value(e.kind) AS kind, any_value(e.category) AS category, count(*) AS count,
       sum(e.dur_ns)::BIGINT AS total_ns, max(e.dur_ns) AS max_ns
FROM events e
WHERE e.run = $run AND e.kind IN {GPU_KINDS_SQL} AND e.dur_ns > 0 AND {_IN_STEPS.format(alias="e.")}
GROUP BY e.source, e.name ORDER BY total_ns DESC, e.name
"""
"""The ``rank_kernels`` rows of one trace: its GPU work (kernels, copies, memsets) by name."""

RANK_CPU_OPS = f"""
WITH
    _ops AS MATERIALIZED (
        SELECT row_number() OVER (ORDER BY e.rank, e.source, e.pid, e.tid, e.ts_ns, e.dur_ns DESC) AS op_id,
               e.rank, e.source, {THREAD_SQL} AS thread, e.name, e.category, e.ts_ns, e.dur_ns, e.step
        FROM events e
        WHERE e.run = $run AND e.kind = 'cpu_op' AND e.dur_ns IS NOT NULL
          AND e.name NOT LIKE 'ProfilerStep#%'
    ),
    _marks AS (
        SELECT op_id, rank, source, thread, ts_ns AS t, 1 AS d, 1 AS is_start FROM _ops
        UNION ALL SELECT op_id, rank, source, thread, ts_ns + dur_ns, -1, 0 FROM _ops
    ),
    _depth AS (
        -- ops open when each op starts (an end at the same instant closes first): its depth
        SELECT op_id, is_start, sum(d) OVER (PARTITION BY rank, source, thread ORDER BY t, is_start, op_id
                                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS open_before
        FROM _marks
    ),
    _nested AS (
        SELECT o.*, coalesce(dp.open_before, 0) AS depth
        FROM _ops o JOIN _depth dp ON dp.op_id = o.op_id AND dp.is_start = 1
    ),
    _parent AS (
        SELECT c.op_id, c.dur_ns, p.op_id AS parent_id
        FROM _nested c ASOF JOIN _nested p
          ON p.rank = c.rank AND p.source = c.source AND p.thread = c.thread AND p.depth = c.depth - 1
         AND p.op_id < c.op_id
    ),
    _children AS (SELECT parent_id AS op_id, sum(dur_ns) AS child_ns FROM _parent GROUP BY parent_id),
    _syncs AS (
        SELECT rank, source, {THREAD_SQL} AS thread, ts_ns, dur_ns FROM events e
        WHERE run = $run AND dur_ns > 0 AND kind IN ('cuda_runtime', 'cuda_driver') AND ({SYNC_WAIT.claims[0]})
    ),
    _sync_points AS (
        -- each sync's start (+1, +start) and end (-1, -end) on its thread's time line
        SELECT rank, source, thread, t, sum(n)::BIGINT AS n, sum(v) AS v FROM (
            SELECT rank, source, thread, ts_ns AS t, 1 AS n, ts_ns::HUGEINT AS v FROM _syncs
            UNION ALL SELECT rank, source, thread, ts_ns + dur_ns, -1, -(ts_ns + dur_ns)::HUGEINT FROM _syncs)
        GROUP BY rank, source, thread, t
    ),
    _sync_before AS (
        -- running sums up to and including t: before any x > t, sync time up to x is x * n - v
        SELECT rank, source, thread, t, sum(n) OVER w AS n, sum(v) OVER w AS v
        FROM _sync_points
        WINDOW w AS (PARTITION BY rank, source, thread ORDER BY t ROWS UNBOUNDED PRECEDING)
    ),
    _sync_in AS (
        -- sync time within [start, end) of each op: the sync time up to its end less that up to
        -- its start (each sync counted by its overlap, as a join of ops with syncs would)
        SELECT o.op_id,
               ((o.ts_ns + o.dur_ns) * coalesce(e.n, 0) - coalesce(e.v, 0))
               - (o.ts_ns * coalesce(b.n, 0) - coalesce(b.v, 0)) AS sync_ns
        FROM _ops o
        ASOF LEFT JOIN _sync_before b
          ON b.rank = o.rank AND b.source = o.source AND b.thread = o.thread AND o.ts_ns > b.t
        ASOF LEFT JOIN _sync_before e
          ON e.rank = o.rank AND e.source = o.source AND e.thread = o.thread AND o.ts_ns + o.dur_ns > e.t
    ),
    _agg AS (
        SELECT o.source, o.name, any_value(o.category) AS category, count(*) AS count,
               sum(o.dur_ns)::BIGINT AS total_ns,
               sum(greatest(o.dur_ns - coalesce(c.child_ns, 0), 0))::BIGINT AS self_ns,
               coalesce(sum(y.sync_ns), 0)::BIGINT AS sync_ns, max(o.dur_ns) AS max_ns
        FROM _ops o
        LEFT JOIN _children c ON c.op_id = o.op_id
        LEFT JOIN _sync_in y ON y.op_id = o.op_id
        WHERE {_IN_STEPS.format(alias="o.")}
        GROUP BY o.source, o.name
    )
SELECT * FROM _agg ORDER BY total_ns DESC, name
"""
"""The ``rank_cpu_ops`` rows of one trace: its ``cpu_op`` events by name (``ProfilerStep#N`` left
out) with inclusive, self and synchronisation time."""

RANK_LAUNCHES = f"""
WITH
    _gpu AS (
        SELECT source, correlation, min(ts_ns) AS gpu_start, sum(dur_ns) AS gpu_ns
        FROM events
        WHERE run = $run AND kind IN {GPU_KINDS_SQL} AND dur_ns IS NOT NULL AND correlation IS NOT NULL
        GROUP BY source, correlation
    ),
    _launch AS (
        SELECT r.source, r.ts_ns, r.dur_ns, g.gpu_start, g.gpu_ns
        FROM events r JOIN _gpu g ON r.source = g.source AND r.correlation = g.correlation
        WHERE r.run = $run AND r.kind IN ('cuda_runtime', 'cuda_driver') AND r.dur_ns IS NOT NULL
    )
SELECT source, count(*) AS launches, sum(dur_ns)::BIGINT AS launch_ns, sum(gpu_ns)::BIGINT AS launched_gpu_ns,
       count(*) FILTER (WHERE gpu_ns < dur_ns) AS short_launches,
       quantile_cont(gpu_start - ts_ns, 0.5) AS median_launch_delay_ns
FROM _launch GROUP BY source
"""
"""The ``rank_launches`` row of one trace: its launch calls (``cuda_runtime``/``cuda_driver``
events whose correlation id matches GPU work) against the GPU work they launched. The median is
``stepscope.analysis.quantiles``' rule (``quantile_cont`` at 0.5: the mean of the two middle
values for an even count); written here as DuckDB's aggregate because this package sits below
the analysis layer."""
