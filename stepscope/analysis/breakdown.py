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

What one rank's events decide (each step's parts, hidden parts and idle causes, and where its
exposed communication lies) is computed when its trace is ingested
(:mod:`stepscope.store.rankstats.breakdown`, tables ``rank_step_gpu``, ``rank_step_host``,
``rank_comm_spans``); the step breakdowns read those and add the one cross-rank split, exposed
communication into waiting for peers and transfer. :func:`parts_over` splits arbitrary windows
by the time lines stored at ingest (:mod:`stepscope.store.rankstats.segments`, ``rank_segments``),
:func:`step_windows` reads ``rank_step_windows``. :func:`_parts_query`, the same split as SQL
over the events, is what the tests check the stored tables against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa

from stepscope.analysis._sql import rank_filter, sweep_ctes
from stepscope.analysis.absent import NO_COMMUNICATION, NO_GPU_EVENTS, NO_STEPS, Absent, Maybe, missing_rank
from stepscope.analysis.cache import cached_frame
from stepscope.analysis.matching import collective_ctes, matched_ctes, ranks_with_collectives
from stepscope.analysis.sections import SQLStore
from stepscope.store.rankstats.breakdown import (
    RANK_SPLITS,
    WINDOW_COLUMNS,
    iv_ctes,
    ns_column,
    part_sums,
    spans_of,
    stored_columns,
)
from stepscope.store.rankstats.parts import COMM_EXPOSED, COMMUNICATION_OPS, GPU, HOST, PEER_WAITS, Breakdown, Part
from stepscope.store.rankstats.segments import REMAINDER, STORED


def _run(store: SQLStore, query: str, run: str, extra: dict[str, object]) -> pa.Table:
    """Run a breakdown query; the cross-rank matching its wait splits inline
    (:func:`~stepscope.analysis.matching.collective_ctes`) is read from the store's table of it
    instead, matched once per open store (:func:`~stepscope.analysis.matching.matched_ctes`)."""
    return store.sql(query.replace(collective_ctes(), matched_ctes(store, run)), {"run": run, **extra})


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
             g AS (SELECT rank, sum(gpu_events)::BIGINT AS gpu_events FROM rank_gpu_totals
                   WHERE run = $run AND scope = 'all' GROUP BY rank)
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

def _no_wait_split(part: Part) -> str:
    """The split when no collective can be matched (fewer than two ranks with collectives): no
    wait is known, all of the part is the rest."""
    wait, transfer = part.sub_parts
    return f"""
    _split_{part.name} AS (
        SELECT rank, step, 0::BIGINT AS {wait.column}, {ns_column(part.column, transfer.column)} FROM _parts
    )"""


def wait_island_ctes(host_side: bool, windows: str) -> str:
    """CTEs ending in ``_wait_islands(rank, t0, t1)``: the waits ``[ts, ts + wait)`` of the
    matched collective members of ``coll`` (:func:`stepscope.analysis.matching.collective_ctes`)
    on the host side (gloo) or the GPU's, of the ranks of ``windows``, merged per rank into
    disjoint islands (touching waits merge)."""
    return f"""
    _wait_iv AS (
        SELECT rank, ts_ns AS t0, ts_ns + wait_ns AS t1 FROM coll
        WHERE {"" if host_side else "NOT "}host_side AND wait_ns > 0 AND rank IN (SELECT rank FROM {windows})
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
    )"""


def _wait_split(part: Part, *, host_side: bool) -> Callable[[], str]:
    """The split of an exposed-communication part into waiting for peers and the rest.

    CTEs ending in ``_split_<part>(rank, step, <wait column>, <transfer column>)``: every
    collective member's wait ``[ts, ts + wait_ns)`` (:mod:`stepscope.analysis.matching`, over
    all ranks of the run: its peers may not be among the ranks asked for), merged per rank,
    clipped to the stretches where ``part`` holds (``_spans_<part>``: wait under compute is not
    exposed); the transfer is the part's time minus that, so the two sum to it exactly.
    ``host_side`` picks gloo's host-side transfers (host breakdown) or kernels (GPU).
    """
    wait, transfer = part.sub_parts

    def ctes() -> str:
        return f"""
    {collective_ctes()},
    {wait_island_ctes(host_side, "win")},
    _wait_len AS (
        SELECT s.rank, s.step, sum(least(s.s1, w.t1) - greatest(s.s0, w.t0)) AS len
        FROM _spans_{part.name} s JOIN _wait_islands w ON s.rank = w.rank AND s.s0 < w.t1 AND s.s1 > w.t0
        GROUP BY s.rank, s.step
    ),
    _split_{part.name} AS (
        SELECT p.rank, p.step, {ns_column("w.len", wait.column)},
               {ns_column(f"p.{part.column} - coalesce(w.len, 0)", transfer.column)}
        FROM _parts p LEFT JOIN _wait_len w USING (rank, step)
    )"""

    return ctes


