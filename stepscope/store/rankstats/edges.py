"""Each rank's dependency edges: where its host issued a collective, and where it waited.

The step's critical path across ranks and its replay (:mod:`stepscope.analysis.critical_path`,
:mod:`stepscope.analysis.replay`) join every rank's timeline at the collectives, matched across
ranks. What they need of one rank is where its *main thread* (the one holding the
``ProfilerStep#N`` annotations) hands work to something else and where it waits for it:

- ``issue``: a collective event (``rank_collectives``' rows: a communication kernel or a gloo
  transfer) and when the host issued it: the start of the runtime call that launched the kernel
  (same correlation id), or for a gloo transfer the start of the latest communication op
  (``c10d::allreduce_``, ``c10d::send``, ...) of the main thread at or before the transfer's
  start, also for a transfer on the main thread itself (a pipeline's ``gloo:send`` annotation
  starts only when its ``c10d::send`` op, which moved the data, has ended).
- ``wait``: a stretch where the main thread waits, with the work it waits for (the latest of
  that work to end inside the stretch): a device synchronisation (the ``sync_wait`` part's
  runtime calls) waits for the GPU work or collective that ends last inside it; a stretch of the
  main thread with no op (``cpu_op`` or runtime call) running inside a step, annotations
  aside, or inside a communication op (a synchronous ``c10d::allreduce_``), waits for a gloo
  transfer ending inside it (a CPU rank blocked in ``work.wait()``, which the profiler does not
  record, or in the op itself: an interleaved schedule waits for its irecv inside the next
  ``PP:..F..`` annotation); a gloo receive running on the main thread itself, with no op
  starting inside it, waits for itself (its end, after its peer arrived). A stretch ending where
  no such work ends is the host's own time, not a wait (a ``time.sleep`` before a collective).

Host thread order and stream order need no row: they are the time order of the main thread's
marks and of each lane's events, which the analysis reads from these rows and
``rank_collectives``. The rows are keyed to ``rank_collectives`` by ``(dep_ts_ns, dep_end_ns,
dep_stream, dep_tid)``.
"""

from __future__ import annotations

from stepscope.store.rankstats.breakdown import GPU_KINDS_SQL, sql_list
from stepscope.store.rankstats.collectives import HOST_SIDE_SQL
from stepscope.store.rankstats.parts import HOST, SYNC_WAIT

EDGE_KINDS = ("issue", "wait")
"""The kinds of rows of ``rank_edges`` (module docs)."""

EDGES_NEEDS = f"e.dur_ns IS NOT NULL AND (e.kind IN {GPU_KINDS_SQL} OR ({HOST_SIDE_SQL}))"
"""An edge needs GPU work or a gloo transfer: a trace with neither has no row (``RankTable.needs``)."""

EDGES_COLUMNS = ("source VARCHAR, step BIGINT, kind VARCHAR, host_ts_ns BIGINT, host_end_ns BIGINT, "
                 "dep_ts_ns BIGINT, dep_end_ns BIGINT, dep_stream BIGINT, dep_tid BIGINT, dep_comm BOOLEAN")

_SYNC = " OR ".join(f"({claim})" for claim in SYNC_WAIT.claims)

