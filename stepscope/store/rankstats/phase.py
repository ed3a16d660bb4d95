"""Training phase (forward, backward, optimizer) of GPU work and of host instants, in SQL.

Kineto records no phase. We infer it from the host events that enclose the moment the work was
issued: the start of a GPU event's CUDA launch (found by ``correlation``) or a host instant
such as a ``[memory]`` event, on the same process and thread. Enclosing events are *markers* when their
name says which phase they belong to:

- **optimizer**: ``Optimizer.step#...`` / ``Optimizer.zero_grad#...`` (torch.optim's own
  annotations) and any annotation or op whose name contains ``optimizer`` (``## optimizer ##``).
- **backward**: ``autograd::engine::evaluate_function: ...`` (every op the autograd engine runs,
  on its own thread), ops named ``*Backward*`` and annotations containing ``backward``.
- **forward**: names containing ``forward`` (``## forward ##``, ``DistributedDataParallel.forward``,
  ``nn.Module`` forward annotations).

When markers of several phases enclose a launch, the first in the order optimizer, backward,
forward wins: activation checkpointing re-runs forward code *inside* backward, and that work
belongs to backward. A launch enclosed by no marker is ``other`` (data loading, the input
all-to-all of a recommender, or a trace recorded without such annotations); GPU work whose launch
is not in the trace gets a null phase (it cannot be placed).

The module only builds SQL text (common table expressions) for the analyses that need a phase;
it runs no query itself.
"""

from __future__ import annotations

MARKER_PHASE_SQL = """
CASE
  WHEN lower(name) LIKE '%optimizer%' THEN 1
  WHEN name LIKE 'autograd::engine::evaluate_function:%' OR lower(name) LIKE '%backward%' THEN 2
  WHEN lower(name) LIKE '%forward%' THEN 3
END
"""
"""Priority of a host event as a phase marker (1 optimizer, 2 backward, 3 forward) or null."""

_PRIORITY_TO_PHASE = "CASE {p} WHEN 1 THEN 'optimizer' WHEN 2 THEN 'backward' WHEN 3 THEN 'forward' ELSE 'other' END"


def launch_points_cte(gpu: str, out: str) -> str:
    """CTE ``out(point_id, source, pid, tid, ts_ns, end_ns)``: the host launch of each GPU event.

    ``gpu`` names a CTE with columns ``point_id, run, rank, source, correlation``. GPU work and
    its launch share ``correlation`` within one trace file (``source``); a GPU event without a
    matching ``cuda_runtime``/``cuda_driver`` event has no row here.
    """
    return f"""
{out} AS (
  SELECT g.point_id, any_value(l.source) AS source, arg_min(l.pid, l.ts_ns) AS pid, arg_min(l.tid, l.ts_ns) AS tid,
         min(l.ts_ns) AS ts_ns, arg_min(l.ts_ns + coalesce(l.dur_ns, 0), l.ts_ns) AS end_ns
  FROM {gpu} g
  JOIN events l
    ON l.run = g.run AND l.rank = g.rank AND l.source = g.source AND l.correlation = g.correlation
   AND l.kind IN ('cuda_runtime', 'cuda_driver')
  GROUP BY g.point_id
)"""


def phase_cte(points: str, out: str) -> str:
    """CTE ``out(point_id, phase)``: the phase of each host point of CTE ``points``.

    ``points`` has columns ``point_id, source, pid, tid, ts_ns``. A marker encloses a point when
    it runs on the same process and thread and its ``[start, end]`` holds the point's ``ts_ns``
    (for a launch: the moment it was issued). Every point gets a row (``other`` when no marker
    encloses it).

    Markers nest and repeat thousands of times per thread (one per autograd node), so instead of
    joining every point with every marker of its thread, the markers of each phase are merged
    into disjoint islands per thread and each point looks up, with an ASOF join, the last island
    of each phase starting at or before it: a point lies in some marker of a phase exactly when
    it lies in that island.
    """
    return f"""
{out}_markers AS (
  SELECT source, pid, tid, ts_ns, ts_ns + dur_ns AS end_ns, {MARKER_PHASE_SQL} AS priority
  FROM events
  WHERE kind IN ('cpu_op', 'user_annotation', 'python_function') AND dur_ns IS NOT NULL
    AND (source, pid, tid) IN (SELECT (source, pid, tid) FROM {points})
    AND ({MARKER_PHASE_SQL}) IS NOT NULL
),
{out}_prev AS (
  SELECT *, max(end_ns) OVER (PARTITION BY source, pid, tid, priority ORDER BY ts_ns, end_ns
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
  FROM {out}_markers
),
{out}_islands AS (
  SELECT source, pid, tid, priority, min(ts_ns) AS island_start, max(end_ns) AS island_end
  FROM (SELECT *, sum(CASE WHEN prev_end IS NULL OR ts_ns > prev_end THEN 1 ELSE 0 END)
                    OVER (PARTITION BY source, pid, tid, priority ORDER BY ts_ns, end_ns
                          ROWS UNBOUNDED PRECEDING) AS island
        FROM {out}_prev)
  GROUP BY source, pid, tid, priority, island
),
{out}_asked AS (
  SELECT p.point_id, p.source, p.pid, p.tid, p.ts_ns, k.priority
  FROM {points} p CROSS JOIN (VALUES (1), (2), (3)) k(priority)
),
{out} AS (
  SELECT a.point_id,
         {_PRIORITY_TO_PHASE.format(p="min(CASE WHEN i.island_end >= a.ts_ns THEN a.priority END)")} AS phase
  FROM {out}_asked a
  ASOF LEFT JOIN {out}_islands i
    ON i.source = a.source AND i.pid = a.pid AND i.tid = a.tid AND i.priority = a.priority
   AND a.ts_ns >= i.island_start
  GROUP BY a.point_id
)"""


def gpu_phase_ctes(gpu: str, out: str) -> str:
    """CTEs ending in ``out(point_id, phase)`` for the GPU events of CTE ``gpu``.

    Events whose launch is not in the trace get no row, so a LEFT JOIN leaves their phase null.
    """
    return launch_points_cte(gpu, f"{out}_launch") + "," + phase_cte(f"{out}_launch", out)
