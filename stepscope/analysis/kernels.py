"""Kernels and ops: what the GPU and the CPU spend their time on, launch overhead, step times.

All per rank, in DuckDB SQL over the store. Definitions in docs/ANALYSIS.md ("Kernels and ops").
The top kernels and CPU ops rank the per-name aggregates each rank's ingest wrote
(``rank_kernels``, ``rank_cpu_ops``: :mod:`stepscope.store.rankstats.kernels`), and the launch
overhead its launch totals (``rank_launches``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from stepscope.analysis._sql import rank_filter
from stepscope.analysis.cache import cached_frame
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
    WITH _step_time AS (SELECT rank, sum(dur_ns) AS step_ns FROM rank_step_gpu WHERE run = $run AND {rf} GROUP BY rank),
    _agg AS (
        SELECT rank, name, any_value(kind) AS kind, any_value(category) AS category,
               sum(count)::BIGINT AS count, sum(total_ns)::BIGINT AS total_ns, sum(total_ns) / sum(count) AS mean_ns,
               max(max_ns) AS max_ns
        FROM rank_kernels WHERE run = $run AND {rf} GROUP BY rank, name
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
    _agg AS (
        SELECT rank, name, any_value(category) AS category, sum(count)::BIGINT AS count,
               sum(total_ns)::BIGINT AS total_ns, sum(self_ns)::BIGINT AS self_ns, sum(sync_ns)::BIGINT AS sync_ns,
               sum(total_ns) / sum(count) AS mean_ns, max(max_ns) AS max_ns
        FROM rank_cpu_ops WHERE run = $run AND {rf} GROUP BY rank, name
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

    Read from what each trace's ingest stored (``rank_launches``); a rank's traces add up. The
    median is exact for a rank with one trace in the run; over several traces it is the mean of
    the traces' medians weighted by their launches (the traces' launches are not kept one by
    one, so the median of all of them together cannot be had from the table).
    """
    rf, extra = rank_filter(ranks)
    query = f"""
    SELECT $run AS run, rank, sum(launches)::BIGINT AS launches, sum(launch_ns)::BIGINT AS launch_ns,
           sum(launched_gpu_ns)::BIGINT AS launched_gpu_ns,
           CASE WHEN sum(launched_gpu_ns) > 0 THEN sum(launch_ns) / sum(launched_gpu_ns) END AS launch_to_gpu_ratio,
           sum(short_launches)::BIGINT AS short_launches,
           CASE WHEN count(*) = 1 THEN any_value(median_launch_delay_ns)
                ELSE sum(median_launch_delay_ns * launches) / sum(launches) END AS median_launch_delay_ns
    FROM rank_launches WHERE run = $run AND {rf}
    GROUP BY rank ORDER BY rank
    """
    return store.sql(query, {"run": run, **extra})


@cached_frame("step_stats")
def step_stats(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Step-time statistics per rank, from each source of step times the run has.

    ``source`` is ``profiler_steps`` (ProfilerStep CPU windows, ``steps`` table) or
    ``step_times`` (every step the collector timed, ``wall_ns``, but those the collector itself
    disturbed: ``step_times.disturbed_by``). Columns: ``run, rank, source, steps, min_ns,
    median_ns, p90_ns, max_ns, mean_ns, spread_pct`` (100 * (max - min) / median),
    ``disturbed_steps`` (the step times left out). Median and p90 follow
    :mod:`stepscope.analysis.quantiles` (linear interpolation: an even count's median is the
    mean of the two middle steps).
    """
    rf, extra = rank_filter(ranks)
    query = f"""
    WITH _d AS (
        SELECT rank, 'profiler_steps' AS source, dur_ns AS d, 0 AS disturbed
        FROM steps WHERE run = $run AND {rf}
        UNION ALL
        SELECT rank, 'step_times', CASE WHEN disturbed_by IS NULL THEN wall_ns END,
               (disturbed_by IS NOT NULL)::INTEGER
        FROM step_times WHERE run = $run AND {rf}
    )
    SELECT $run AS run, rank, source, count(d) AS steps, min(d) AS min_ns,
           {median_sql("d")} AS median_ns, {quantile_sql("d", 0.9)} AS p90_ns, max(d) AS max_ns,
           avg(d) AS mean_ns,
           100.0 * (max(d) - min(d)) / NULLIF({median_sql("d")}, 0) AS spread_pct,
           sum(disturbed)::BIGINT AS disturbed_steps
    FROM _d
    GROUP BY rank, source ORDER BY rank, source
    """
    return store.sql(query, {"run": run, **extra})
