"""Where each step's time goes, per rank: GPU breakdown, host breakdown and HTA-style totals.

Definitions are in docs/ANALYSIS.md; in short:

- A step's window is the TensorBoard profiler plugin's: it starts when the CPU starts the step
  (or when the previous window ends, if later) and ends when both the CPU has finished the step
  and the GPU has finished the work the step launched. So a kernel that runs after its step's
  CPU window still counts for its step, and windows never overlap.
- Inside a window, GPU time is split by TraceLens' ``gpu_timeline`` priority over the unions
  of all streams: compute, then communication not under compute, then copies (H2D, D2H, D2D,
  other) not under either, then memsets, then idle. The parts are disjoint and sum to the
  window's duration exactly (integer ns).
- Idle time is split by HTA's causes, applied to the gaps of the all-streams union.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa

from stepscope.analysis._sql import rank_filter, sql_list, sweep_ctes
from stepscope.analysis.cache import cached_frame
from stepscope.analysis.absent import NO_COMMUNICATION, NO_GPU_EVENTS, NO_STEPS, Absent, Maybe, missing_rank
from stepscope.analysis.matching import collective_ctes, ranks_with_collectives
from stepscope.analysis.parts import (
    COMM_EXPOSED,
    COMMUNICATION_OPS,
    COMPUTE,
    GPU,
    HOST,
    IDLE,
    IDLE_HOST_WAIT,
    IDLE_KERNEL_WAIT,
    IDLE_OTHER,
    PEER_WAITS,
    Breakdown,
    Hidden,
    Part,
)
from stepscope.analysis.sections import SQLStore


GPU_KINDS_SQL = sql_list(GPU.kinds)

KERNEL_WAIT_NS = 30_000
"""HTA's ``consecutive_kernel_delay`` default (30 us): shorter gaps are launch latency."""

# ---- SQL generated from the catalogue (stepscope.analysis.parts) ----


def _ns(expr: str, name: str) -> str:
    return f"coalesce({expr}, 0)::BIGINT AS {name}"


def _class_case(breakdown: Breakdown, *, otherwise: str) -> str:
    """``CASE``: an ``events`` row -> its sweep class number (the first claim it matches)."""
    whens = " ".join(f"WHEN ({claim}) THEN {i}" for i, claim in enumerate(breakdown.classes))
    return f"CASE {whens} ELSE {otherwise} END"


def _active(breakdown: Breakdown, parts: Sequence[Part]) -> str:
    """Filter: a class claimed by one of ``parts`` is active in the segment."""
    ids = [i for p in parts for i in breakdown.class_ids(p)]
    return "(" + " OR ".join(f"n{i} > 0" for i in ids) + ")"


def _exclusive(breakdown: Breakdown, part: Part) -> str:
    """Filter: the segment belongs to ``part``: one of its classes is active and no class of an
    earlier part is; for the last part (it claims nothing), no class at all is active."""
    if not part.claims:
        return "NOT busy"
    earlier = [f"n{i} = 0" for p in breakdown.earlier(part) for i in breakdown.class_ids(p)]
    return " AND ".join([*earlier, _active(breakdown, [part])])


def _hidden(breakdown: Breakdown, hidden: Hidden) -> str:
    """Filter: a class of ``hidden.of`` is active under a class of ``hidden.under``."""
    return f"{_active(breakdown, hidden.under)} AND {_active(breakdown, hidden.of)}"


def _part_sums(breakdown: Breakdown) -> list[str]:
    """``SELECT`` items over the sweep's ``seg``: each part's and each hidden part's time."""
    return [
        *(_ns(f"sum(len) FILTER ({_exclusive(breakdown, p)})", p.column) for p in breakdown.parts),
        *(_ns(f"sum(len) FILTER ({_hidden(breakdown, h)})", h.column) for h in breakdown.hidden),
    ]