WAIT_SPLITS: dict[Part, Callable[[], str]] = {
    COMM_EXPOSED: _wait_split(COMM_EXPOSED, host_side=False),
    COMMUNICATION_OPS: _wait_split(COMMUNICATION_OPS, host_side=True),
}
"""Part -> the CTEs that split it into waiting for peers and the rest, from the collectives
matched across ranks. They read ``win``, ``_parts`` (the parts per rank and step),
``_spans_<part>`` and the events, and end in ``_split_<part name>(rank, step, <sub-part
columns>)``."""

SPLITS: dict[Part, Callable[[], str]] = {**RANK_SPLITS, **WAIT_SPLITS}
"""Every part with sub-parts -> the CTEs that split it after the sweep: the rank's own
(:data:`stepscope.store.rankstats.breakdown.RANK_SPLITS`, stored at ingest) and the cross-rank
ones. :func:`step_breakdown` and :func:`host_breakdown` join them into their result (a part
with sub-parts and no entry here is a ``KeyError``)."""


def _split_sql(split: Sequence[Part], matched: bool = True) -> tuple[str, dict[str, str], str]:
    """For parts with sub-parts: the split CTEs (each preceded by a comma, to follow ``_parts``),
    each sub-part column -> its SQL, and the joins that bring them in. ``matched`` False: no
    collective can be matched in the run, so the waits' splits are the trivial one."""
    ctes = "".join("," + (SPLITS[p]() if matched or not any(s in PEER_WAITS for s in p.sub_parts)
                          else _no_wait_split(p)) for p in split)
    columns = {c.column: f"_split_{p.name}.{c.column}" for p in split for c in p.sub_parts}
    joins = " ".join(f"LEFT JOIN _split_{p.name} USING (rank, step)" for p in split)
    return ctes, columns, joins


def _spans(breakdown: Breakdown) -> list[str]:
    """The parts of ``breakdown`` whose time line the wait splits read (``_spans_<part>``)."""
    return [p for p in breakdown.parts if p in WAIT_SPLITS]


def _parts_query(breakdown: Breakdown, rf: str, win: str, select: str, where: str = "TRUE",
                 matched: bool = True) -> str:
    """The breakdown of every window of ``win`` (CTEs defining ``win(rank, step, w0, w1, ...)``,
    disjoint per rank; they may read ``gpu``): ``SELECT <select>, <every column of the
    breakdown> FROM win w ... WHERE <where>``, swept over the events. The analyses read the
    tables written at ingest instead (:func:`_stored_query`, :func:`_segments_query`); this is
    the independent reference the tests hold those to (tests/test_rankstats.py,
    tests/test_rankstats_timeline.py), over the step windows and over arbitrary ones."""
    split_ctes, split_columns, split_joins = _split_sql([p for p in breakdown.parts if p.sub_parts], matched)
    columns = [f"coalesce({split_columns.get(c, 'p.' + c)}, 0)::BIGINT AS {c}" for c in breakdown.all_columns]
    spans = "".join(f", {spans_of(p)}" for p in _spans(breakdown))
    return f"""
    WITH {iv_ctes(breakdown, rf)},
    {win},
    {sweep_ctes(len(breakdown.classes))}{spans},
    _parts AS (SELECT rank, step, {", ".join(part_sums(breakdown))} FROM seg GROUP BY rank, step){split_ctes}
    SELECT {select}, {", ".join(columns)}
    FROM win w LEFT JOIN _parts p USING (rank, step)
    {split_joins}
    WHERE {where}
    ORDER BY w.rank, w.step
    """


