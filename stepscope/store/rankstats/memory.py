"""Each rank's ``[memory]`` events as the allocator's timeline, and the peak of each step.

Definitions: docs/ANALYSIS.md, "Memory". ``total_allocated`` is the allocator's counter, or
rebuilt from the ``Bytes`` deltas on devices whose events carry none (:func:`memory_cte`); a
step's peak is its event with the largest ``total_allocated`` (the earliest on ties), with the
reserved memory, the phase and the host ops live at that moment. The peaks need one rank's
events only (the ops at a peak come from its thread's nesting), so they are computed when the
trace is converted: ``rank_memory_peaks``, one row per device and step; the analysis adds the
device's capacity from ``sources``.
"""

from __future__ import annotations

from stepscope.store.rankstats.devices import accelerator_sql, name_sql
from stepscope.store.rankstats.phase import phase_cte


def memory_cte(ranks_sql: str, out: str = "mem_events") -> str:
    """CTE ``out``: the run's ``[memory]`` events (``memory`` table, ranks of ``ranks_sql``) with
    ``total_allocated`` rebuilt from the ``Bytes`` deltas on devices whose events carry no totals
    (older traces): the running sum of ``bytes`` in time order, raised so that its minimum is 0
    (frees of memory allocated before the trace began would take it below). ``rebuilt`` says
    which; ``total_reserved`` stays null there (deltas say nothing about the allocator's cache).
    Also ``device_name`` and ``accelerator`` (:mod:`stepscope.store.rankstats.devices`)."""
    return f"""
{out}_raw AS (
  SELECT *, row_number() OVER (ORDER BY rank, source, ts_ns, addr, bytes) AS mid,
         count(total_allocated) OVER d = 0 AS rebuilt,
         sum(bytes) OVER (PARTITION BY source, device_type, device ORDER BY ts_ns, addr, bytes
                          ROWS UNBOUNDED PRECEDING) AS running
  FROM memory WHERE run = $run AND {ranks_sql}
  WINDOW d AS (PARTITION BY source, device_type, device)
),
{out} AS (
  SELECT * EXCLUDE (total_allocated, running),
         CASE WHEN rebuilt THEN (running - least(0, min(running) OVER d))::BIGINT ELSE total_allocated END
           AS total_allocated,
         {name_sql("device_type")} AS device_name, {accelerator_sql("device_type")} AS accelerator
  FROM {out}_raw
  WINDOW d AS (PARTITION BY source, device_type, device)
)"""


def threads_cte(points: str, out: str) -> str:
    """CTE ``out(point_id, source, pid, tid, ts_ns, end_ns)``: the thread of each ``[memory]``
    event of CTE ``points(point_id, source, ts_ns, bytes, device)``, matched in ``events``."""
    return f"""
{out} AS (
  SELECT p.point_id, p.source, any_value(e.pid) AS pid, any_value(e.tid) AS tid,
         p.ts_ns, p.ts_ns AS end_ns
  FROM {points} p JOIN events e
    ON e.kind = 'memory' AND e.source = p.source AND e.ts_ns = p.ts_ns AND e.bytes = p.bytes
   AND e.device IS NOT DISTINCT FROM p.device
  GROUP BY p.point_id, p.source, p.ts_ns
)"""


def stack_cte(threads: str, out: str) -> str:
    """CTE ``out(point_id, ops)``: host ops enclosing each point of ``threads``, outermost first."""
    return f"""
{out} AS (
  SELECT t.point_id, list(h.name ORDER BY h.ts_ns, h.dur_ns DESC) AS ops
  FROM {threads} t JOIN events h
    ON h.source = t.source AND h.pid = t.pid AND h.tid = t.tid
   AND h.kind IN ('cpu_op', 'user_annotation') AND h.dur_ns IS NOT NULL
   AND h.ts_ns <= t.ts_ns AND h.ts_ns + h.dur_ns >= t.ts_ns
   AND h.name NOT LIKE 'ProfilerStep#%'
  GROUP BY t.point_id
)"""


_PREPARED = "mem_events AS (FROM _rs_mem_events), mem AS (FROM _rs_mem_events), allocs AS (FROM _rs_allocs)"
"""The CTEs a memory table reads, from :data:`PREPARE_MEMORY` (run before the first of them)."""