# HTA's loader (``Trace._filter_irrelevant_gpu_kernels``, default ``include_last_profiler_step=False``)
# keeps only GPU work whose launch is recorded and started before the last ProfilerStep began,
# and applies this only when the trace has at least two steps.
_HTA_SCOPE = """
    AND (
        (SELECT count(*) FROM steps s WHERE s.run = $run AND s.rank = e.rank) < 2
        OR EXISTS (
            SELECT 1 FROM events r
            WHERE r.run = $run AND r.rank = e.rank AND r.source = e.source
              AND r.correlation = e.correlation AND r.kind IN ('cuda_runtime', 'cuda_driver')
              AND r.ts_ns < (SELECT max(s.start_ns) FROM steps s WHERE s.run = $run AND s.rank = e.rank)
        )
    )"""


def gpu_cte(rf: str, *, hta_scope: bool = False) -> str:
    """``gpu``: every GPU interval of the run with positive duration and its class number.

    GPU work that no part of :data:`stepscope.analysis.parts.GPU` claims is an ingest bug and
    fails the query loudly instead of being counted somewhere. ``hta_scope`` restricts the
    events to those HTA keeps.
    """
    cls = _class_case(GPU, otherwise="error('GPU event with unexpected category ' || coalesce(category, 'NULL'))")
    return f"""
gpu AS MATERIALIZED (
    SELECT rank, source, ts_ns AS t0, ts_ns + dur_ns AS t1, step, correlation,
           {cls} AS cls
    FROM events e
    WHERE run = $run AND kind IN {GPU_KINDS_SQL} AND dur_ns > 0 AND {rf}{_HTA_SCOPE if hta_scope else ""}
)"""


def window_ctes(rf: str) -> str:
    """``win(rank, step, cpu_start, cpu_end, gpu_end, w0, w1)``: the step windows.

    TensorBoard plugin rule: ``w0 = max(cpu_start, previous w1)``,
    ``w1 = max(cpu_end, end of the step's GPU work, w0)``. Unrolled, ``w1`` is the running
    maximum of ``reach = max(cpu_end, gpu_end)`` over the rank's steps so far, and ``w0`` is
    ``max(cpu_start, running max before this step)``: window functions, no recursion.
    """
    return f"""
_cpu_steps AS (
    SELECT rank, step, start_ns AS cpu_start, end_ns AS cpu_end
    FROM steps WHERE run = $run AND {rf}
),
_gpu_step_end AS (
    SELECT rank, step, max(t1) AS gpu_end FROM gpu WHERE step IS NOT NULL GROUP BY rank, step
),
_reach AS (
    SELECT c.*, g.gpu_end, greatest(c.cpu_end, coalesce(g.gpu_end, c.cpu_end)) AS reach
    FROM _cpu_steps c LEFT JOIN _gpu_step_end g USING (rank, step)
),
win AS MATERIALIZED (
    SELECT rank, step, cpu_start, cpu_end, gpu_end,
           greatest(cpu_start, coalesce(max(reach) OVER before, cpu_start)) AS w0,
           max(reach) OVER upto AS w1
    FROM _reach
    WINDOW before AS (PARTITION BY rank ORDER BY cpu_start, step
                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
           upto AS (PARTITION BY rank ORDER BY cpu_start, step ROWS UNBOUNDED PRECEDING)
)"""


def _run(store: SQLStore, query: str, run: str, extra: dict[str, object]) -> pa.Table:
    return store.sql(query, {"run": run, **extra})


@cached_frame("rank_status")
def rank_status(store: SQLStore, run: str) -> pa.Table:
    """One row per rank of ``run``: ``rank, sources, steps, gpu_events`` (true counts).

    The summary turns zero counts into absence reasons; the counts themselves are facts.
    """
    return _run(
        store,
        f"""
        WITH r AS (SELECT rank, count(*) AS sources FROM sources WHERE run = $run GROUP BY rank),
             s AS (SELECT rank, count(*) AS steps FROM steps WHERE run = $run GROUP BY rank),
             g AS (SELECT rank, count(*) AS gpu_events FROM events
                   WHERE run = $run AND kind IN {GPU_KINDS_SQL} AND dur_ns > 0 GROUP BY rank)
        SELECT r.rank, r.sources, coalesce(s.steps, 0) AS steps, coalesce(g.gpu_events, 0) AS gpu_events
        FROM r LEFT JOIN s USING (rank) LEFT JOIN g USING (rank) ORDER BY r.rank
        """,
        run,
        {},
    )