def _stored_query(breakdown: Breakdown, rf: str, matched: bool) -> str:
    """The breakdown of every step from the per-rank tables written at ingest
    (``rank_step_<name>``, ``rank_comm_spans``), with the cross-rank wait splits added: the same
    columns as :func:`_parts_query` gives over the step windows, without reading the events."""
    split_ctes, split_columns, split_joins = _split_sql(_spans(breakdown), matched)
    spans = "".join(f", _spans_{p.name} AS (SELECT rank, step, s0, s1 FROM rank_comm_spans "
                    f"WHERE run = $run AND {rf} AND part = '{p.name}')" for p in _spans(breakdown))
    stored = set(stored_columns(breakdown))
    columns = [f"p.{c}" if c in stored else f"coalesce({split_columns[c]}, 0)::BIGINT AS {c}"
               for c in breakdown.all_columns]
    windows = [f"p.{name}" for name, _ in WINDOW_COLUMNS[breakdown]]
    return f"""
    WITH _parts AS (SELECT * FROM rank_step_{breakdown.name} WHERE run = $run AND {rf}),
    win AS (SELECT rank, step FROM _parts){spans}{split_ctes}
    SELECT $run AS run, p.rank, p.step, {", ".join(windows)}, {", ".join(columns)}
    FROM _parts p {split_joins}
    ORDER BY p.rank, p.step
    """