RANK_EDGES = f"""
WITH _d_main AS (
  SELECT pid, tid FROM events
  WHERE run = $run AND name LIKE 'ProfilerStep#%' AND dur_ns IS NOT NULL
  GROUP BY pid, tid ORDER BY count(*) DESC, pid, tid LIMIT 1
),
_d_win AS (SELECT step, start_ns AS w0, end_ns AS w1 FROM steps WHERE run = $run),
_d_remote AS (
  SELECT e.ts_ns, e.ts_ns + e.dur_ns AS end_ns, e.stream, e.tid, e.correlation, e.kind,
         e.category = 'communication' AND (e.kind = 'kernel' OR ({HOST_SIDE_SQL})) AS comm,
         e.kind IN {GPU_KINDS_SQL} AS on_gpu
  FROM events e WHERE e.run = $run AND {EDGES_NEEDS}
),
_d_host AS (
  SELECT e.ts_ns, e.ts_ns + coalesce(e.dur_ns, 0) AS end_ns, e.kind, e.category, e.name, w.step, w.w0, w.w1
  FROM events e JOIN _d_main m ON e.pid = m.pid AND e.tid = m.tid
  JOIN _d_win w ON e.ts_ns >= w.w0 AND e.ts_ns < w.w1
  WHERE e.run = $run AND e.dur_ns IS NOT NULL AND e.kind IN {sql_list(HOST.kinds)}
    AND e.name NOT LIKE 'ProfilerStep#%'
),
_d_ops_run AS (
  -- what runs on the main thread: ops and runtime calls (an annotation, a schedule's ``PP:2F0``
  -- or an async ``gloo:recv``, stays open around the stretch where the thread blocks)
  SELECT * FROM _d_host WHERE kind IN ('cpu_op', 'cuda_runtime', 'cuda_driver')
),
_d_gaps AS (
  -- the main thread's stretches with no op running, up to the next op or the step's end
  SELECT step, g0, g1 FROM (
    SELECT step, max(end_ns) OVER (PARTITION BY step ORDER BY ts_ns, end_ns ROWS UNBOUNDED PRECEDING) AS g0,
           lead(ts_ns, 1, w1) OVER (PARTITION BY step ORDER BY ts_ns, end_ns) AS g1
    FROM _d_ops_run)
  WHERE g1 > g0
),
_d_stretch AS (
  -- stretches that wait for a gloo transfer ending inside them
  SELECT step, g0, g1 FROM _d_gaps
  UNION ALL
  SELECT step, ts_ns, end_ns FROM _d_host WHERE end_ns > ts_ns AND kind = 'cpu_op' AND category = 'communication'
),
_d_waiting AS (
  SELECT step, g0, g1, TRUE AS gloo_only FROM _d_stretch
  UNION ALL
  -- a gloo receive on the main thread itself (a pipeline's recv) in which no op starts: it waits
  -- for itself (a send's annotation stays open while the thread goes on: an isend completes
  -- later, it does not wait; nor does an irecv the thread runs ops in: where it blocks for it is
  -- a stretch with no op running, above)
  SELECT step, r.ts_ns, r.end_ns, TRUE FROM _d_host r
  WHERE r.end_ns > r.ts_ns AND r.kind = 'user_annotation' AND r.name LIKE 'gloo:recv%'
    AND NOT EXISTS (SELECT 1 FROM _d_ops_run o WHERE o.ts_ns > r.ts_ns AND o.ts_ns < r.end_ns)
  UNION ALL
  SELECT step, ts_ns, end_ns, FALSE FROM _d_host WHERE end_ns > ts_ns AND ({_SYNC})
),
_d_sweep AS (
  -- one sort of the stretches' ends among the awaitable work's ends: at each stretch's end, the
  -- latest work (any, and gloo transfers only) to end at or before it (a range join of every
  -- sync call with every GPU event is quadratic)
  SELECT step, g0, g1, gloo_only,
         last_value(w IGNORE NULLS) OVER (ORDER BY t, ord ROWS UNBOUNDED PRECEDING) AS any_w,
         last_value(CASE WHEN w.comm AND NOT on_gpu THEN w END IGNORE NULLS)
           OVER (ORDER BY t, ord ROWS UNBOUNDED PRECEDING) AS gloo_w
  FROM (SELECT end_ns AS t, 0 AS ord, {{'ts': ts_ns, 'end': end_ns, 'stream': stream, 'tid': tid, 'comm': comm}} AS w,
               on_gpu, NULL::BIGINT AS step, NULL::BIGINT AS g0, NULL::BIGINT AS g1, NULL::BOOLEAN AS gloo_only
        FROM _d_remote
        UNION ALL
        SELECT g1, 1, NULL, NULL, step, g0, g1, gloo_only FROM _d_waiting)
),
_d_wait AS (
  SELECT step, g0, g1, w.ts AS dep_ts_ns, w."end" AS dep_end_ns, w.stream AS dep_stream, w.tid AS dep_tid,
         w.comm AS dep_comm
  FROM (SELECT step, g0, g1, CASE WHEN gloo_only THEN gloo_w ELSE any_w END AS w FROM _d_sweep WHERE g1 IS NOT NULL)
  WHERE w."end" > g0
),
_d_comm AS (SELECT * FROM _d_remote WHERE comm),
_d_ops AS (
  SELECT ts_ns FROM _d_host WHERE kind = 'cpu_op' AND category = 'communication'
),
_d_launch AS (
  SELECT c.ts_ns, c.end_ns, c.stream, c.tid, min(l.ts_ns) AS issue_ns
  FROM _d_comm c JOIN events l
    ON l.run = $run AND l.correlation = c.correlation AND l.kind IN ('cuda_runtime', 'cuda_driver')
  WHERE c.kind = 'kernel' GROUP BY ALL
),
_d_gloo AS (
  -- also on the main thread (a pipeline's gloo:send annotation starts when its c10d::send op,
  -- which moved the data, ends); a transfer with no op before it is its own issue
  SELECT c.ts_ns, c.end_ns, c.stream, c.tid, coalesce(o.ts_ns, c.ts_ns) AS issue_ns
  FROM (SELECT * FROM _d_comm WHERE kind <> 'kernel') c ASOF LEFT JOIN _d_ops o ON o.ts_ns <= c.ts_ns
),
_d_issue AS (
  SELECT i.*, w.step FROM (SELECT * FROM _d_launch UNION ALL SELECT * FROM _d_gloo) i
  JOIN _d_win w ON i.issue_ns >= w.w0 AND i.issue_ns < w.w1
)
SELECT (SELECT source FROM events LIMIT 1) AS source, step, kind, host_ts_ns, host_end_ns, dep_ts_ns, dep_end_ns,
       dep_stream, dep_tid, dep_comm
FROM (
  SELECT step, 'wait' AS kind, g0 AS host_ts_ns, g1 AS host_end_ns, dep_ts_ns, dep_end_ns, dep_stream, dep_tid,
         dep_comm FROM _d_wait
  UNION ALL
  SELECT step, 'issue', issue_ns, issue_ns, ts_ns, end_ns, stream, tid, TRUE FROM _d_issue
)
ORDER BY step, host_ts_ns, kind, dep_ts_ns
"""
"""The ``rank_edges`` rows of one trace (``$run``; the views hold that trace only)."""
