"""Memory: the allocator's timeline, the peak of each step, what is live at it, and by whom.

Everything comes from the ``[memory]`` events that ``profile_memory=True`` records (the store's
``memory`` table) and, when the collector recorded them, ``memory_roles`` and
``memory_snapshot``. Definitions (docs/ANALYSIS.md, "Memory"):

- ``total_allocated`` / ``total_reserved`` are the allocator's own counters after each event,
  per device (``device_type`` as Kineto writes it, named and classed as host or accelerator
  memory by :mod:`stepscope.store.rankstats.devices`: 0 CPU, 1 CUDA, 6 HIP, ...). Events without the
  counters (older traces) get ``total_allocated`` rebuilt from their ``Bytes`` deltas
  (:func:`memory_cte`).
- A step's peak is its event with the largest ``total_allocated`` (the earliest on ties), the
  step being the ``ProfilerStep`` the event falls in. ``capacity_bytes`` is the traced GPU's
  ``totalGlobalMem`` (accelerator devices only).
- An *allocation* is an event with ``bytes > 0``; it is freed by the next event at the same
  ``addr`` on the same device when that one has ``bytes < 0``; it is live at ``t`` when it was
  allocated at or before ``t`` and not freed by then. Allocations made before the trace began
  have no event: ``untracked_bytes`` is the part of ``total_allocated`` that no recorded
  allocation explains.
- Roles: an allocation belongs to a ``memory_roles`` role (parameter, gradient, optimizer state)
  when its ``addr`` lies in the role's ``[addr, addr + bytes)`` on the same device and it was
  still live at the end of the step the role was observed at (the end of the trace when the
  role's step is null); otherwise it is ``other`` (activations and temporaries).
- The op that made an allocation, and the ops live at a peak, are the host ops (``cpu_op``,
  ``user_annotation``) on the ``[memory]`` event's thread that enclose it, outermost first.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from stepscope.analysis._sql import rank_filter
from stepscope.analysis.absent import Absent, Maybe
from stepscope.analysis.cache import cached_frame
from stepscope.store.rankstats.devices import accelerator_sql, name_sql
from stepscope.errors import UsageError
from stepscope.store.rankstats.memory import (CURVE_BUCKETS, LIVE_AT_PEAK_CTE, PEAK_TIME_SQL, STORED_ALLOCATIONS,
                                              bucket_sql, memory_cte)
from stepscope.analysis.findings import Finding, Results, Severity, ranks_phrase, rule
from stepscope.analysis.sections import SQLStore, section

NO_MEMORY_EVENTS = ("no [memory] events in the traces of this run or of the ranks asked for "
                    "(record with profile_memory=True)")
NO_ROLES = "no memory roles recorded (the collector records them when given model= / optimizer=)"
NO_SNAPSHOT = "no CUDA memory snapshot recorded (the collector takes one on CUDA only)"


def _params(run: str, ranks: Sequence[int] | None, column: str = "rank") -> tuple[str, dict[str, object]]:
    predicate, params = rank_filter(ranks, column)
    return predicate, {"run": run, **params}


@cached_frame("memory_timeline")
def memory_timeline(store: SQLStore, run: str, ranks: Sequence[int] | None = None,
                    *, max_points: int | None = CURVE_BUCKETS) -> pa.Table:
    """Allocated and reserved bytes over time, per rank and device.

    With ``max_points``, each (rank, device) series is cut into that many equal time buckets
    and each bucket keeps its maximum allocated and reserved (so no peak is lost), at the time
    of its maximum allocation (the earliest such time). These come from the curve each trace's ingest stored
    (``rank_memory_curve``: :data:`CURVE_BUCKETS` buckets per trace and device, each with its
    maximum at the time of its maximum allocation), put into the asked buckets by that time.
    For a rank with one trace and a ``max_points`` that divides :data:`CURVE_BUCKETS` (the
    default is that count) every bucket equals the one computed from every event; otherwise a
    stored bucket that straddles two asked buckets gives its maximum to one of them (the peaks,
    allocated and reserved, stay exact), and more than :data:`CURVE_BUCKETS` points per trace
    cannot be had. ``None`` returns every event (read from the ``memory`` events).
    """
    ranks_sql, params = _params(run, ranks)
    if max_points is None:
        query = f"""
