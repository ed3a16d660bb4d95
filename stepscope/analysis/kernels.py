"""Kernels and ops: what the GPU and the CPU spend their time on, launch overhead, step times.

All per rank, in DuckDB SQL over the store. Definitions in docs/ANALYSIS.md ("Kernels and ops").
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from stepscope.analysis._sql import rank_filter
from stepscope.analysis.breakdown import GPU_KINDS_SQL, gpu_cte, window_ctes
from stepscope.analysis.cache import cached_frame
from stepscope.store.rankstats.parts import SYNC_WAIT
from stepscope.analysis.quantiles import median_sql, quantile_sql
from stepscope.analysis.sections import SQLStore


@cached_frame("top_kernels")
def top_kernels(store: SQLStore, run: str, n: int = 20, ranks: Sequence[int] | None = None) -> pa.Table:
    """The ``n`` GPU activities (kernels, copies, memsets; grouped by name) with the most total
    time, per rank.

    Counted: GPU work launched inside a profiled step when the rank has steps (so the share is
    of the same steps), all GPU work otherwise. Columns: ``run, rank, rank_in_rank`` (1 = most
    time), ``name, kind, category, count, total_ns, mean_ns, max_ns, share_of_steps_pct``
    (``total_ns`` over the summed step windows; null without steps; kernels on parallel
    streams can add up to more than 100%).
    """
    rf, extra = rank_filter(ranks)
    query = f"""
    WITH {gpu_cte(rf)}, {window_ctes(rf)},
    _step_time AS (SELECT rank, sum(w1 - w0) AS step_ns FROM win GROUP BY rank),
    _work AS (
        SELECT e.rank, e.name, e.kind, e.category, e.dur_ns
        FROM events e LEFT JOIN _step_time st USING (rank)
        WHERE e.run = $run AND e.kind IN {GPU_KINDS_SQL} AND e.dur_ns > 0 AND {rf}
          AND (st.rank IS NULL OR e.step IS NOT NULL)
    ),
    _agg AS (
        SELECT rank, name, any_value(kind) AS kind, any_value(category) AS category,
               count(*) AS count, sum(dur_ns)::BIGINT AS total_ns, avg(dur_ns) AS mean_ns,
               max(dur_ns) AS max_ns
        FROM _work GROUP BY rank, name
    ),
    _ranked AS (
        SELECT *, row_number() OVER (PARTITION BY rank ORDER BY total_ns DESC, name) AS rank_in_rank
        FROM _agg
    )
    SELECT $run AS run, r.rank, r.rank_in_rank, r.name, r.kind, r.category, r.count, r.total_ns,
           r.mean_ns, r.max_ns, 100.0 * r.total_ns / st.step_ns AS share_of_steps_pct
    FROM _ranked r LEFT JOIN _step_time st USING (rank)
    WHERE r.rank_in_rank <= $n
    ORDER BY r.rank, r.rank_in_rank
    """
    return store.sql(query, {"run": run, "n": int(n), **extra})


_THREAD = "coalesce(e.pid::VARCHAR, '') || '/' || coalesce(e.tid::VARCHAR, e.thread_label, '')"
"""A host event's thread: process and thread id, or the thread's label where the trace gave a
string id (older traces), so that nesting is found on every trace."""


@cached_frame("top_cpu_ops")
def top_cpu_ops(store: SQLStore, run: str, n: int = 20, ranks: Sequence[int] | None = None) -> pa.Table:
    """The ``n`` CPU operators (``cpu_op`` events, grouped by name) with the most total time.

    ``total_ns`` is inclusive (an op's time contains the ops it calls), as the trace records
    it; ``self_ns`` excludes the time of the ops it calls directly (its children: the ``cpu_op``
    events nested in it on its thread); ``sync_ns`` is the time it spends blocked in device
    synchronisation calls (the host part ``sync_wait``'s calls, at any depth below it): an op
    that is mostly ``sync_ns`` waits for the GPU, it does not compute. ``ProfilerStep#N`` (a
    ``cpu_op`` in older traces) is the step, not an operator, and is left out.
    Columns: ``run, rank, rank_in_rank, name, category, count, total_ns, self_ns, sync_ns,
    mean_ns, max_ns, share_of_steps_pct`` (over the summed ProfilerStep CPU windows; null
    without steps). Counted: ops that start inside a profiled step when the rank has steps, all
    ops otherwise.
    """
    rf, extra = rank_filter(ranks)
    query = f"""
    WITH _step_time AS (
        SELECT rank, sum(dur_ns) AS step_ns FROM steps WHERE run = $run AND {rf} GROUP BY rank
    ),
    _ops AS MATERIALIZED (
        SELECT row_number() OVER (ORDER BY e.rank, e.source, e.pid, e.tid, e.ts_ns, e.dur_ns DESC) AS op_id,
               e.rank, e.source, {_THREAD} AS thread, e.name, e.category, e.ts_ns, e.dur_ns, e.step
        FROM events e
        WHERE e.run = $run AND e.kind = 'cpu_op' AND e.dur_ns IS NOT NULL AND {rf}
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
        SELECT rank, source, {_THREAD} AS thread, ts_ns, dur_ns FROM events e
        WHERE run = $run AND {rf} AND dur_ns > 0 AND kind IN ('cuda_runtime', 'cuda_driver') AND ({SYNC_WAIT.claims[0]})
    ),
    _sync_in AS (
        SELECT o.op_id, sum(least(o.ts_ns + o.dur_ns, s.ts_ns + s.dur_ns) - greatest(o.ts_ns, s.ts_ns)) AS sync_ns
        FROM _ops o JOIN _syncs s
          ON s.rank = o.rank AND s.source = o.source AND s.thread = o.thread
         AND s.ts_ns < o.ts_ns + o.dur_ns AND s.ts_ns + s.dur_ns > o.ts_ns
        GROUP BY o.op_id
    ),
    _agg AS (
        SELECT o.rank, o.name, any_value(o.category) AS category, count(*) AS count,
               sum(o.dur_ns)::BIGINT AS total_ns,
               sum(greatest(o.dur_ns - coalesce(c.child_ns, 0), 0))::BIGINT AS self_ns,
               coalesce(sum(y.sync_ns), 0)::BIGINT AS sync_ns,
               avg(o.dur_ns) AS mean_ns, max(o.dur_ns) AS max_ns
        FROM _ops o LEFT JOIN _step_time st USING (rank)
        LEFT JOIN _children c ON c.op_id = o.op_id
        LEFT JOIN _sync_in y ON y.op_id = o.op_id
        WHERE st.rank IS NULL OR o.step IS NOT NULL
        GROUP BY o.rank, o.name
    ),
    _ranked AS (
        SELECT *, row_number() OVER (PARTITION BY rank ORDER BY total_ns DESC, name) AS rank_in_rank
        FROM _agg
    )
    SELECT $run AS run, r.rank, r.rank_in_rank, r.name, r.category, r.count, r.total_ns, r.self_ns, r.sync_ns,
           r.mean_ns, r.max_ns, 100.0 * r.total_ns / st.step_ns AS share_of_steps_pct
    FROM _ranked r LEFT JOIN _step_time st USING (rank)
    WHERE r.rank_in_rank <= $n
    ORDER BY r.rank, r.rank_in_rank
    """
    return store.sql(query, {"run": run, "n": int(n), **extra})


@cached_frame("launch_overhead")
def launch_overhead(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Host launch cost against the GPU work it launches, per rank (ranks with GPU work only).

    A launch is a ``cuda_runtime``/``cuda_driver`` call whose correlation id matches GPU work.
    Columns: ``run, rank, launches, launch_ns`` (summed launch-call durations), ``launched_gpu_ns``
    (summed durations of the GPU work they launched), ``launch_to_gpu_ratio``
    (launch_ns / launched_gpu_ns: above 1 the host spends longer launching than the GPU
    computing), ``short_launches`` (launches whose GPU work took less time than the call),
    ``median_launch_delay_ns`` (GPU start - launch-call start, the median of
    :mod:`stepscope.analysis.quantiles`).
    """
    rf, extra = rank_filter(ranks)
    query = f"""
    WITH _gpu AS (
        SELECT rank, source, correlation, min(ts_ns) AS gpu_start, sum(dur_ns) AS gpu_ns
        FROM events
        WHERE run = $run AND kind IN {GPU_KINDS_SQL} AND dur_ns IS NOT NULL
          AND correlation IS NOT NULL AND {rf}
        GROUP BY rank, source, correlation
    ),
    _launch AS (
        SELECT r.rank, r.ts_ns, r.dur_ns, g.gpu_start, g.gpu_ns
        FROM events r JOIN _gpu g
          ON r.rank = g.rank AND r.source = g.source AND r.correlation = g.correlation
        WHERE r.run = $run AND r.kind IN ('cuda_runtime', 'cuda_driver') AND r.dur_ns IS NOT NULL
    )
    SELECT $run AS run, rank, count(*) AS launches, sum(dur_ns)::BIGINT AS launch_ns,
           sum(gpu_ns)::BIGINT AS launched_gpu_ns,
           CASE WHEN sum(gpu_ns) > 0 THEN sum(dur_ns) / sum(gpu_ns) END AS launch_to_gpu_ratio,
           count(*) FILTER (WHERE gpu_ns < dur_ns) AS short_launches,
           {median_sql("gpu_start - ts_ns")} AS median_launch_delay_ns
    FROM _launch GROUP BY rank ORDER BY rank
    """
    return store.sql(query, {"run": run, **extra})


@cached_frame("step_stats")
def step_stats(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Step-time statistics per rank, from each source of step times the run has.

    ``source`` is ``profiler_steps`` (ProfilerStep CPU windows, ``steps`` table) or
    ``step_times`` (every step the collector timed, ``wall_ns``). Columns: ``run, rank, source,
    steps, min_ns, median_ns, p90_ns, max_ns, mean_ns, spread_pct`` (100 * (max - min) /
    median). Median and p90 follow :mod:`stepscope.analysis.quantiles` (linear interpolation: an
    even count's median is the mean of the two middle steps).
    """
    rf, extra = rank_filter(ranks)
    query = f"""
    WITH _d AS (
        SELECT rank, 'profiler_steps' AS source, dur_ns AS d FROM steps WHERE run = $run AND {rf}
        UNION ALL
        SELECT rank, 'step_times', wall_ns FROM step_times WHERE run = $run AND {rf}
    )
    SELECT $run AS run, rank, source, count(*) AS steps, min(d) AS min_ns,
           {median_sql("d")} AS median_ns, {quantile_sql("d", 0.9)} AS p90_ns, max(d) AS max_ns,
           avg(d) AS mean_ns,
           100.0 * (max(d) - min(d)) / {median_sql("d")} AS spread_pct
    FROM _d GROUP BY rank, source ORDER BY rank, source
    """
    return store.sql(query, {"run": run, **extra})