def absence(status: pa.Table, rank: int, *, needs_steps: bool, needs_gpu: bool) -> str | None:
    """Why a figure of ``rank`` cannot be computed from ``status`` (:func:`rank_status`), or None."""
    ranks = status.column("rank").to_pylist()
    if rank not in ranks:
        return missing_rank(rank, ranks)
    row = ranks.index(rank)
    if needs_steps and status.column("steps")[row].as_py() == 0:
        return NO_STEPS
    if needs_gpu and status.column("gpu_events")[row].as_py() == 0:
        return NO_GPU_EVENTS
    return None


def _absent_for(store: SQLStore, run: str, ranks: Sequence[int] | None, *, needs_gpu: bool) -> Absent:
    """The most specific reason an empty result has (first requested rank that lacks data)."""
    status = rank_status(store, run)
    wanted = list(ranks) if ranks is not None else status.column("rank").to_pylist()
    for rank in wanted:
        reason = absence(status, rank, needs_steps=True, needs_gpu=needs_gpu)
        if reason:
            return Absent(reason if len(wanted) == 1 else f"rank {rank}: {reason}")
    return Absent(f"run {run!r} has no traces")


# ---- sub-parts: how a part is split after the sweep ----

_IDLE_CAUSE_RULES: dict[Part, str] = {
    IDLE_HOST_WAIT: "g.g0 IS NULL OR g.g1 IS NULL OR l.launch_ns > g.g0",
    IDLE_KERNEL_WAIT: f"g.g1 - g.g0 < {KERNEL_WAIT_NS}",
    IDLE_OTHER: "TRUE",
}
"""HTA's idle causes, in order: the first that holds for a gap ``[g0, g1)`` of the rank's GPU
time line (``l.launch_ns``: when the work ending the gap was launched) names the gap's cause."""


def _idle_split() -> str:
    """CTEs ending in ``_split_idle(rank, step, <idle sub-part columns>)``: every gap between the
    rank's GPU work (unclipped by windows) gets its cause, then is clipped to the step windows."""
    if set(_IDLE_CAUSE_RULES) != set(IDLE.sub_parts):
        raise ValueError("the idle-cause rules and the sub-parts of stepscope.analysis.parts.IDLE differ")
    causes = " ".join(f"WHEN ({rule}) THEN '{cause.name}'" for cause, rule in _IDLE_CAUSE_RULES.items())
    return f"""
    _launch AS (
        SELECT g.rank, g.t0, min(r.ts_ns) AS launch_ns
        FROM gpu g JOIN events r
          ON r.run = $run AND r.rank = g.rank AND r.source = g.source
         AND r.correlation = g.correlation AND r.kind IN ('cuda_runtime', 'cuda_driver')
        GROUP BY g.rank, g.t0
    ),
    _prev_ord AS (SELECT rank, t0, t1 FROM gpu ORDER BY rank, t0, t1),
    _prev_run AS (
        -- (rank, end) packed as rank * 2^64 + end: one integer running max orders by rank first
        SELECT rank, t0, max((rank::HUGEINT << 64) + t1) OVER (ROWS UNBOUNDED PRECEDING) AS upto
        FROM _prev_ord
    ),
    _prev AS (
        -- end of all earlier work on the rank: one sorted streaming pass over all ranks; the
        -- packed maximum belongs to the current rank as soon as the rank has a row
        SELECT rank, t0,
            CASE WHEN (lag(upto) OVER ()) >> 64 = rank THEN ((lag(upto) OVER ()) & 18446744073709551615)::BIGINT END
                AS prev_end
        FROM _prev_run
    ),
    _gaps AS (
        SELECT DISTINCT rank, prev_end AS g0, t0 AS g1 FROM _prev WHERE prev_end IS NULL OR t0 > prev_end
        UNION ALL
        SELECT rank, max(t1), NULL FROM gpu GROUP BY rank
    ),
    _caused AS (
        SELECT g.rank, g.g0, g.g1,
            CASE {causes} END AS idle_cause
        FROM _gaps g LEFT JOIN _launch l ON l.rank = g.rank AND l.t0 = g.g1
    ),
    _idle AS (
        SELECT w.rank, w.step, c.idle_cause,
               least(coalesce(c.g1, w.w1), w.w1) - greatest(coalesce(c.g0, w.w0), w.w0) AS len
        FROM _caused c JOIN win w
          ON c.rank = w.rank AND coalesce(c.g0, w.w0) < w.w1 AND coalesce(c.g1, w.w1) > w.w0
    ),
    _split_{IDLE.name} AS (
        SELECT rank, step,
            {", ".join(_ns(f"sum(len) FILTER (idle_cause = '{c.name}')", c.column) for c in IDLE.sub_parts)}
        FROM _idle GROUP BY rank, step
    )"""


