"""Communication: what each collective costs, how much of it compute hides, and who arrives last.

Every figure is computed in DuckDB SQL: one query over the store's ``events`` view gathers the
run's collectives with their hidden time and phase (cached per run), and each frame aggregates
that table (:mod:`stepscope.analysis._local`). Definitions (docs/ANALYSIS.md, "Communication"):

- A collective is one communication *kernel* (``kind = 'kernel' AND category = 'communication'``):
  its duration on a rank includes the time it waited for the other ranks to arrive. In a gloo
  run, gloo's worker-thread annotations (``gloo:all_reduce``) stand for the transfers.
- ``bytes`` is the nccl-tests message size S that the store derives (``max(in, out) x element
  size``). ``algbw_gbps = bytes / dur_ns`` (bytes per ns is GB/s with GB = 1e9) and
  ``busbw_gbps = algbw_gbps x factor`` with nccl-tests' factors for ``n = group_size``:
  all_reduce ``2(n-1)/n``; reduce_scatter, all_gather, all_to_all ``(n-1)/n``; broadcast,
  reduce, send, recv, send_recv ``1``. Without a size, a group size or a factor the bandwidth is
  null and ``absent_reason`` says which.
- ``hidden_ns`` is the part of a kernel that overlaps the union of compute kernels on the same
  rank (HTA/TraceLens: compute hides communication); on a CPU-only rank, the part of a gloo
  transfer under the host work the host breakdown puts first (data loading, optimizer, syncs,
  compute ops). ``exposed_ns = dur_ns - hidden_ns``. Sums over kernels count two collectives
  running at once on different streams twice; the step breakdown's exposed-communication
  figure is the union and never does.
- Across ranks (:mod:`stepscope.analysis.matching`): instances matched by sequence number or by
  order, checked, clock-aligned; ``wait_ns`` of a member is its time inside the collective
  before the last peer arrived, ``exposed_wait_ns`` the part of it not hidden. The transfer time
  of an instance is the shortest duration among the ranks, ``start_skew_ns`` the latest start
  minus the earliest, and the rank that started last is the instance's last arrival (none when
  two ranks tie).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from stepscope.analysis._local import local_sql
from stepscope.analysis._sql import rank_filter, sql_list
from stepscope.analysis.absent import Absent, Maybe
from stepscope.analysis.basis import basis_of, quoted_rank
from stepscope.analysis.cache import cached_frame
from stepscope.analysis.findings import MIN_STAKE_NS, Finding, Results, Severity, ranks_phrase, rule
from stepscope.analysis.matching import POINT_TO_POINT, clock_offsets, collective_rows, matched_ctes
from stepscope.analysis.pipeline import PipelineResult
from stepscope.store.rankstats.parts import COMM_EXPOSED, COMMUNICATION_OPS, COMPUTE, COMPUTE_OPS, PEER_WAITS
from stepscope.analysis.quantiles import median, median_sql
from stepscope.analysis.sections import SQLStore, section
from stepscope.units import duration

SIZE_BUCKETS: tuple[tuple[int, str], ...] = (
    (0, "<64KiB"),
    (64 * 1024, "64KiB-1MiB"),
    (1024**2, "1MiB-16MiB"),
    (16 * 1024**2, "16MiB-256MiB"),
    (256 * 1024**2, ">=256MiB"),
)
"""Message-size buckets (lower bound in bytes, label): factors of 16, latency- to bandwidth-bound."""

BUSBW_FACTOR_SQL = """
CASE
  WHEN collective = 'all_reduce' THEN 2.0 * (group_size - 1) / group_size
  WHEN collective IN ('reduce_scatter', 'all_gather', 'all_to_all') THEN (group_size - 1) * 1.0 / group_size
  WHEN collective IN ('broadcast', 'reduce', 'send', 'recv', 'send_recv') THEN 1.0