WITH {memory_cte(ranks_sql)}
SELECT run, rank, device_type, device_name, accelerator, device, ts_ns, total_allocated, total_reserved, rebuilt
FROM mem_events
ORDER BY rank, device_type, device, ts_ns"""
        return store.sql(query, params)
    query = f"""
WITH span AS (
  SELECT rank, device_type, device, min(first_ts_ns) AS t_first, max(last_ts_ns) AS t_last
  FROM rank_memory_live WHERE run = $run AND {ranks_sql} GROUP BY rank, device_type, device
),
b AS (
  SELECT c.* EXCLUDE (bucket), {bucket_sql("$n")} AS bucket
  FROM rank_memory_curve c JOIN span s
    ON s.rank = c.rank AND s.device_type IS NOT DISTINCT FROM c.device_type AND s.device IS NOT DISTINCT FROM c.device
  WHERE c.run = $run
)
SELECT any_value(run) AS run, rank, device_type, {name_sql("device_type")} AS device_name,
       {accelerator_sql("device_type")} AS accelerator, device, {PEAK_TIME_SQL} AS ts_ns,
       max(total_allocated) AS total_allocated, max(total_reserved) AS total_reserved,
       bool_or(rebuilt) AS rebuilt
FROM b GROUP BY rank, device_type, device, bucket
ORDER BY rank, device_type, device, ts_ns"""
    return store.sql(query, {**params, "n": int(max_points)})


@cached_frame("memory_step_peaks")
def step_peaks(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Per rank, device and step: the peak of allocated memory, when it happened, reserved
    memory, the share of the device's capacity, the phase and the host ops live at the peak.

    Events outside every ``ProfilerStep`` form the row with a null step.
    """
    ranks_sql, params = _params(run, ranks)
    query = f"""
WITH ranked AS (
  -- one row per trace of a rank: the rank's peak is its traces' highest (the earliest on ties)
  SELECT *, row_number() OVER w_desc AS rn, (sum(events) OVER w)::BIGINT AS rank_events,
         max(peak_reserved_bytes) OVER w AS rank_reserved, min(min_allocated_bytes) OVER w AS rank_min,
         bool_or(rebuilt) OVER w AS rank_rebuilt
  FROM rank_memory_peaks WHERE run = $run AND {ranks_sql}
  WINDOW w AS (PARTITION BY rank, device_type, device, step),
         w_desc AS (PARTITION BY rank, device_type, device, step ORDER BY peak_allocated_bytes DESC, peak_ts_ns, source)
),
peaks AS (
  SELECT run, rank, source, device_type, {name_sql("device_type")} AS device_name,
         {accelerator_sql("device_type")} AS accelerator, device, step, rank_events AS events, peak_allocated_bytes,
         peak_ts_ns, rank_reserved AS peak_reserved_bytes, rank_min AS min_allocated_bytes, rank_rebuilt AS rebuilt,
         phase, ops_at_peak
  FROM ranked WHERE rn = 1
),
cap AS (SELECT source, gpu_memory_bytes FROM sources WHERE run = $run)
SELECT p.run, p.rank, p.device_type, p.device_name, p.accelerator, p.device, p.step, p.events,
       p.peak_allocated_bytes, p.peak_ts_ns, p.peak_reserved_bytes, p.min_allocated_bytes, p.rebuilt,
       CASE WHEN p.accelerator THEN c.gpu_memory_bytes END AS capacity_bytes,
       100.0 * p.peak_allocated_bytes / CASE WHEN p.accelerator THEN c.gpu_memory_bytes END
         AS peak_allocated_pct,
       100.0 * p.peak_reserved_bytes / CASE WHEN p.accelerator THEN c.gpu_memory_bytes END
         AS peak_reserved_pct,
       p.phase, p.ops_at_peak,
       nullif(concat_ws('; ',
         CASE WHEN NOT p.accelerator THEN 'host memory: no device capacity'
              WHEN c.gpu_memory_bytes IS NULL THEN 'the trace records no device memory size (deviceProperties)' END,
         CASE WHEN p.rebuilt THEN 'no Total Allocated/Reserved in these [memory] events: allocated memory rebuilt '
                                   || 'from the Bytes deltas (since the trace began), reserved unknown' END), '')
         AS absent_reason
FROM peaks p
LEFT JOIN cap c USING (source)
ORDER BY p.rank, p.device_type, p.device, p.step NULLS LAST
"""
    return store.sql(query, params)