def _no_wait_split(part: Part) -> str:
    """The split when no collective can be matched (fewer than two ranks with collectives): no
    wait is known, all of the part is the rest."""
    wait, transfer = part.sub_parts
    return f"""
    _split_{part.name} AS (
        SELECT rank, step, 0::BIGINT AS {wait.column}, {_ns(part.column, transfer.column)} FROM _parts
    )"""


def _wait_split(breakdown: Breakdown, part: Part, *, host_side: bool) -> Callable[[], str]:
    """The split of an exposed-communication part into waiting for peers and the rest.

    CTEs ending in ``_split_<part>(rank, step, <wait column>, <transfer column>)``: every
    collective member's wait ``[ts, ts + wait_ns)`` (:mod:`stepscope.analysis.matching`, over
    all ranks of the run: its peers may not be among the ranks asked for), merged per rank,
    clipped to the segments of the sweep that belong to ``part`` (wait under compute is not
    exposed); the transfer is the part's time minus that, so the two sum to it exactly.
    ``host_side`` picks gloo's host-side transfers (host breakdown) or kernels (GPU).
    """
    wait, transfer = part.sub_parts

    def ctes() -> str:
        return f"""
    {collective_ctes()},
    _wait_iv AS (
        SELECT rank, ts_ns AS t0, ts_ns + wait_ns AS t1 FROM coll
        WHERE {"" if host_side else "NOT "}host_side AND wait_ns > 0 AND rank IN (SELECT rank FROM win)
    ),
    _wait_prev AS (
        SELECT *, max(t1) OVER (PARTITION BY rank ORDER BY t0, t1 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                  AS prev_end
        FROM _wait_iv
    ),
    _wait_islands AS (
        SELECT rank, min(t0) AS t0, max(t1) AS t1
        FROM (SELECT *, sum(CASE WHEN prev_end IS NULL OR t0 > prev_end THEN 1 ELSE 0 END)
                          OVER (PARTITION BY rank ORDER BY t0, t1 ROWS UNBOUNDED PRECEDING) AS island
              FROM _wait_prev)
        GROUP BY rank, island
    ),
    _wait_len AS (
        SELECT s.rank, s.step, sum(least(s.s1, w.t1) - greatest(s.s0, w.t0)) AS len
        FROM seg s JOIN _wait_islands w ON s.rank = w.rank AND s.s0 < w.t1 AND s.s1 > w.t0
        WHERE {_exclusive(breakdown, part)}
        GROUP BY s.rank, s.step
    ),
    _split_{part.name} AS (
        SELECT p.rank, p.step, {_ns("w.len", wait.column)},
               {_ns(f"p.{part.column} - coalesce(w.len, 0)", transfer.column)}
        FROM _parts p LEFT JOIN _wait_len w USING (rank, step)
    )"""

    return ctes