RANK_MEMORY_PEAKS = f"""
WITH {_PREPARED},
ranked AS (
  SELECT *, row_number() OVER w_desc AS rn,
         max(total_reserved) OVER w AS peak_reserved_bytes, min(total_allocated) OVER w AS min_allocated_bytes,
         count(*) OVER w AS events
  FROM mem_events
  WINDOW w AS (PARTITION BY device_type, device, step),
         w_desc AS (PARTITION BY device_type, device, step ORDER BY total_allocated DESC, ts_ns, mid)
),
peaks AS MATERIALIZED (
  SELECT mid AS point_id, source, device_type, device, step, events, bytes,
         total_allocated AS peak_allocated_bytes, ts_ns AS peak_ts_ns, peak_reserved_bytes, min_allocated_bytes,
         rebuilt
  FROM ranked WHERE rn = 1
),
peak_points AS (SELECT point_id, source, peak_ts_ns AS ts_ns, bytes, device FROM peaks),
{threads_cte('peak_points', 'peak_threads')},
{stack_cte('peak_threads', 'peak_stack')},
{phase_cte('peak_threads', 'peak_phase')}
SELECT p.source, p.device_type, p.device, p.step, p.events, p.peak_allocated_bytes, p.peak_ts_ns,
       p.peak_reserved_bytes, p.min_allocated_bytes, p.rebuilt, ph.phase, s.ops AS ops_at_peak
FROM peaks p LEFT JOIN peak_phase ph USING (point_id) LEFT JOIN peak_stack s USING (point_id)
ORDER BY p.device_type, p.device, p.step NULLS LAST
"""
"""The ``rank_memory_peaks`` rows of one trace (``$run``; the views hold that trace only)."""


def allocs_ctes(ranks_sql: str) -> str:
    """CTEs ``mem`` (the ``[memory]`` events of :func:`memory_cte`, ranks of ``ranks_sql``) and
    ``allocs``: each allocation (an event with ``bytes > 0``) with ``alloc_ts_ns`` and
    ``free_ts_ns``, the time of the next event at its address on its device when that one frees
    (``bytes < 0``; null: not freed inside the trace); ``mid`` is its event's position."""
    return f"""
{memory_cte(ranks_sql)},
mem AS MATERIALIZED (SELECT * FROM mem_events),
allocs AS MATERIALIZED (
  SELECT * FROM (
    SELECT mid, run, rank, source, device_type, device, step, addr, bytes, ts_ns AS alloc_ts_ns,
           CASE WHEN lead(bytes) OVER w < 0 THEN lead(ts_ns) OVER w END AS free_ts_ns
    FROM mem
    WINDOW w AS (PARTITION BY source, device_type, device, addr ORDER BY ts_ns, mid)
  ) WHERE bytes > 0
)"""


PREPARE_MEMORY: tuple[str, ...] = (
    f"CREATE OR REPLACE TEMP TABLE _rs_mem_events AS WITH {memory_cte('TRUE')} SELECT * FROM mem_events",
    f"CREATE OR REPLACE TEMP TABLE _rs_allocs AS WITH {allocs_ctes('TRUE')} SELECT * FROM allocs",
)
"""The trace's ``[memory]`` events (:func:`memory_cte`) and allocations (:func:`allocs_ctes`) as
temporary tables, made once for the five memory tables at ingest (each computed the same four
window passes over every memory event itself)."""

PEAK_CTE = """
peak AS (
  SELECT rank, device_type, device, ts_ns AS peak_ts_ns, total_allocated AS peak_allocated_bytes
  FROM (SELECT *, row_number() OVER (PARTITION BY rank, device_type, device
                                     ORDER BY total_allocated DESC, ts_ns, mid) AS rn FROM mem)
  WHERE rn = 1
)"""
"""``peak``: each (rank, device)'s highest ``total_allocated`` event of ``mem``, the earliest on ties."""

LIVE_AT_PEAK_CTE = """
live AS (
  SELECT a.*, p.peak_ts_ns, p.peak_allocated_bytes
  FROM allocs a JOIN peak p
    ON p.rank = a.rank AND p.device_type = a.device_type AND p.device IS NOT DISTINCT FROM a.device
  WHERE a.alloc_ts_ns <= p.peak_ts_ns AND (a.free_ts_ns IS NULL OR a.free_ts_ns > p.peak_ts_ns)
)"""
"""``live``: the allocations of ``allocs`` live at their (rank, device)'s ``peak``: allocated at
or before it and not freed by then."""

STORED_ALLOCATIONS = 20
"""How many of a trace's largest allocations per device, and of its largest live at the device's
peak, ``rank_memory_allocations`` keeps (with the ops that made them): the analyses'
``top`` (20 by default, 10 in the summary) can ask for at most this many."""

def bucket_sql(n: str | int) -> str:
    """The time bucket (0 .. ``n`` - 1) of a row's ``ts_ns`` among ``n`` equal buckets over
    ``[t_first, t_last]`` (one bucket when the span is a single instant)."""
    return (f"CASE WHEN t_last = t_first THEN 0 "
            f"ELSE least({n} - 1, ((ts_ns - t_first) * {n}) // (t_last - t_first + 1)) END")


CURVE_BUCKETS = 2000
"""Time buckets per trace and device of ``rank_memory_curve``. The dashboard draws at most 2000
points of a series (``memory_timeline``'s ``max_points``, about a chart's width in pixels), and a
bucketing into any count that divides this one nests exactly into the stored buckets: for a rank
with one trace the page's curve is the one computed from every event. At most this many rows per
device per trace, against tens of thousands of ``[memory]`` events on a training trace."""