@cached_frame("step_breakdown")
def step_breakdown(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[pa.Table]:
    """GPU time of every step of every rank with GPU events, split into disjoint parts.

    Columns: ``run, rank, step, start_ns, end_ns, dur_ns`` (the step window), ``cpu_start_ns,
    cpu_dur_ns`` (the ProfilerStep CPU window), then ``GPU.all_columns`` of
    :mod:`stepscope.store.rankstats.parts`: the parts (summing to ``dur_ns``), the hidden parts
    (communication under compute, copies under compute or communication) and the sub-parts
    (exposed communication: waiting for peers and transfer; idle: HTA's idle causes), summing
    to their part.
    Ranks without GPU events or steps have no rows; :class:`Absent` when no rank has any.
    """
    rf, extra = rank_filter(ranks)
    table = _run(store, _stored_query(GPU, rf, ranks_with_collectives(store, run) >= 2), run, extra)
    if table.num_rows == 0:
        return _absent_for(store, run, ranks, needs_gpu=True)
    return table


@cached_frame("step_windows")
def step_windows(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """The step windows alone: ``run, rank, step, cpu_start_ns, cpu_end_ns, gpu_end_ns,
    start_ns, end_ns, dur_ns`` (``gpu_end_ns`` null when the step launched no GPU work), on every
    rank with steps, GPU work or not.

    Read from ``rank_step_windows`` (computed per trace at ingest). A rank with several traces
    gets each trace's windows: the same as one pass over the rank's steps, since its traces
    never overlap in time (a window starts no earlier than the previous one's reach)."""
    rf, extra = rank_filter(ranks)
    query = f"""
    SELECT $run AS run, rank, step, cpu_start_ns, cpu_end_ns, gpu_end_ns, start_ns, end_ns,
           end_ns - start_ns AS dur_ns
    FROM rank_step_windows WHERE run = $run AND {rf} ORDER BY rank, step
    """
    return _run(store, query, run, extra)


@cached_frame("host_breakdown")
def host_breakdown(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[pa.Table]:
    """Host (CPU) time of every step, split into disjoint parts over all the rank's threads.

    Window: the ProfilerStep CPU window (one that starts before the previous ended starts where
    it ended: :func:`stepscope.store.rankstats.breakdown.step_window_ctes`). The parts are those of
    :data:`stepscope.store.rankstats.parts.HOST`, in its priority order (data loading, optimizer,
    blocked in synchronisation, compute ops, communication ops not under any of those: exposed
    host communication, split into waiting for peers and the rest; other: none of these active
    on any thread). Columns: ``run, rank, step, start_ns, end_ns, dur_ns``, then
    ``HOST.all_columns`` (the parts, summing to ``dur_ns``, the hidden parts: communication
    under compute ops, and the sub-parts).
    """
    rf, extra = rank_filter(ranks)
    table = _run(store, _stored_query(HOST, rf, ranks_with_collectives(store, run) >= 2), run, extra)
    if table.num_rows == 0:
        return _absent_for(store, run, ranks, needs_gpu=False)
    return table


def segment_cuts(breakdown: Breakdown, rf: str, windows: str = "win") -> str:
    """CTE ``_cut(rank, step, part, s0, s1)``: the stretches of ``rank_segments`` (``part``: an
    entry of :data:`stepscope.store.rankstats.segments.STORED`) of ``breakdown`` clipped to each
    window of ``windows(rank, step, w0, w1)``. Not materialised where a query reads it twice
    (the sums, the spans of one part): materialised, every clipped stretch was copied with its
    part's text, and reading the stretches again for the one part costs less (a 64-rank step
    breakdown: 0.43-0.47 -> 0.38 s of CPU, half the peak memory)."""
    return f"""
    _cut AS NOT MATERIALIZED (
        SELECT w.rank, w.step, s.part, greatest(s.s0, w.w0) AS s0, least(s.s1, w.w1) AS s1
        FROM {windows} w
        JOIN (SELECT rank, part, s0, s1 FROM rank_segments
              WHERE run = $run AND {rf} AND breakdown = '{breakdown.name}') s
          ON s.rank = w.rank AND s.s0 < w.w1 AND s.s1 > w.w0 AND w.w0 < w.w1
    )"""


def _segments_query(breakdown: Breakdown, rf: str, win: str, matched: bool) -> str:
    """The breakdown of every window of ``win`` from the stretches stored at ingest
    (``rank_segments``), with the cross-rank wait splits added: the same columns and values as
    :func:`_parts_query` gives over the events. Each window's stored stretches are clipped to it
    and summed per entry; the last part (idle, other) is the rest of the window, and a part's
    :data:`~stepscope.store.rankstats.segments.REMAINDER` sub-part (host wait) the rest of that
    part on a rank with GPU work (none is known on a rank without: zero, as over the events)."""
    last = breakdown.parts[-1]
    entries = STORED[breakdown]
    sums = ", ".join(f"sum(s1 - s0) FILTER (part = '{e.name}') AS {e.column}" for e in entries)
    claimed = " + ".join(f"coalesce(s.{p.column}, 0)" for p in breakdown.parts[:-1])
    rest = f"w.w1 - w.w0 - ({claimed})"
    columns = [f"coalesce(s.{e.column}, 0)::BIGINT AS {e.column}" for e in entries]
    columns.append(f"({rest})::BIGINT AS {last.column}")
    gpu_ranks = ""
    for part, remainder in REMAINDER.items():
        if part not in breakdown.parts:
            continue
        others = " + ".join(f"coalesce(s.{c.column}, 0)" for c in part.sub_parts if c is not remainder)
        part_ns = rest if part is last else f"coalesce(s.{part.column}, 0)"
        gpu_ranks = (", _gpu_ranks AS (SELECT DISTINCT rank FROM rank_gpu_totals "
                     f"WHERE run = $run AND scope = 'all' AND {rf})")
        columns.append(f"(CASE WHEN w.rank IN (SELECT rank FROM _gpu_ranks) THEN {part_ns} - ({others}) ELSE 0 END)"
                       f"::BIGINT AS {remainder.column}")
    split_ctes, split_columns, split_joins = _split_sql(_spans(breakdown), matched)
    spans = "".join(f", _spans_{p.name} AS (SELECT rank, step, s0, s1 FROM _cut WHERE part = '{p.name}')"
                    for p in _spans(breakdown))
    selected = [f"coalesce({split_columns.get(c, 'p.' + c)}, 0)::BIGINT AS {c}" for c in breakdown.all_columns]
    return f"""
    WITH {win},
    {segment_cuts(breakdown, rf)},
    _sums AS (SELECT rank, step, {sums} FROM _cut GROUP BY rank, step){gpu_ranks},
    _parts AS (SELECT w.rank, w.step, {", ".join(columns)} FROM win w LEFT JOIN _sums s USING (rank, step)){spans}
    {split_ctes}
    SELECT w.rank, w.step AS key, w.w0, w.w1, {", ".join(selected)}
    FROM win w LEFT JOIN _parts p USING (rank, step)
    {split_joins}
    ORDER BY w.rank, w.step
    """


def parts_over(store: SQLStore, run: str, breakdown: Breakdown,
               windows: Sequence[tuple[int, int, int, int]]) -> pa.Table:
    """The breakdown (:data:`GPU` or :data:`HOST`) of arbitrary windows ``(rank, key, w0, w1)``,
    disjoint per rank and keys unique per rank, e.g. from a step's start to a collective's start.

    Columns: ``rank, key, w0, w1``, then ``breakdown.all_columns`` (the parts sum to ``w1 - w0``).
    Read from the time lines stored at ingest (``rank_segments``: :func:`_segments_query`),
    with the same values as the step breakdowns' SQL over the events (:func:`_parts_query`)
    gives over these windows. A window of a rank with several traces is split by all of them
    (they never overlap in time); a gap between two traces' GPU work counts as host wait.
    """
    if not windows:
        return pa.table({"rank": pa.array([], pa.int64())})
    ranks = sorted({int(w[0]) for w in windows})
    rf, extra = rank_filter(ranks)
    values = ", ".join(f"({int(r)}, {int(k)}, {int(a)}, {int(b)})" for r, k, a, b in windows)
    win = f"win AS MATERIALIZED (SELECT * FROM (VALUES {values}) AS t(rank, step, w0, w1))"
    return _run(store, _segments_query(breakdown, rf, win, ranks_with_collectives(store, run) >= 2), run, extra)


@cached_frame("rank_totals")
def rank_totals(
    store: SQLStore, run: str, ranks: Sequence[int] | None = None, *, hta_scope: bool = False
) -> pa.Table:
    """Whole-trace GPU totals per rank with HTA's temporal-breakdown definitions.

    ``gpu_span_ns`` = end of the last GPU event - start of the first, taken within each of the
    rank's traces and summed (each trace is a profiled window of its own: the gap between two
    windows, minutes where the profiler was off, is not GPU time); ``gpu_busy_ns`` =
    |U(all GPU events)|; ``gpu_idle_ns`` = span - busy; ``compute_ns`` = |U(compute)|;
    ``non_compute_ns`` = span - compute - idle; ``comm_ns`` = |U(communication)|;
    ``comm_comp_overlap_ns`` = |U(compute) ∩ U(communication)|; ``comm_comp_overlap_pct`` =
    100 * overlap / comm. One row per rank of the run; GPU figures are null on ranks without
    GPU events (``absent_reason`` says so), the overlap also on ranks without communication.

    Read from ``rank_gpu_totals`` (computed per trace at ingest). By default every GPU event of
    the trace counts. ``hta_scope=True`` counts only the events
    HTA's loader keeps (work whose launch is recorded and began before the last step started,
    when there are two steps or more), to compare with HTA number for number; see
    docs/ANALYSIS.md for why that is not the default.
    """
    rf, extra = rank_filter(ranks)
    query = f"""
    WITH win AS (  -- each trace's span, summed: never across the gap between two windows
        SELECT rank, sum(gpu_end_ns - gpu_start_ns)::BIGINT AS span_ns
        FROM rank_gpu_totals WHERE run = $run AND scope = $scope AND {rf} GROUP BY rank
    ),
    _tot AS (
        -- a rank's traces never overlap in time: their unions add up
        SELECT rank, sum(gpu_busy_ns)::BIGINT AS gpu_busy_ns, sum(compute_ns)::BIGINT AS compute_ns,
               sum(comm_ns)::BIGINT AS comm_ns, sum(comm_comp_overlap_ns)::BIGINT AS comm_comp_overlap_ns
        FROM rank_gpu_totals WHERE run = $run AND scope = $scope AND {rf} GROUP BY rank
    ),
    _ranks AS (SELECT DISTINCT rank FROM sources WHERE run = $run AND {rf})
    SELECT $run AS run, r.rank,
        w.span_ns AS gpu_span_ns,
        t.gpu_busy_ns,
        w.span_ns - t.gpu_busy_ns AS gpu_idle_ns,
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
    return _run(store, query, run, {**extra, "no_gpu": NO_GPU_EVENTS, "no_comm": NO_COMMUNICATION,
                                    "scope": "hta" if hta_scope else "all"})