END
"""
"""nccl-tests doc/PERFORMANCE.md bus-bandwidth factors; null where nccl-tests defines none."""

_BUCKET_SQL = (
    "CASE WHEN bytes IS NULL THEN NULL "
    + " ".join(f"WHEN bytes >= {lo} THEN '{label}'" for lo, label in reversed(SIZE_BUCKETS))
    + " END"
)
_BUCKET_MIN_SQL = (
    "CASE WHEN bytes IS NULL THEN NULL "
    + " ".join(f"WHEN bytes >= {lo} THEN {lo}" for lo, _ in reversed(SIZE_BUCKETS))
    + " END"
)

def _params(run: str, ranks: Sequence[int] | None, column: str = "e.rank") -> tuple[str, dict[str, object]]:
    """The rank predicate on ``column`` and the parameters ``$run`` (and ``$ranks``) it needs."""
    predicate, params = rank_filter(ranks, column)
    return predicate, {"run": run, **params}


def _kernels_ctes(coll_ctes: str, ranks_sql: str) -> str:
    """CTEs ``comm`` (the rows of ``coll``, :func:`stepscope.analysis.matching.matched_ctes`, of
    the ranks asked for: one per communication kernel or host-side gloo transfer, matched across
    ranks, with the phase of its launch), ``hidden`` (from ``rank_hiding_spans``, written at
    ingest: what hides each collective and its wait) and ``kernels``; no event is read.

    Host-side transfers have no hidden/exposed time (they run on the host, beside no GPU
    compute) and no phase (they run on the backend's worker thread, outside every marker).

    A rank's hiding spans are disjoint, so the part of ``[t0, t1)`` under them is
    ``covered(t1) - covered(t0)``, where ``covered(x)`` is their length before ``x``: the spans
    before the last one starting at or before ``x`` (its ``before_ns``, summed at ingest), plus
    the part of that one before ``x``. One as-of join of both ends with the spans, not a join of
    every collective with every span of its rank (~35 M pairs per rank at 2,000 collectives and
    17,000 spans); one, not one per end: each sorts the 1.1 M spans of 64 ranks again.
    """
    return f"""
{coll_ctes},
comm AS (SELECT * FROM coll WHERE {ranks_sql}),
comm_iv AS (
  -- each collective (even id) and its wait (odd id): how much of each the rank's work hides
  SELECT 2 * point_id AS point_id, run, rank, ts_ns AS t0, end_ns AS t1 FROM comm
  UNION ALL
  SELECT 2 * point_id + 1, run, rank, ts_ns, ts_ns + wait_ns FROM comm WHERE wait_ns > 0
),
hiding AS (
  SELECT rank, s0, s1, before_ns AS before
  FROM rank_hiding_spans WHERE run = $run AND s1 > s0 AND rank IN (SELECT DISTINCT rank FROM comm_iv)
),
ends AS (
  -- both ends of each interval, the start counted negative: covered(t1) - covered(t0)
  SELECT point_id, rank, t0 AS x, -1 AS sign FROM comm_iv UNION ALL SELECT point_id, rank, t1, 1 FROM comm_iv
),
hidden AS (
  SELECT e.point_id,
         sum(e.sign * coalesce(a.before + least(greatest(e.x - a.s0, 0), a.s1 - a.s0), 0))::BIGINT AS hidden_ns
  FROM ends e ASOF LEFT JOIN hiding a ON a.rank = e.rank AND e.x >= a.s0
  GROUP BY e.point_id
),
kernels AS (
  SELECT c.*,
         coalesce(h.hidden_ns, 0) AS hidden_ns,
         c.dur_ns - coalesce(h.hidden_ns, 0) AS exposed_ns,
         c.wait_ns - coalesce(hw.hidden_ns, 0) AS exposed_wait_ns,
         {BUSBW_FACTOR_SQL} AS busbw_factor
  FROM comm c
  LEFT JOIN hidden h ON h.point_id = 2 * c.point_id
  LEFT JOIN hidden hw ON hw.point_id = 2 * c.point_id + 1
)"""


_HOST_REASON = "host-side (gloo) transfer: no phase (the gloo worker thread runs outside every marker)"

_ABSENT_BW_SQL = """
CASE
  WHEN bytes IS NULL THEN 'no message size recorded for this kernel (no collective args)'
  WHEN dur_ns = 0 THEN 'zero-duration kernel'
  WHEN busbw_factor IS NULL AND group_size IS NULL AND collective IN
       ('all_reduce', 'reduce_scatter', 'all_gather', 'all_to_all')
    THEN 'no process-group size recorded: busbw needs it'
  WHEN busbw_factor IS NULL THEN 'nccl-tests defines no bus-bandwidth factor for ' || coalesce(collective, 'an unknown collective')
END
"""


@cached_frame("comm_kernels")
def _kernels_table(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Every communication kernel of the run with its hidden time, phase and busbw factor.

    The one query that touches the store's events (the sweep and the phase join are its cost);
    the frames below aggregate its result, so a section runs it once, not once per frame.
    """
    ranks_sql, params = _params(run, ranks, "rank")
    return store.sql(f"WITH {_kernels_ctes(matched_ctes(store, run), ranks_sql)} "
                     "SELECT * EXCLUDE (source, correlation) FROM kernels ORDER BY point_id", params)


def collective_kernels(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """One row per communication kernel: size, time, hidden/exposed time, phase, algbw/busbw."""
    return _kernel_frame(_kernels_table(store, run, ranks))


def _kernel_frame(kernels: pa.Table) -> pa.Table:
    return local_sql(f"""
SELECT run, rank, step, phase, collective, pg_name, pg_desc, pg_ranks, group_size, comm_seq,
       ts_ns, dur_ns, hidden_ns, exposed_ns, wait_ns, exposed_wait_ns, late, bytes, dtype, stream, name, host_side,
       inst_id, valid, inst_group_size, clock_correction_ns, aligned_ts_ns,
       bytes / nullif(dur_ns, 0) AS algbw_gbps,
       bytes * busbw_factor / nullif(dur_ns, 0) AS busbw_gbps,
       nullif(concat_ws('; ', {_ABSENT_BW_SQL}, CASE WHEN host_side THEN '{_HOST_REASON}' END), '') AS absent_reason
FROM kernels
ORDER BY rank, ts_ns
""", kernels=kernels)


def collective_summary(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Per rank, collective and message-size bucket: count, bytes, time, exposed time, bandwidth.

    ``algbw_gbps``/``busbw_gbps`` are time-weighted (total bytes over total time) over the
    kernels with a known size; ``sized_count`` says how many those are. Kernels with no recorded
    size fall in bucket null.
    """
    return _collective_summary(_kernels_table(store, run, ranks))


def _collective_summary(kernels: pa.Table) -> pa.Table:
    query = f"""
SELECT run, rank, collective, host_side, {_BUCKET_SQL} AS size_bucket, {_BUCKET_MIN_SQL} AS size_bucket_min_bytes,
       count(*) AS count, count(bytes) AS sized_count, sum(bytes)::BIGINT AS bytes,
       sum(dur_ns)::BIGINT AS dur_ns, sum(hidden_ns)::BIGINT AS hidden_ns, sum(exposed_ns)::BIGINT AS exposed_ns,
       (sum(exposed_ns) - coalesce(sum(exposed_wait_ns), 0))::BIGINT AS exposed_transfer_ns,
       sum(bytes) FILTER (WHERE dur_ns > 0) / nullif(sum(dur_ns) FILTER (WHERE bytes IS NOT NULL), 0) AS algbw_gbps,
       sum(bytes * busbw_factor) / nullif(sum(dur_ns) FILTER (WHERE bytes * busbw_factor IS NOT NULL), 0) AS busbw_gbps,
       nullif(concat_ws('; ',
         CASE WHEN count(bytes) = 0 THEN 'no message size recorded (kernels carry no collective args)'
              WHEN count(bytes * busbw_factor) = 0 THEN 'no bus-bandwidth factor (group size or collective unknown)'
         END,
         CASE WHEN any_value(host_side) THEN '{_HOST_REASON}' END), '') AS absent_reason
FROM kernels
GROUP BY ALL
ORDER BY rank, collective, size_bucket_min_bytes NULLS FIRST
"""
    return local_sql(query, kernels=kernels)


def group_phase_summary(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Per rank, process group and phase: how much communication, and how much of it is hidden.

    ``exposed_pct_of_steps`` relates the exposed time to the rank's total ``ProfilerStep`` time
    (null, with a reason, when the trace has no steps); ``wait_ns``/``exposed_wait_ns`` are the
    kernels' waits for peers (all of it / the part not under compute; ``matched`` counts the
    kernels matched with another rank, whose wait is known; ``partly_traced``: some of its
    collectives' groups have ranks that were not traced), ``exposed_transfer_ns``
    the exposed time that is not waiting, and ``exposed_transfer_pct_of_steps`` its share.
    """
    return _group_phase_summary(_kernels_table(store, run, ranks), _step_totals(store, run, ranks))


def _step_totals(store: SQLStore, run: str, ranks: Sequence[int] | None) -> pa.Table:
    """Per rank: the summed duration of its ``ProfilerStep`` CPU windows."""
    ranks_sql, params = _params(run, ranks, "rank")
    return store.sql(
        f"SELECT run, rank, sum(dur_ns)::BIGINT AS steps_ns, count(*) AS steps FROM steps "
        f"WHERE run = $run AND {ranks_sql} GROUP BY ALL",
        params,
    )


def _group_phase_summary(kernels: pa.Table, step_total: pa.Table) -> pa.Table:
    query = f"""
SELECT k.run, k.rank, k.pg_name, k.pg_desc, k.pg_ranks, k.group_size, k.phase, k.host_side,
       string_agg(DISTINCT k.collective, ', ' ORDER BY k.collective) AS collectives, count(*) AS count, sum(k.bytes)::BIGINT AS bytes, sum(k.dur_ns)::BIGINT AS dur_ns,
       sum(k.hidden_ns)::BIGINT AS hidden_ns, sum(k.exposed_ns)::BIGINT AS exposed_ns,
       count(k.wait_ns) AS matched,
       -- a send or receive has two members whatever the group's size: not a sign of untraced ranks
       coalesce(bool_or(k.inst_ranks < k.inst_group_size AND k.collective NOT IN {sql_list(POINT_TO_POINT)}), FALSE)
         AS partly_traced,
       sum(k.wait_ns)::BIGINT AS wait_ns,
       sum(k.exposed_wait_ns)::BIGINT AS exposed_wait_ns,
       (sum(k.exposed_ns) - coalesce(sum(k.exposed_wait_ns), 0))::BIGINT AS exposed_transfer_ns,
       100.0 * sum(k.hidden_ns) / nullif(sum(k.dur_ns), 0) AS hidden_pct,
       100.0 * sum(k.exposed_ns) / any_value(s.steps_ns) AS exposed_pct_of_steps,
       100.0 * (sum(k.exposed_ns) - coalesce(sum(k.exposed_wait_ns), 0)) / any_value(s.steps_ns)
         AS exposed_transfer_pct_of_steps, any_value(s.steps) AS steps,
       nullif(concat_ws('; ',
         CASE WHEN any_value(s.steps_ns) IS NULL THEN 'no ProfilerStep#N annotations in this rank''s trace' END,
         CASE WHEN any_value(k.host_side) THEN '{_HOST_REASON}' END), '') AS absent_reason
FROM kernels k LEFT JOIN step_total s ON s.run = k.run AND s.rank = k.rank
GROUP BY ALL
ORDER BY k.rank, exposed_ns DESC
"""
    return local_sql(query, kernels=kernels, step_total=step_total)


_INSTANCES_CTE = f"""
inst AS (
  SELECT any_value(run) AS run, inst_id, any_value(pg_name) AS pg_name, any_value(pg_desc) AS pg_desc,
         any_value(matched_by) AS matched_by, any_value(match_seq) AS match_seq, min(step) AS step,
         mode(collective) AS collective, bool_or(collective_mismatch) AS collective_mismatch,
         count(DISTINCT rank) AS ranks, any_value(inst_group_size) AS group_size, max(bytes) AS bytes,
         any_value({BUSBW_FACTOR_SQL}) AS busbw_factor, bool_and(valid) AS valid,
         any_value(absent_reason) AS absent_reason,
         min(aligned_ts_ns) AS first_start_ns, max(aligned_ts_ns) AS last_start_ns,
         min(dur_ns) AS min_dur_ns, max(dur_ns) AS max_dur_ns,
         arg_min(rank, aligned_ts_ns) AS first_rank_any,
         CASE WHEN count(*) FILTER (WHERE aligned_ts_ns = last_start_ns) = 1 THEN arg_max(rank, aligned_ts_ns) END
           AS last_rank_any,
         list(rank ORDER BY rank) FILTER (WHERE late) AS late_ranks,
         sum(wait_ns)::BIGINT AS wait_ns, max(wait_ns) AS max_wait_ns
  FROM rows GROUP BY inst_id
)"""
"""CTE ``inst``: one row per collective instance over the relation ``rows`` (rows of
:func:`stepscope.analysis.matching.collective_rows`, every rank); times are clock-aligned."""

_POINT_TO_POINT = sql_list(POINT_TO_POINT)
"""Point-to-point transfers: a pipeline schedule makes one side wait by design, so they are
matched and measured but not counted as last arrivals."""


def _rows(store: SQLStore, run: str, ranks: Sequence[int] | None) -> tuple[pa.Table, list[int] | None]:
    """Every rank's collective rows (instances are cross-rank facts: matched over all ranks
    whichever are asked for) and the ranks asked for."""
    return collective_rows(store, run), None if ranks is None else [int(r) for r in ranks]


def _wanted(ranks: list[int] | None, column: str = "rank") -> str:
    """Predicate: ``column`` is one of the ranks asked for (``$wanted``), or every rank."""
    return "TRUE" if ranks is None else f"list_contains($wanted::BIGINT[], {column})"


def collective_instances(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """One row per collective instance matched across ranks (those that have a member on a rank
    asked for): skew, spread, last arrival, waits.

    Skew, spread, first/last rank, late ranks, waits and ``busbw_gbps`` (from the shortest
    duration, the best estimate of the transfer itself) are null when the instance is not valid
    (seen on one rank, more than once on a rank, or its members disagree: see
    :mod:`stepscope.analysis.matching`); ``absent_reason`` says why. Times are clock-aligned.
    ``last_rank`` is null when two ranks started at the same nanosecond.
    """
    rows, wanted = _rows(store, run, ranks)
    query = f"""
WITH {_INSTANCES_CTE}
SELECT run, step, pg_name, pg_desc, matched_by, match_seq, collective, collective_mismatch, ranks, group_size, bytes,
       CASE WHEN valid THEN last_start_ns - first_start_ns END AS start_skew_ns,
       CASE WHEN valid THEN min_dur_ns END AS min_dur_ns,
       CASE WHEN valid THEN max_dur_ns END AS max_dur_ns,
       CASE WHEN valid THEN max_dur_ns - min_dur_ns END AS dur_spread_ns,
       CASE WHEN valid THEN first_rank_any END AS first_rank,
       CASE WHEN valid THEN last_rank_any END AS last_rank,
       late_ranks, wait_ns, max_wait_ns,
       CASE WHEN valid THEN bytes / nullif(min_dur_ns, 0) END AS algbw_gbps,
       CASE WHEN valid THEN bytes * busbw_factor / nullif(min_dur_ns, 0) END AS busbw_gbps,
       absent_reason, first_start_ns
FROM inst
WHERE inst_id IN (SELECT inst_id FROM rows WHERE {_wanted(wanted)})
ORDER BY first_start_ns, inst_id
"""
    return local_sql(query, {"wanted": wanted} if wanted is not None else None, rows=rows).drop_columns(
        ["first_start_ns"])


def rank_arrivals(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Per rank: how often it arrives last at a collective, overall and step by step, and how long
    it waits.

    Point-to-point transfers (send, recv, send_recv) are left out: in pipeline parallelism one
    stage waits for the other by design, which says nothing about a slow rank.

    ``last_pct`` is the share of the rank's valid instances at which it started last.
    ``steps_last_most`` counts the steps in which this rank was the last arrival more often than
    any other rank (ties count for nobody), out of ``steps_with_instances``. ``wait_ns`` is the
    rank's summed wait inside those collectives.
    """
    rows, wanted = _rows(store, run, ranks)
    query = f"""
WITH {_INSTANCES_CTE},
multi AS (SELECT * FROM inst WHERE valid AND collective NOT IN {_POINT_TO_POINT}),
seen AS (
  SELECT k.rank, count(*) AS instances, count(*) FILTER (WHERE m.last_rank_any = k.rank) AS last_count,
         sum(k.aligned_ts_ns - m.first_start_ns)::BIGINT AS late_ns, sum(k.wait_ns)::BIGINT AS wait_ns
  FROM rows k JOIN multi m USING (inst_id)
  GROUP BY k.rank
),
per_step AS (
  SELECT step, last_rank_any AS rank, count(*) AS n FROM multi
  WHERE last_rank_any IS NOT NULL GROUP BY ALL
),
step_top AS (
  SELECT step, CASE WHEN count(*) FILTER (WHERE n = max_n) = 1 THEN arg_max(rank, n) END AS top_rank
  FROM (SELECT *, max(n) OVER (PARTITION BY step) AS max_n FROM per_step)
  GROUP BY step
)
SELECT (SELECT any_value(run) FROM rows) AS run, s.rank, s.instances, s.last_count,
       100.0 * s.last_count / s.instances AS last_pct,
       s.late_ns / s.instances AS mean_late_ns, s.wait_ns,
       (SELECT count(*) FROM step_top t WHERE t.top_rank = s.rank) AS steps_last_most,
       (SELECT count(DISTINCT step) FROM multi) AS steps_with_instances
FROM seen s
WHERE {_wanted(wanted, "s.rank")}
ORDER BY s.rank
"""
    return local_sql(query, {"wanted": wanted} if wanted is not None else None, rows=rows)


def skew_summary(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Per process group and collective, over valid instances: how many, mean and max start
    skew, mean duration spread, the waits in them, and the median bus bandwidth of the transfer
    (from each instance's shortest duration)."""
    rows, wanted = _rows(store, run, ranks)
    query = f"""
WITH {_INSTANCES_CTE}
SELECT any_value(run) AS run, pg_name, any_value(pg_desc) AS pg_desc, collective,
       count(*) AS instances, max(ranks) AS ranks,
       avg(last_start_ns - first_start_ns) AS mean_start_skew_ns,
       max(last_start_ns - first_start_ns) AS max_start_skew_ns,
       avg(max_dur_ns - min_dur_ns) AS mean_dur_spread_ns,
       sum(wait_ns)::BIGINT AS wait_ns, max(max_wait_ns) AS max_wait_ns,
       {median_sql("bytes * busbw_factor / nullif(min_dur_ns, 0)")} AS median_busbw_gbps
FROM inst WHERE valid AND inst_id IN (SELECT inst_id FROM rows WHERE {_wanted(wanted)})
GROUP BY pg_name, collective
ORDER BY pg_name, collective
"""
    return local_sql(query, {"wanted": wanted} if wanted is not None else None, rows=rows)


def arrival_skew(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Per rank and collective: how late the rank starts the valid instances it takes part in.

    ``late_ns`` of a rank at an instance is its (clock-aligned) start minus the earliest start
    among the ranks. Columns: ``run, rank, collective, instances, mean_late_ns, max_late_ns,
    last_count`` (how often it started last), ``wait_ns`` (its summed wait). Point-to-point
    transfers are included: this is a map of who waits, not a verdict.
    """
    rows, wanted = _rows(store, run, ranks)
    query = f"""
WITH {_INSTANCES_CTE},
multi AS (SELECT * FROM inst WHERE valid)
SELECT $run AS run, k.rank, m.collective, count(*) AS instances,
       avg(k.aligned_ts_ns - m.first_start_ns) AS mean_late_ns, max(k.aligned_ts_ns - m.first_start_ns) AS max_late_ns,
       count(*) FILTER (WHERE m.last_rank_any = k.rank) AS last_count, sum(k.wait_ns)::BIGINT AS wait_ns
FROM rows k JOIN multi m USING (inst_id)
WHERE {_wanted(wanted, "k.rank")}
GROUP BY k.rank, m.collective
ORDER BY k.rank, m.collective
"""
    return local_sql(query, {"run": run, **({"wanted": wanted} if wanted is not None else {})}, rows=rows)


def rank_compute(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[pa.Table]:
    """Per rank: mean compute time per step and its excess over the median rank, in percent.

    Compute is the compute part of the GPU step breakdown (|U(compute kernels)|); in a run
    without GPU events (CPU training, gloo) it is the compute-ops part of the host breakdown
    (``compute_source`` says which). A compute straggler inside DDP's backward hides from
    per-rank step times, because every rank waits in the same all-reduce; its compute time
    still shows it.
    """
    from stepscope.analysis.breakdown import host_breakdown, step_breakdown

    steps = step_breakdown(store, run, ranks)
    source, column = "gpu", COMPUTE.column
    if isinstance(steps, Absent):
        host = host_breakdown(store, run, ranks)
        if isinstance(host, Absent):
            return Absent(f"{steps.reason}; {host.reason}")
        steps, source, column = host, "host", COMPUTE_OPS.column
    # A few rows per rank (one per step): grouped over the fetched frame, not another trip through
    # the store; in SQL and Python, not Arrow's group_by or compute functions: the first
    # group_by of a process imports Arrow's acero and dataset modules.
    per_rank = local_sql(f"SELECT rank, count(step) AS steps, avg({column}) AS mean_compute, "
                         "avg(dur_ns) AS mean_step FROM steps GROUP BY rank ORDER BY rank", steps=steps)
    mean_compute = per_rank.column("mean_compute")
    means = mean_compute.to_pylist()
    middle = median(means) if means else None
    excess = [None if m is None or not middle else (m / middle - 1.0) * 100.0 for m in means]
    return pa.table({
        "run": pa.array([run] * len(per_rank), pa.string()),
        "rank": per_rank.column("rank"),
        "compute_source": pa.array([source] * len(per_rank), pa.string()),
        "steps": per_rank.column("steps"),
        "mean_compute_ns": mean_compute,
        "mean_step_ns": per_rank.column("mean_step"),
        "compute_vs_median_pct": pa.array(excess, pa.float64()),
    })


@dataclass(frozen=True)
class CommResult:
    """The ``comm`` section: per-rank tables, and cross-rank ones when the run has two ranks or more."""

    by_collective: pa.Table
    by_group_phase: pa.Table
    skew: Maybe[pa.Table]
    arrivals: Maybe[pa.Table]
    compute: Maybe[pa.Table]
    clock_offsets: Maybe[pa.Table]
    ranks: int


NO_COLLECTIVES = "no communication kernels or gloo transfers in the traces of this run (or of the ranks asked for)"

_ONE_RANK = "one rank in this run: cross-rank skew, waits and clock offsets need two or more"


def _rank_count(store: SQLStore, run: str, ranks: Sequence[int] | None) -> int:
    ranks_sql, params = _params(run, ranks, "rank")
    return store.sql(f"SELECT count(DISTINCT rank) AS n FROM sources WHERE run = $run AND {ranks_sql}",
                     params).to_pylist()[0]["n"]


def _table(value: Maybe[pa.Table]) -> object:
    return value if isinstance(value, Absent) else value.to_pylist()


@section("comm", order=40, to_json=lambda r: {
    "by_collective": r.by_collective.to_pylist(),
    "by_group_phase": r.by_group_phase.to_pylist(),
    "skew": _table(r.skew),
    "arrivals": _table(r.arrivals),
    "compute": _table(r.compute),
    "clock_offsets": _table(r.clock_offsets),
})
def comm_section(store: SQLStore, run: str, ranks: Sequence[int] | None) -> Maybe[CommResult]:
    """Communication per collective and size bucket, per process group and phase (exposed vs
    hidden under compute, waiting vs transfer), and across ranks: start skew, last arrivals,
    compute per rank, clock offsets."""
    kernels = _kernels_table(store, run, ranks)
    if kernels.num_rows == 0:
        return Absent(NO_COLLECTIVES)
    n_ranks = _rank_count(store, run, ranks)
    multi = n_ranks >= 2
    offsets: Maybe[pa.Table] = Absent(_ONE_RANK)
    if multi:
        offsets = clock_offsets(store, run)
        if ranks is not None:
            offsets = offsets.filter(pc.is_in(offsets.column("rank"), pa.array([int(r) for r in ranks], pa.int64())))
    return CommResult(
        by_collective=_collective_summary(kernels),
        by_group_phase=_group_phase_summary(kernels, _step_totals(store, run, ranks)),
        skew=skew_summary(store, run, ranks) if multi else Absent(_ONE_RANK),
        arrivals=rank_arrivals(store, run, ranks) if multi else Absent(_ONE_RANK),
        compute=rank_compute(store, run, ranks) if multi else Absent(_ONE_RANK),
        clock_offsets=offsets,
        ranks=n_ranks,
    )


EXPOSED_PCT_WARN = 10.0
"""Exposed transfer above this share of the step (and 1 ms per step) warns."""

_PHASE_WORDS = {"forward": "in forward", "backward": "in backward", "optimizer": "in the optimizer",
                "other": "outside forward/backward/optimizer"}


def _where(row: dict) -> str:
    """Where a process group's collectives of one phase ran, in words."""
    if row["host_side"]:
        return "on gloo's worker thread"
    return _PHASE_WORDS.get(row["phase"], "in an unknown phase (their launch is not in the trace)")


def _exposed_transfer(ranks: object) -> dict[int, tuple[float, float, bool]]:
    """Per rank with steps: (exposed transfer per step, its share of the step, whether its waits are
    known), from the step breakdown (GPU, else host): the union, never more than the step. Where
    no collective of the rank was matched, waiting cannot be told apart: all exposed
    communication counts."""
    gpu = getattr(ranks, "breakdown")
    table, parent = (gpu, COMM_EXPOSED) if isinstance(gpu, pa.Table) and gpu.num_rows else (
        getattr(ranks, "host"), COMMUNICATION_OPS)
    if not isinstance(table, pa.Table):
        return {}
    matched = getattr(ranks, "matched")
    transfer = next(p for p in parent.sub_parts if p not in PEER_WAITS)
    out: dict[int, tuple[float, float, bool]] = {}
    for rank, rows in _group(table.to_pylist()).items():
        known = rank in matched
        part = transfer if known else parent
        total, dur = sum(r[part.column] for r in rows), sum(r["dur_ns"] for r in rows)
        if dur:
            out[rank] = (total / len(rows), 100 * total / dur, known)
    return out


def _pipeline_stage_shares(results: Results, comm: CommResult) -> dict[int, float]:
    """Per rank that is a pipeline stage: the share of its exposed transfer (exposed, not waiting
    for a matched peer) that is not point-to-point. A stage's sends and receives to its
    neighbours mostly wait for them: that time is the pipeline's bubble (``pipeline.bubble``)."""
    pipe = results.get("pipeline")
    if not isinstance(pipe, PipelineResult):
        return {}
    stage_ranks = {r for p in pipe.pipelines for r in p.ranks}
    totals: dict[int, list[float]] = {}
    for row in comm.by_collective.to_pylist():
        if row["rank"] in stage_ranks:
            total = totals.setdefault(row["rank"], [0.0, 0.0])
            total[0] += row["exposed_transfer_ns"] or 0
            total[1] += 0 if row["collective"] in POINT_TO_POINT else row["exposed_transfer_ns"] or 0
    return {rank: rest / whole if whole else 1.0 for rank, (whole, rest) in totals.items()}


def _without_p2p(collectives: str | None) -> str | None:
    kinds = [c for c in (collectives or "").split(", ") if c and c not in POINT_TO_POINT]
    return ", ".join(kinds) or None


def _group(rows: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for row in rows:
        out.setdefault(row["rank"], []).append(row)
    return out


@rule("comm.exposed", needs=("comm", "ranks"))
def exposed_rule(results: Results) -> Iterator[Finding]:
    """A rank's communication transfers exposed (not under compute and not waiting for a peer)
    for at least 10% of the step time and 1 ms per step: overlap with compute is poor. The time
    is the step breakdown's (a union: never more than the step); the process groups and phases
    whose collectives carry most of it are named. Waiting for peers is ``comm.late_rank``'s,
    not this rule's. One finding over every rank where it holds, naming the worst rank's leading
    groups and phases."""
    result = results["comm"]
    assert isinstance(result, CommResult)
    exposed = _exposed_transfer(results["ranks"])
    contributors = _group(result.by_group_phase.to_pylist())
    stages = _pipeline_stage_shares(results, result)
    items = []
    for rank, (per_step, pct, known) in exposed.items():
        rows = sorted((r for r in contributors.get(rank, []) if (r["exposed_transfer_ns"] or 0) > 0),
                      key=lambda r: -r["exposed_transfer_ns"])
        if rank in stages:  # the transfers between stages are the pipeline's bubble, not poor overlap
            per_step, pct = per_step * stages[rank], pct * stages[rank]
            rows = [{**r, "collectives": _without_p2p(r["collectives"])} for r in rows]
        if pct < EXPOSED_PCT_WARN or per_step < MIN_STAKE_NS or not rows:
            continue
        total = sum(r["exposed_transfer_ns"] for r in rows)
        items.append({"rank": rank, "per_step": per_step, "pct": pct, "known": known, "rows": rows, "total": total,
                      "partly": any(r["partly_traced"] for r in rows)})
    if items:
        worst = max(items, key=lambda i: i["per_step"])
        ranks = tuple(sorted(i["rank"] for i in items))
        parts = [f"{r['collectives'] or 'collectives of unknown kind'} {_where(r)} (process group "
                 f"{r['pg_desc'] or r['pg_name'] or 'unknown'}, {100 * r['exposed_transfer_ns'] / worst['total']:.0f}%)"
                 for r in worst["rows"][:2]]
        basis = basis_of(results)
        spread = quoted_rank(ranks, worst["rank"], {i["rank"]: i["per_step"] for i in items})
        message = (f"{ranks_phrase(ranks)}: communication transfers exposed for {duration(worst['per_step'])} per step "
                   f"({basis.of_step(worst['per_step']) if basis else 'share unknown'}{'; ' + spread if spread else ''}), "
                   f"mostly {' and '.join(parts)}: overlap with compute is poor")
        if worst["rank"] in stages:
            message += ("; the point-to-point transfers between pipeline stages are left out (waiting for the "
                        "neighbour stage: the pipeline's bubble, pipeline.bubble)")
        if not worst["known"]:
            message += ("; none of these collectives was matched with another traced rank's, so part of this may be "
                        "waiting for a peer, not transfer")
        elif worst["partly"]:
            message += ("; some of their process groups have ranks that were not traced: waiting for those counts as "
                        "transfer here")
        lead = worst["rows"][0]
        yield Finding(
            Severity.WARNING,
            "comm.exposed",
            message,
            {"ranks": list(ranks), "worst_rank": worst["rank"], "exposed_transfer_ns_per_step": round(worst["per_step"]),
             "exposed_transfer_pct_of_steps": round(worst["pct"], 2), "waits_known": worst["known"],
             "pg_name": lead["pg_name"], "pg_desc": lead["pg_desc"], "phase": lead["phase"],
             "collectives": lead["collectives"], "hidden_pct": lead["hidden_pct"]},
            ranks=ranks,
            time_at_stake_ns=round(worst["per_step"]),
        )