_STORED_CTES = """
allocs AS (SELECT * FROM rank_memory_allocations WHERE run = $run AND {ranks_sql}),
peak AS (
  -- one row per trace of a rank: the rank's peak is its traces' highest (the earliest on ties)
  SELECT rank, device_type, device, source AS peak_source, peak_ts_ns, peak_allocated_bytes,
         live_allocations, live_bytes
  FROM (SELECT *, row_number() OVER (PARTITION BY rank, device_type, device
                                     ORDER BY peak_allocated_bytes DESC, peak_ts_ns, source) AS rn
        FROM rank_memory_live WHERE run = $run AND {ranks_sql} AND peak_ts_ns IS NOT NULL)
  WHERE rn = 1
),
role_ranges AS (
  SELECT r.source, r.role::VARCHAR AS role, r.name AS role_name, r.addr, r.addr + r.bytes AS addr_end,
         r.device_type, r.device,
         coalesce(s.end_ns, (SELECT max(last_ts_ns) FROM rank_memory_live m WHERE m.source = r.source)) AS seen_ns
  FROM memory_roles r LEFT JOIN steps s ON s.source = r.source AND s.step = r.step
  WHERE r.run = $run
),
alloc_role AS (
  SELECT a.source, a.memory_index, min(r.role) AS role, min(r.role_name) AS role_name
  FROM allocs a JOIN role_ranges r
    ON r.source = a.source AND r.device_type IS NOT DISTINCT FROM a.device_type
   AND (r.device IS NULL OR r.device = a.device)
   AND a.addr >= r.addr AND a.addr < r.addr_end
   AND a.alloc_ts_ns <= r.seen_ns AND (a.free_ts_ns IS NULL OR a.free_ts_ns > r.seen_ns)
  GROUP BY a.source, a.memory_index
),
{live}"""
"""The stored allocations (``rank_memory_allocations``) of the ranks asked for, each (rank,
device)'s highest peak over its traces (``rank_memory_live``), the role of each stored
allocation (the collector's ``memory_roles``, joined here because the collector writes them
after the trace's commit and may rewrite them), and ``live``: the stored allocations live at
the peak. Every allocation that can hold a role is stored, so are a trace's
:data:`STORED_ALLOCATIONS` largest live at its peak, and every allocation not freed inside its
trace: for a rank with one trace, or whose traces do not overlap in time (an allocation of an
earlier trace is live at a later peak only when that trace never freed it), these are the
allocations an event query finds live, as far as the top ``STORED_ALLOCATIONS`` and the role
sums reach. Traces of one rank that overlap in time (not seen in practice) would miss the other
trace's allocations freed after the peak."""


def _stored_ctes(ranks_sql: str) -> str:
    return _STORED_CTES.format(ranks_sql=ranks_sql, live=LIVE_AT_PEAK_CTE.strip())


def _top(top: int) -> int:
    """``top``, refused beyond what each trace's ingest stored."""
    if not 0 < top <= STORED_ALLOCATIONS:
        raise UsageError(f"top={top}: the store keeps the {STORED_ALLOCATIONS} largest allocations of each "
                         f"trace and device (ask for 1 to {STORED_ALLOCATIONS})")
    return int(top)