SPLITS: dict[Part, Callable[[], str]] = {
    IDLE: _idle_split,
    COMM_EXPOSED: _wait_split(GPU, COMM_EXPOSED, host_side=False),
    COMMUNICATION_OPS: _wait_split(HOST, COMMUNICATION_OPS, host_side=True),
}
"""Part -> the CTEs that split it into its sub-parts after the sweep. They may read ``win``,
``seg``, ``_parts`` (the parts' sums per rank and step), ``events`` and, for GPU parts, ``gpu``,
and end in ``_split_<part name>(rank, step, <sub-part columns>)``; :func:`step_breakdown` and
:func:`host_breakdown` join that into their result (a part with sub-parts and no entry here is a
``KeyError``)."""


def _split_sql(breakdown: Breakdown, matched: bool = True) -> tuple[str, list[str], str]:
    """For a breakdown's parts with sub-parts: the split CTEs (each preceded by a comma, to follow
    ``_parts``), the sub-part columns to select, and the joins that bring them in. ``matched``
    False: no collective can be matched in the run, so the waits' splits are the trivial one."""
    split = [p for p in breakdown.parts if p.sub_parts]
    ctes = "".join("," + (SPLITS[p]() if matched or not any(s in PEER_WAITS for s in p.sub_parts)
                          else _no_wait_split(p)) for p in split)
    columns = [f"coalesce(_split_{p.name}.{c.column}, 0)::BIGINT AS {c.column}" for p in split for c in p.sub_parts]
    joins = " ".join(f"LEFT JOIN _split_{p.name} USING (rank, step)" for p in split)
    return ctes, columns, joins


def _iv_ctes(breakdown: Breakdown, rf: str) -> str:
    """The sweep's intervals ``iv(rank, t0, t1, cls)`` of a breakdown (and, for the GPU, ``gpu``)."""
    if breakdown is GPU:
        return f"{gpu_cte(rf)}, iv AS (SELECT rank, t0, t1, cls FROM gpu)"
    claimed = " OR ".join(f"({claim})" for claim in breakdown.classes)
    return f"""
    iv AS (
        SELECT rank, ts_ns AS t0, ts_ns + dur_ns AS t1, {_class_case(breakdown, otherwise="NULL")} AS cls
        FROM events
        WHERE run = $run AND {rf} AND dur_ns > 0 AND kind IN {sql_list(breakdown.kinds)} AND ({claimed})
    )"""


def _parts_query(breakdown: Breakdown, rf: str, win: str, select: str, where: str = "TRUE",
                 matched: bool = True) -> str:
    """The breakdown of every window of ``win`` (CTEs defining ``win(rank, step, w0, w1, ...)``,
    disjoint per rank; they may read ``gpu``): ``SELECT <select>, <every column of the
    breakdown> FROM win w ... WHERE <where>``. One generator for the step breakdowns and for
    arbitrary windows (:func:`parts_over`), so both split time by the same rules."""
    split_ctes, split_columns, split_joins = _split_sql(breakdown, matched)
    names = [e.column for e in (*breakdown.parts, *breakdown.hidden)]
    columns = [*(f"coalesce(p.{c}, 0)::BIGINT AS {c}" for c in names), *split_columns]
    return f"""
    WITH {_iv_ctes(breakdown, rf)},
    {win},
    {sweep_ctes(len(breakdown.classes))},
    _parts AS (SELECT rank, step, {", ".join(_part_sums(breakdown))} FROM seg GROUP BY rank, step){split_ctes}
    SELECT {select}, {", ".join(columns)}
    FROM win w LEFT JOIN _parts p USING (rank, step)
    {split_joins}
    WHERE {where}
    ORDER BY w.rank, w.step
    """


