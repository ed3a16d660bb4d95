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


RANK_MEMORY_PEAKS = f"""
WITH {memory_cte("TRUE")},
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
