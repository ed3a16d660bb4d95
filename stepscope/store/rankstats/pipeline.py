"""Each rank's pipeline facts: its point-to-point transfers, its runtime schedule's actions and
its work items, computed when the trace is converted.

Definitions: docs/ANALYSIS.md, "Pipeline parallelism". What a stage did in a step (its chunks,
their kind and microbatch, its fill, wait and drain) needs the pipeline's stage order, known
only across ranks (who sends to whom), and the step windows; so the analysis
(:mod:`stepscope.analysis.pipeline`) cuts and labels the chunks. What it cuts them from reads
one rank's events only, and is stored here:

- ``rank_p2p``: every point-to-point host op (``c10d::send``, ``c10d::recv_``; every backend
  records them) with the peer's rank *in its process group* (``Concrete Inputs[2]``; the
  analysis maps it to a global rank through the run's process-group metadata);
- ``rank_pipeline_actions``: every action annotation ``PP:<stage><F|B|I|W><microbatch>`` of
  torch's runtime schedules;
- ``rank_pipeline_work``: every work item with its issue time and the phase of the markers
  around its issue (:mod:`.phase`): on a trace with GPU kernels its compute kernels (issued at
  their launch), on a CPU-only trace its compute CPU ops (issued at their start). Written only
  for a trace with a transfer or an action: a rank without either is in no pipeline, and the
  items of every other trace (each kernel of a GPU trace) would cost ingest time for nothing.
"""

from __future__ import annotations

from stepscope.store.rankstats.breakdown import sql_list
from stepscope.store.rankstats.phase import phase_cte

P2P_OPS = ("c10d::send", "c10d::recv_")
"""Host ops of point-to-point transfers; ``Concrete Inputs[2]`` is the peer (group rank)."""

ACTION = r"^PP:(\d+)([FBIW])(\d+)$"
"""A compute action of torch's runtime schedules: stage, kind, microbatch."""

P2P_SQL = f"e.kind = 'cpu_op' AND e.name IN {sql_list(P2P_OPS)}"
ACTION_SQL = f"e.kind = 'user_annotation' AND e.dur_ns IS NOT NULL AND e.name LIKE 'PP:%' AND regexp_matches(e.name, '{ACTION}')"
"""The events of ``rank_p2p`` and of ``rank_pipeline_actions`` (alias ``e``): without either, a
trace has no pipeline work rows either."""

RANK_P2P = f"""
SELECT e.source, e.step, e.ts_ns, e.dur_ns, e.name = 'c10d::send' AS send,
       TRY_CAST(json_extract_string(e.args, '$."Concrete Inputs"[2]') AS BIGINT) AS peer_index
FROM events e
WHERE e.run = $run AND {P2P_SQL} AND e.ts_ns IS NOT NULL
ORDER BY e.ts_ns, e.dur_ns
"""
"""The ``rank_p2p`` rows of one trace: its point-to-point transfers in time order."""

RANK_PIPELINE_ACTIONS = f"""
SELECT e.source, e.ts_ns, e.ts_ns + e.dur_ns AS end_ns,
       regexp_extract(e.name, '{ACTION}', 1)::BIGINT AS stage, regexp_extract(e.name, '{ACTION}', 2) AS action,
       regexp_extract(e.name, '{ACTION}', 3)::BIGINT AS microbatch
FROM events e
WHERE e.run = $run AND {ACTION_SQL}
ORDER BY e.ts_ns, e.dur_ns
"""
"""The ``rank_pipeline_actions`` rows of one trace: its schedule's actions in time order."""

RANK_PIPELINE_WORK = f"""
WITH staged AS MATERIALIZED (
  -- the trace's source when it has a transfer or an action, else no row: joined first, so that
  -- DuckDB skips most of the scans below on every other trace (a scalar flag would not)
  SELECT DISTINCT e.source FROM events e WHERE e.run = $run AND (({P2P_SQL}) OR ({ACTION_SQL}))
),
on_gpu AS (SELECT count(*) > 0 AS yes FROM events WHERE run = $run AND kind = 'kernel'),
items AS MATERIALIZED (
  SELECT e.source, e.pid, e.tid, e.ts_ns AS issue_ns, e.ts_ns AS start_ns, e.ts_ns + e.dur_ns AS end_ns,
         FALSE AS on_gpu
  FROM staged s JOIN events e ON e.source = s.source
  WHERE e.run = $run AND e.kind = 'cpu_op' AND e.category IS DISTINCT FROM 'communication'
    AND e.name NOT LIKE 'ProfilerStep#%' AND e.dur_ns IS NOT NULL AND NOT (SELECT yes FROM on_gpu)
  UNION ALL
  SELECT l.source, l.pid, l.tid, l.ts_ns, e.ts_ns, e.ts_ns + e.dur_ns, TRUE
  FROM staged s JOIN events e ON e.source = s.source JOIN events l
    ON l.run = $run AND l.source = e.source AND l.correlation = e.correlation
   AND l.kind IN ('cuda_runtime', 'cuda_driver')
  WHERE e.run = $run AND e.kind = 'kernel' AND e.category = 'compute' AND e.dur_ns > 0
),
points AS (
  SELECT row_number() OVER (ORDER BY issue_ns, start_ns, end_ns) AS point_id, source, pid, tid,
         issue_ns AS ts_ns, start_ns, end_ns, on_gpu
  FROM items
),
{phase_cte("points", "ph")}
SELECT p.source, p.ts_ns AS issue_ns, p.start_ns, p.end_ns, ph.phase, p.on_gpu
FROM points p JOIN ph USING (point_id)
ORDER BY p.ts_ns, p.start_ns, p.end_ns
"""
"""The ``rank_pipeline_work`` rows of one trace (module docs), in issue order; none unless the
trace has a transfer or an action."""