RANK_MEMORY_LIVE = f"""
WITH {_PREPARED},
{PEAK_CTE},
{LIVE_AT_PEAK_CTE},
span AS (
  SELECT source, device_type, device, min(ts_ns) AS first_ts_ns, max(ts_ns) AS last_ts_ns
  FROM mem GROUP BY source, device_type, device
),
totals AS (
  SELECT device_type, device, count(*) AS live_allocations, sum(bytes)::BIGINT AS live_bytes
  FROM live GROUP BY device_type, device
)
SELECT s.source, s.device_type, s.device, s.first_ts_ns, s.last_ts_ns,
       p.peak_ts_ns, p.peak_allocated_bytes,
       coalesce(t.live_allocations, 0) AS live_allocations, coalesce(t.live_bytes, 0)::BIGINT AS live_bytes
FROM span s
LEFT JOIN peak p ON p.device_type = s.device_type AND p.device IS NOT DISTINCT FROM s.device
LEFT JOIN totals t ON t.device_type = s.device_type AND t.device IS NOT DISTINCT FROM s.device
ORDER BY s.device_type, s.device
"""
"""The ``rank_memory_live`` rows of one trace: per device, the span of its ``[memory]`` events, its
highest peak and the allocations live at it (all of them: the role split needs their sum)."""

RANK_MEMORY_STEPS = f"""
WITH {_PREPARED}
SELECT source, device_type, device, step, count(*) AS allocations, sum(bytes)::BIGINT AS bytes
FROM allocs GROUP BY source, device_type, device, step
ORDER BY device_type, device, step NULLS LAST
"""
"""The ``rank_memory_steps`` rows of one trace: its allocations per device and step."""

RANK_MEMORY_ALLOCATIONS = f"""
WITH {_PREPARED},
{PEAK_CTE},
{LIVE_AT_PEAK_CTE},
step_ends AS (SELECT DISTINCT end_ns FROM steps WHERE run = $run),
kept AS (
  SELECT mid FROM (
    SELECT mid, row_number() OVER (PARTITION BY device_type, device ORDER BY bytes DESC, alloc_ts_ns, mid) AS n
    FROM allocs) WHERE n <= {STORED_ALLOCATIONS}
  UNION
  SELECT mid FROM (
    SELECT mid, row_number() OVER (PARTITION BY device_type, device ORDER BY bytes DESC, alloc_ts_ns, mid) AS n
    FROM live) WHERE n <= {STORED_ALLOCATIONS}
  UNION
  SELECT mid FROM allocs a
  WHERE a.free_ts_ns IS NULL
     OR EXISTS (SELECT 1 FROM step_ends e WHERE e.end_ns >= a.alloc_ts_ns AND e.end_ns < a.free_ts_ns)
),
picked AS (
  SELECT a.* FROM allocs a SEMI JOIN kept k ON k.mid = a.mid
),
points AS (SELECT mid AS point_id, source, alloc_ts_ns AS ts_ns, bytes, device FROM picked),
{threads_cte('points', 'point_threads')},
{stack_cte('point_threads', 'point_stack')}
SELECT p.source, p.mid AS memory_index, p.device_type, p.device, p.addr, p.bytes, p.step, p.alloc_ts_ns,
       p.free_ts_ns, s.ops AS allocated_by
FROM picked p LEFT JOIN point_stack s ON s.point_id = p.mid
ORDER BY p.device_type, p.device, p.bytes DESC, p.alloc_ts_ns, p.mid
"""
"""The ``rank_memory_allocations`` rows of one trace, with the host ops that made each: per device
its :data:`STORED_ALLOCATIONS` largest allocations, its as many largest live at the device's
peak, and every allocation that may hold a collector's role (one is given a role only if live
at the end of the step the role was seen at, or at the trace's end: so every allocation live
at some step's end, and every one not freed inside the trace)."""

PEAK_TIME_SQL = ("arg_max(ts_ns, {'allocated': total_allocated, 'earliest': -ts_ns}) "
                 "FILTER (WHERE total_allocated IS NOT NULL)")
"""The time of a bucket's largest allocation, the earliest where several points reach it: a plain
``arg_max(ts_ns, total_allocated)`` picks any of the tied rows, and which one changed with the
thread schedule of a parallel scan (the same trace gave two different curves)."""

RANK_MEMORY_CURVE = f"""
WITH {_PREPARED},
m AS (
  SELECT *, min(ts_ns) OVER s AS t_first, max(ts_ns) OVER s AS t_last
  FROM mem_events
  WINDOW s AS (PARTITION BY device_type, device)
),
b AS (
  SELECT *, {bucket_sql(CURVE_BUCKETS)} AS bucket FROM m
)
SELECT source, device_type, device, bucket, {PEAK_TIME_SQL} AS ts_ns,
       max(total_allocated) AS total_allocated, max(total_reserved) AS total_reserved, bool_or(rebuilt) AS rebuilt
FROM b GROUP BY source, device_type, device, bucket
ORDER BY device_type, device, bucket
"""
"""The ``rank_memory_curve`` rows of one trace: per device, :data:`CURVE_BUCKETS` equal time
buckets over its ``[memory]`` events, each with its largest allocated and reserved memory, at the
time of its largest allocation (:data:`PEAK_TIME_SQL`)."""