@cached_frame("memory_live_at_peak")
def live_at_peak(store: SQLStore, run: str, ranks: Sequence[int] | None = None, *, top: int = 20) -> pa.Table:
    """The ``top`` largest allocations live at each (rank, device)'s highest peak: size, when
    allocated and freed, the ops that allocated it (outermost first), and its role. ``top`` is at
    most :data:`STORED_ALLOCATIONS` (what the ingest keeps; more raises :class:`UsageError`)."""
    ranks_sql, params = _params(run, ranks)
    query = f"""
WITH {_stored_ctes(ranks_sql)},
ranked AS (
  SELECT *, row_number() OVER (PARTITION BY rank, device_type, device
                               ORDER BY bytes DESC, alloc_ts_ns, source, memory_index) AS size_rank
  FROM live
)
SELECT l.run, l.rank, l.device_type, l.device, l.peak_ts_ns, l.peak_allocated_bytes, l.size_rank,
       l.bytes, l.addr, l.step, l.alloc_ts_ns, l.free_ts_ns, coalesce(r.role, 'other') AS role,
       r.role_name, l.allocated_by
FROM ranked l
LEFT JOIN alloc_role r USING (source, memory_index)
WHERE l.size_rank <= $top
ORDER BY l.rank, l.device_type, l.device, l.size_rank
"""
    return store.sql(query, {**params, "top": _top(top)})


@cached_frame("memory_largest_allocations")
def largest_allocations(store: SQLStore, run: str, ranks: Sequence[int] | None = None, *, top: int = 20) -> pa.Table:
    """The ``top`` largest allocations of each (rank, device) over the whole trace, with their
    lifetime (null ``free_ts_ns``: not freed inside the trace) and the ops that made them. ``top``
    is at most :data:`STORED_ALLOCATIONS` (each trace's largest are stored; more raises
    :class:`UsageError`); over several traces of a rank, the largest of all of them."""
    ranks_sql, params = _params(run, ranks)
    query = f"""
WITH ranked AS (
  SELECT *, row_number() OVER (PARTITION BY rank, device_type, device
                               ORDER BY bytes DESC, alloc_ts_ns, source, memory_index) AS size_rank
  FROM rank_memory_allocations WHERE run = $run AND {ranks_sql}
)
SELECT r.run, r.rank, r.device_type, r.device, r.size_rank, r.bytes, r.addr, r.step, r.alloc_ts_ns,
       r.free_ts_ns, r.free_ts_ns - r.alloc_ts_ns AS lifetime_ns, r.allocated_by
FROM ranked r
WHERE r.size_rank <= $top
ORDER BY r.rank, r.device_type, r.device, r.size_rank
"""
    return store.sql(query, {**params, "top": _top(top)})


def _has_roles(store: SQLStore, ranks_sql: str, params: dict[str, object]) -> bool:
    """Whether the collector recorded any storage role for these ranks of the run."""
    return bool(store.sql(
        f"SELECT count(*) AS n FROM memory_roles WHERE run = $run AND {ranks_sql}", params
    ).to_pylist()[0]["n"])