@cached_frame("step_breakdown")
def step_breakdown(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[pa.Table]:
    """GPU time of every step of every rank with GPU events, split into disjoint parts.

    Columns: ``run, rank, step, start_ns, end_ns, dur_ns`` (the step window), ``cpu_start_ns,
    cpu_dur_ns`` (the ProfilerStep CPU window), then ``GPU.all_columns`` of
    :mod:`stepscope.analysis.parts`: the parts (summing to ``dur_ns``), the hidden parts
    (communication under compute, copies under compute or communication) and the sub-parts
    (exposed communication: waiting for peers and transfer; idle: HTA's idle causes), summing
    to their part.
    Ranks without GPU events or steps have no rows; :class:`Absent` when no rank has any.
    """
    rf, extra = rank_filter(ranks)
    query = _parts_query(
        GPU, rf, window_ctes(rf),
        "$run AS run, w.rank, w.step, w.w0 AS start_ns, w.w1 AS end_ns, w.w1 - w.w0 AS dur_ns, "
        "w.cpu_start AS cpu_start_ns, w.cpu_end - w.cpu_start AS cpu_dur_ns",
        "w.rank IN (SELECT DISTINCT rank FROM gpu)", ranks_with_collectives(store, run) >= 2)
    table = _run(store, query, run, extra)
    if table.num_rows == 0:
        return _absent_for(store, run, ranks, needs_gpu=True)
    return table


@cached_frame("step_windows")
def step_windows(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """The step windows alone: ``run, rank, step, cpu_start_ns, cpu_end_ns, gpu_end_ns,
    start_ns, end_ns, dur_ns`` (``gpu_end_ns`` null when the step launched no GPU work)."""
    rf, extra = rank_filter(ranks)
    query = f"""
    WITH {gpu_cte(rf)}, {window_ctes(rf)}
    SELECT $run AS run, rank, step, cpu_start AS cpu_start_ns, cpu_end AS cpu_end_ns,
           gpu_end AS gpu_end_ns, w0 AS start_ns, w1 AS end_ns, w1 - w0 AS dur_ns
    FROM win ORDER BY rank, step
    """
    return _run(store, query, run, extra)


@cached_frame("host_breakdown")
def host_breakdown(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[pa.Table]:
    """Host (CPU) time of every step, split into disjoint parts over all the rank's threads.

    Window: the ProfilerStep CPU window. The parts are those of
    :data:`stepscope.analysis.parts.HOST`, in its priority order (data loading, optimizer,
    blocked in synchronisation, compute ops, communication ops not under any of those: exposed
    host communication, split into waiting for peers and the rest; other: none of these active
    on any thread). Columns: ``run, rank, step, start_ns, end_ns, dur_ns``, then
    ``HOST.all_columns`` (the parts, summing to ``dur_ns``, the hidden parts: communication
    under compute ops, and the sub-parts).
    """
    rf, extra = rank_filter(ranks)
    win = f"win AS MATERIALIZED (SELECT rank, step, start_ns AS w0, end_ns AS w1 FROM steps WHERE run = $run AND {rf})"
    query = _parts_query(
        HOST, rf, win, "$run AS run, w.rank, w.step, w.w0 AS start_ns, w.w1 AS end_ns, w.w1 - w.w0 AS dur_ns",
        matched=ranks_with_collectives(store, run) >= 2)
    table = _run(store, query, run, extra)
    if table.num_rows == 0:
        return _absent_for(store, run, ranks, needs_gpu=False)
    return table


def parts_over(store: SQLStore, run: str, breakdown: Breakdown,
               windows: Sequence[tuple[int, int, int, int]]) -> pa.Table:
    """The breakdown (:data:`GPU` or :data:`HOST`) of arbitrary windows ``(rank, key, w0, w1)``,
    disjoint per rank and keys unique per rank, e.g. from a step's start to a collective's start.

    Columns: ``rank, key, w0, w1``, then ``breakdown.all_columns`` (the parts sum to ``w1 - w0``).
    The same SQL as the step breakdowns, over other windows.
    """
    if not windows:
        return pa.table({"rank": pa.array([], pa.int64())})
    ranks = sorted({int(w[0]) for w in windows})
    rf, extra = rank_filter(ranks)
    values = ", ".join(f"({int(r)}, {int(k)}, {int(a)}, {int(b)})" for r, k, a, b in windows)
    win = f"win AS MATERIALIZED (SELECT * FROM (VALUES {values}) AS t(rank, step, w0, w1))"
    return _run(store, _parts_query(breakdown, rf, win, "w.rank, w.step AS key, w.w0, w.w1",
                                    matched=ranks_with_collectives(store, run) >= 2), run, extra)


@cached_frame("rank_totals")
def rank_totals(
    store: SQLStore, run: str, ranks: Sequence[int] | None = None, *, hta_scope: bool = False
) -> pa.Table:
    """Whole-trace GPU totals per rank with HTA's temporal-breakdown definitions.

    ``gpu_span_ns`` = end of the last GPU event - start of the first; ``gpu_busy_ns`` =
    |U(all GPU events)|; ``gpu_idle_ns`` = span - busy; ``compute_ns`` = |U(compute)|;
    ``non_compute_ns`` = span - compute - idle; ``comm_ns`` = |U(communication)|;
    ``comm_comp_overlap_ns`` = |U(compute) ∩ U(communication)|; ``comm_comp_overlap_pct`` =
    100 * overlap / comm. One row per rank of the run; GPU figures are null on ranks without
    GPU events (``absent_reason`` says so), the overlap also on ranks without communication.

    By default every GPU event of the trace counts. ``hta_scope=True`` counts only the events
    HTA's loader keeps (work whose launch is recorded and began before the last step started,
    when there are two steps or more), to compare with HTA number for number; see
    docs/ANALYSIS.md for why that is not the default.
    """
    rf, extra = rank_filter(ranks)
    compute, comm = _active(GPU, [COMPUTE]), _active(GPU, [COMM_EXPOSED])  # |U(compute)|, |U(communication)|
    query = f"""
    WITH {gpu_cte(rf, hta_scope=hta_scope)},
    win AS (SELECT rank, 0 AS step, min(t0) AS w0, max(t1) AS w1 FROM gpu GROUP BY rank),
    iv AS (SELECT rank, t0, t1, cls FROM gpu),
    {sweep_ctes(len(GPU.classes))},
    _tot AS (
        SELECT rank,
            {_ns("sum(len) FILTER (busy)", "gpu_busy_ns")},
            {_ns(f"sum(len) FILTER ({compute})", "compute_ns")},
            {_ns(f"sum(len) FILTER ({comm})", "comm_ns")},
            {_ns(f"sum(len) FILTER ({compute} AND {comm})", "comm_comp_overlap_ns")}
        FROM seg GROUP BY rank
    ),
    _ranks AS (SELECT DISTINCT rank FROM sources WHERE run = $run AND {rf})
    SELECT $run AS run, r.rank,
        w.w1 - w.w0 AS gpu_span_ns,
        t.gpu_busy_ns,
        w.w1 - w.w0 - t.gpu_busy_ns AS gpu_idle_ns,
        t.compute_ns,
        t.gpu_busy_ns - t.compute_ns AS non_compute_ns,
        t.comm_ns,
        t.comm_comp_overlap_ns,
        CASE WHEN t.comm_ns > 0 THEN 100.0 * t.comm_comp_overlap_ns / t.comm_ns END AS comm_comp_overlap_pct,
        CASE WHEN w.rank IS NULL THEN $no_gpu END AS absent_reason,
        CASE WHEN w.rank IS NULL THEN $no_gpu WHEN t.comm_ns = 0 THEN $no_comm END AS overlap_absent_reason
    FROM _ranks r LEFT JOIN win w USING (rank) LEFT JOIN _tot t USING (rank)
    ORDER BY r.rank
    """
    return _run(store, query, run, {**extra, "no_gpu": NO_GPU_EVENTS, "no_comm": NO_COMMUNICATION})