@cached_frame("memory_roles_at_peak")
def roles_at_peak(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[pa.Table]:
    """Bytes live at each (rank, device)'s highest peak by role: ``parameter``, ``gradient``,
    ``optimizer_state``, ``other`` (recorded allocations in no role) and ``untracked`` (allocated
    before the trace began: the peak's ``total_allocated`` minus every recorded live
    allocation). Also the bytes each role's storage holds as the collector saw it
    (``recorded_bytes``), which covers storage allocated before the trace.
    :class:`Absent` when no role was recorded.

    The live allocations of the peak's trace are its stored count and bytes
    (``rank_memory_live``); those of the other traces of the rank, the stored ones live then
    (:data:`_STORED_CTES` says when that is all of them)."""
    ranks_sql, params = _params(run, ranks)
    roles_ranks_sql, _ = _params(run, ranks, "r.rank")
    if not _has_roles(store, ranks_sql, params):
        return Absent(NO_ROLES)
    query = f"""
WITH {_stored_ctes(ranks_sql)},
live_roles AS (
  SELECT l.rank, l.device_type, l.device, l.source = p.peak_source AS of_peak_trace,
         coalesce(r.role, 'other') AS role, l.bytes
  FROM live l
  JOIN peak p ON p.rank = l.rank AND p.device_type = l.device_type AND p.device IS NOT DISTINCT FROM l.device
  LEFT JOIN alloc_role r USING (source, memory_index)
),
unstored AS (
  -- the peak trace's live allocations that were not stored: in no role (every one that can be is stored)
  SELECT p.rank, p.device_type, p.device, 'other' AS role,
         (p.live_bytes - coalesce(sum(l.bytes) FILTER (WHERE l.of_peak_trace), 0))::BIGINT AS live_bytes,
         p.live_allocations - count(l.bytes) FILTER (WHERE l.of_peak_trace) AS allocations
  FROM peak p LEFT JOIN live_roles l
    ON l.rank = p.rank AND l.device_type = p.device_type AND l.device IS NOT DISTINCT FROM p.device
  GROUP BY p.rank, p.device_type, p.device, p.live_bytes, p.live_allocations
),
by_role AS (
  SELECT rank, device_type, device, role, sum(live_bytes)::BIGINT AS live_bytes, sum(allocations) AS allocations
  FROM (SELECT rank, device_type, device, role, bytes AS live_bytes, 1 AS allocations FROM live_roles
        UNION ALL SELECT rank, device_type, device, role, live_bytes, allocations FROM unstored)
  GROUP BY ALL
),
recorded AS (
  SELECT r.rank, r.device_type, r.role::VARCHAR AS role, sum(r.bytes)::BIGINT AS recorded_bytes
  FROM memory_roles r
  WHERE r.run = $run AND {roles_ranks_sql}
    AND r.step IS NOT DISTINCT FROM (SELECT max(step) FROM memory_roles x WHERE x.source = r.source)
  GROUP BY ALL
),
untracked AS (
  SELECT p.rank, p.device_type, p.device, 'untracked' AS role,
         p.peak_allocated_bytes - coalesce(sum(b.live_bytes), 0)::BIGINT AS live_bytes, NULL::BIGINT AS allocations
  FROM peak p LEFT JOIN by_role b USING (rank, device_type, device)
  GROUP BY p.rank, p.device_type, p.device, p.peak_allocated_bytes
)
SELECT $run AS run, p.rank, p.device_type, p.device, p.peak_ts_ns, roles.role,
       coalesce(u.live_bytes, 0)::BIGINT AS live_bytes,
       CASE WHEN roles.role <> 'untracked' THEN coalesce(u.allocations, 0)::BIGINT END AS allocations,
       c.recorded_bytes
FROM peak p
CROSS JOIN (VALUES ('parameter'), ('gradient'), ('optimizer_state'), ('other'), ('untracked')) roles(role)
LEFT JOIN (SELECT * FROM by_role UNION ALL BY NAME SELECT * FROM untracked) u
  ON u.rank = p.rank AND u.device_type = p.device_type AND u.device IS NOT DISTINCT FROM p.device AND u.role = roles.role
LEFT JOIN recorded c ON c.rank = p.rank AND c.device_type = p.device_type AND c.role = roles.role
ORDER BY p.rank, p.device_type, p.device, roles.role
"""
    return store.sql(query, params)


@cached_frame("memory_role_allocations")
def role_allocations(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[pa.Table]:
    """Per rank, device, step and role: the recorded allocations labelled with the role, their
    count and bytes. Gradients re-allocated every step show up here step by step; parameters and
    optimizer state allocated before the trace do not (``roles_at_peak.recorded_bytes`` has
    them). :class:`Absent` when no role was recorded. ``other`` is each step's allocations
    (``rank_memory_steps``) less those in a role (every allocation that can hold one is stored)."""
    ranks_sql, params = _params(run, ranks)
    if not _has_roles(store, ranks_sql, params):
        return Absent(NO_ROLES)
    query = f"""
WITH {_stored_ctes(ranks_sql)},
in_role AS (
  SELECT a.rank, a.device_type, a.device, a.step, r.role, count(*) AS allocations, sum(a.bytes)::BIGINT AS bytes
  FROM allocs a JOIN alloc_role r USING (source, memory_index)
  GROUP BY ALL
),
per_step AS (
  SELECT rank, device_type, device, step, sum(allocations) AS allocations, sum(bytes) AS bytes
  FROM rank_memory_steps WHERE run = $run AND {ranks_sql} GROUP BY ALL
),
other AS (
  SELECT t.rank, t.device_type, t.device, t.step, 'other' AS role,
         (t.allocations - coalesce(sum(i.allocations), 0))::BIGINT AS allocations,
         (t.bytes - coalesce(sum(i.bytes), 0))::BIGINT AS bytes
  FROM per_step t LEFT JOIN in_role i
    ON i.rank = t.rank AND i.device_type IS NOT DISTINCT FROM t.device_type
   AND i.device IS NOT DISTINCT FROM t.device AND i.step IS NOT DISTINCT FROM t.step
  GROUP BY t.rank, t.device_type, t.device, t.step, t.allocations, t.bytes
)
SELECT $run AS run, rank, device_type, device, step, role, allocations, bytes
FROM (SELECT * FROM in_role UNION ALL BY NAME SELECT * FROM other WHERE allocations > 0)
ORDER BY rank, device_type, device, step NULLS LAST, role
"""
    return store.sql(query, params)


@cached_frame("memory_snapshot_summary")
def snapshot_summary(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[pa.Table]:
    """Per rank and device, from the CUDA allocator snapshot: segments, reserved bytes, bytes in
    active and inactive (cached, fragmenting) blocks, the largest block, and OOMs in the history.
    :class:`Absent` when no snapshot was recorded."""
    ranks_sql, params = _params(run, ranks)
    query = f"""
SELECT $run AS run, rank, device,
       count(*) FILTER (WHERE record = 'segment') AS segments,
       sum(bytes) FILTER (WHERE record = 'segment')::BIGINT AS reserved_bytes,
       sum(bytes) FILTER (WHERE record = 'block' AND state = 'active_allocated')::BIGINT AS active_bytes,
       sum(bytes) FILTER (WHERE record = 'block' AND state = 'inactive')::BIGINT AS inactive_bytes,
       max(bytes) FILTER (WHERE record = 'block' AND state = 'active_allocated') AS largest_block_bytes,
       count(*) FILTER (WHERE record = 'trace' AND action = 'oom') AS ooms
FROM memory_snapshot WHERE run = $run AND {ranks_sql}
GROUP BY rank, device ORDER BY rank, device
"""
    table = store.sql(query, params)
    if table.num_rows == 0:
        return Absent(NO_SNAPSHOT)
    return table


@cached_frame("memory_snapshot_blocks")
def snapshot_blocks(store: SQLStore, run: str, ranks: Sequence[int] | None = None, *, top: int = 20) -> Maybe[pa.Table]:
    """The ``top`` largest active blocks of the CUDA allocator snapshot per rank and device,
    with the size asked for, the segment they sit in and the stack that allocated them
    (``frames``, JSON, innermost first). :class:`Absent` when no snapshot was recorded."""
    ranks_sql, params = _params(run, ranks)
    query = f"""
SELECT * FROM (
  SELECT $run AS run, rank, device, bytes, requested_bytes, addr, segment_addr, segment_type::VARCHAR AS segment_type,
         row_number() OVER (PARTITION BY rank, device ORDER BY bytes DESC, addr) AS size_rank, frames
  FROM memory_snapshot
  WHERE run = $run AND {ranks_sql} AND record = 'block' AND state = 'active_allocated'
) WHERE size_rank <= $top
ORDER BY rank, device, size_rank
"""
    table = store.sql(query, {**params, "top": int(top)})
    if table.num_rows == 0:
        return Absent(NO_SNAPSHOT)
    return table


@dataclass(frozen=True)
class MemoryResult:
    """The ``memory`` section."""

    peaks: pa.Table
    live_at_peak: pa.Table
    roles: Maybe[pa.Table]
    roles_by_step: Maybe[pa.Table]
    snapshot: Maybe[pa.Table]
    snapshot_blocks: Maybe[pa.Table]


def _rows(value: Maybe[pa.Table]) -> object:
    return value if isinstance(value, Absent) else value.to_pylist()


@section("memory", order=60, to_json=lambda r: {
    "peaks": r.peaks.to_pylist(),
    "live_at_peak": r.live_at_peak.to_pylist(),
    "roles": _rows(r.roles),
    "roles_by_step": _rows(r.roles_by_step),
    "snapshot": _rows(r.snapshot),
    "snapshot_blocks": _rows(r.snapshot_blocks),
})
def memory_section(store: SQLStore, run: str, ranks: Sequence[int] | None) -> Maybe[MemoryResult]:
    """Peak allocated/reserved memory per step against the device's capacity, the phase and ops
    at the peak, the largest allocations live at it, roles and the allocator snapshot."""
    peaks = step_peaks(store, run, ranks)
    snapshot = snapshot_summary(store, run, ranks)
    if peaks.num_rows == 0 and isinstance(snapshot, Absent):
        return Absent(NO_MEMORY_EVENTS)
    return MemoryResult(
        peaks=peaks,
        live_at_peak=live_at_peak(store, run, ranks, top=10),
        roles=roles_at_peak(store, run, ranks),
        roles_by_step=role_allocations(store, run, ranks),
        snapshot=snapshot,
        snapshot_blocks=snapshot_blocks(store, run, ranks, top=10),
    )


CAPACITY_PCT_WARN = 90.0
"""A peak above this share of the device's memory leaves no room for a longer sequence, a larger
batch or fragmentation: the next run may run out of memory."""


@rule("memory.near_capacity", needs=("memory",))
def near_capacity_rule(results: Results) -> Iterator[Finding]:
    """Allocated or reserved memory peaks at 90% or more of the device's capacity (at each rank's
    highest step peak; one finding over the ranks where it holds, with the worst peak)."""
    result = results["memory"]
    assert isinstance(result, MemoryResult)
    worst: dict[tuple[int, int | None], dict] = {}
    for row in result.peaks.to_pylist():
        pct = max(row["peak_allocated_pct"] or 0.0, row["peak_reserved_pct"] or 0.0)
        if row["capacity_bytes"] is None or pct < CAPACITY_PCT_WARN:
            continue
        key = (row["rank"], row["device"])
        if key not in worst or pct > worst[key]["pct"]:
            worst[key] = {**row, "pct": pct}
    if not worst:
        return
    row = max(worst.values(), key=lambda r: r["pct"])
    ranks = tuple(sorted({rank for rank, _ in worst}))
    where = f" in {row['phase']}" if row["phase"] and row["phase"] != "other" else ""
    step = f" step {row['step']}" if row["step"] is not None else ""
    yield Finding(
        Severity.WARNING,
        "memory.near_capacity",
        f"{ranks_phrase(ranks)}: memory peaks at {row['peak_allocated_pct']:.0f}% of device capacity allocated, "
        f"{row['peak_reserved_pct']:.0f}% reserved{where} (worst: rank {row['rank']}, GPU {row['device']}{step}, "
        f"{row['peak_allocated_bytes'] / 1024**3:.2f} of {row['capacity_bytes'] / 1024**3:.2f} GiB)",
        {"ranks": list(ranks), "rank": row["rank"], "device": row["device"], "step": row["step"],
         "phase": row["phase"], "peak_allocated_bytes": row["peak_allocated_bytes"],
         "peak_reserved_bytes": row["peak_reserved_bytes"], "capacity_bytes": row["capacity_bytes"],
         "peak_allocated_pct": row["peak_allocated_pct"], "peak_reserved_pct": row["peak_reserved_pct"]},
        ranks=ranks,
    )
