"""The per-rank tables, and computing all of them for one trace.

Each :class:`RankTable` is a query over relations named like the store's views (``events``,
``steps``, with ``run`` and ``rank``; and the temporary tables of :func:`prepare`) that returns
the table's columns (``source`` first, no ``run``/``rank``: the partition gives them). :func:`trace_views` makes those relations over one
trace's parts, so the converter writes a trace's tables from the parts it just wrote, and
``stepscope migrate`` from the parts a store already holds.

Planning a query costs DuckDB tens of milliseconds (the FLOP query ~0.3 s), whatever the rows:
on a small trace that is nearly all of its ingest. So a table whose input the trace lacks
(``RankTable.needs``: no memory events, no FLOP op, no transfer, no pipeline action, ...) is not
planned at all: :func:`queries` finds what the trace holds in one scan and gives such a table a
query of no rows with its columns (``RankTable.columns``), which plans in a millisecond.
Likewise a statement that tables share can be written for what the trace holds, found in the same
scan (:class:`Specialised`): the FLOP rows' statement binds the formulas of the FLOP families the
trace has ops of only (35 KB of SQL for all three, 14.6 KB for matrix products alone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.store.rankstats.breakdown import (GPU_KINDS_SQL, PREPARE, WINDOW_COLUMNS, comm_spans_query,
                                                 gpu_totals_query, rank_step_query, sql_list, stored_columns)
from stepscope.store.rankstats.collectives import HOST_SIDE_SQL, RANK_COLLECTIVES, RANK_HIDING_SPANS
from stepscope.store.rankstats.copies import RANK_COPIES
from stepscope.store.rankstats.edges import EDGES_COLUMNS, EDGES_NEEDS, RANK_EDGES
from stepscope.store.rankstats.flops import (FAMILIES, FLOP_OPS, RANK_FLOP_OPS, RANK_FLOP_SKIPPED, RANK_FLOP_TRACES,
                                             materialize_flop_ops)
from stepscope.store.rankstats.kernels import RANK_CPU_OPS, RANK_KERNELS, RANK_LAUNCHES
from stepscope.store.rankstats.memory import (PREPARE_MEMORY, RANK_MEMORY_ALLOCATIONS, RANK_MEMORY_CURVE,
                                              RANK_MEMORY_LIVE, RANK_MEMORY_PEAKS, RANK_MEMORY_STEPS)
from stepscope.store.rankstats.parts import GPU, HOST, Breakdown
from stepscope.store.rankstats.pipeline import (ACTION_SQL, P2P_SQL, RANK_P2P, RANK_PIPELINE_ACTIONS,
                                                RANK_PIPELINE_WORK)
from stepscope.store.rankstats.segments import segments_query, step_windows_query


@dataclass(frozen=True)
class Specialised:
    """A shared statement written for what the trace holds: ``build`` gets the names of
    ``facts`` (name, SQL over one ``events`` row, alias ``e``) that some row of the trace meets
    (found in :func:`present`'s one scan), or all of them where that was not asked. Why: DuckDB
    binds a statement in time ~linear in its text, so a trace binds only the part it needs."""

    facts: tuple[tuple[str, str], ...]
    build: Callable[[frozenset[str]], str]

    def statement(self, held: Mapping[str, bool] | None = None) -> str:
        """The statement for a trace whose ``held`` facts (:func:`present`) are known; for any trace
        when None."""
        return self.build(frozenset(name for name, _ in self.facts if held is None or held[name]))


@dataclass(frozen=True)
class RankTable:
    """A table of per-rank answers: its name in the store and the query that computes it.

    ``needs``: SQL over one ``events`` row (alias ``e``) that holds for every row the query reads
    its answer from, so that a trace with no such row has no row in the table (a test checks it
    on traces without them); ``columns``: the query's columns and DuckDB types, the part written
    instead of planning the query then. None: always computed. ``shared``: statements making
    temporary tables the query reads with other tables' queries, run once before the first of
    them is computed (not at all when every one is skipped), each a text or written for what the
    trace holds (:class:`Specialised`)."""

    name: str
    query: str
    needs: str | None = None
    columns: str | None = None
    shared: tuple[str | Specialised, ...] = ()


def _step_columns(breakdown: Breakdown) -> str:
    """``rank_step_<name>``'s columns and types, from the part catalogue (as the schema's)."""
    names = ("step", *(name for name, _ in WINDOW_COLUMNS[breakdown]), *stored_columns(breakdown))
    return ", ".join(["source VARCHAR", *(f"{name} BIGINT" for name in names)])


_GPU_WORK = f"e.kind IN {GPU_KINDS_SQL} AND e.dur_ns > 0"
_MEMORY = "e.kind = 'memory' AND e.ts_ns IS NOT NULL"
"""The rows of the ``memory`` part (every memory table reads them)."""
_FLOP_OPS = f"e.kind = 'cpu_op' AND e.name IN {sql_list(tuple(FLOP_OPS))}"
"""The ops of a FLOP family (both FLOP tables read the rows their one query computes)."""
_FLOP_ROWS = Specialised(
    tuple((f"flop family {family}",
           f"e.kind = 'cpu_op' AND e.name IN {sql_list(tuple(n for n, op in FLOP_OPS.items() if op.family == family))}")
          for family in FAMILIES),
    lambda held: materialize_flop_ops(frozenset(name.removeprefix("flop family ") for name in held)))
"""The FLOP rows, computed with the formulas of the families whose ops the trace holds only."""

TABLES: tuple[RankTable, ...] = (
    RankTable("rank_copies", RANK_COPIES, "e.kind = 'memcpy' AND e.dur_ns IS NOT NULL",
              "source VARCHAR, step BIGINT, ts_ns BIGINT, dur_ns BIGINT, stream BIGINT, name VARCHAR, bytes BIGINT, "
              "direction VARCHAR, host_memory VARCHAR, hidden_ns BIGINT, exposed_ns BIGINT"),
    RankTable("rank_step_gpu", rank_step_query(GPU), _GPU_WORK, _step_columns(GPU)),
    RankTable("rank_step_host", rank_step_query(HOST)),
    RankTable("rank_comm_spans", comm_spans_query()),
    RankTable("rank_gpu_totals", gpu_totals_query(), _GPU_WORK,
              "source VARCHAR, scope VARCHAR, gpu_start_ns BIGINT, gpu_end_ns BIGINT, gpu_events BIGINT, "
              "gpu_busy_ns BIGINT, compute_ns BIGINT, comm_ns BIGINT, comm_comp_overlap_ns BIGINT"),
    RankTable("rank_collectives", RANK_COLLECTIVES,
              f"e.category = 'communication' AND e.dur_ns IS NOT NULL AND (e.kind = 'kernel' OR ({HOST_SIDE_SQL}))",
              "source VARCHAR, pid BIGINT, tid BIGINT, step BIGINT, name VARCHAR, ts_ns BIGINT, dur_ns BIGINT, "
              "end_ns BIGINT, stream BIGINT, correlation BIGINT, host_side BOOLEAN, collective VARCHAR, bytes BIGINT, "
              "dtype VARCHAR, group_size BIGINT, pg_name VARCHAR, pg_desc VARCHAR, pg_ranks VARCHAR, comm_seq BIGINT, "
              "linked BOOLEAN, phase VARCHAR"),
    RankTable("rank_hiding_spans", RANK_HIDING_SPANS),
    RankTable("rank_kernels", RANK_KERNELS, _GPU_WORK,
              "source VARCHAR, name VARCHAR, kind VARCHAR, category VARCHAR, count BIGINT, total_ns BIGINT, "
              "max_ns BIGINT"),
    RankTable("rank_cpu_ops", RANK_CPU_OPS,
              "e.kind = 'cpu_op' AND e.dur_ns IS NOT NULL AND e.name NOT LIKE 'ProfilerStep#%'",
              "source VARCHAR, name VARCHAR, category VARCHAR, count BIGINT, total_ns BIGINT, self_ns BIGINT, "
              "sync_ns BIGINT, max_ns BIGINT"),
    RankTable("rank_memory_peaks", RANK_MEMORY_PEAKS, _MEMORY,
              "source VARCHAR, device_type BIGINT, device BIGINT, step BIGINT, events BIGINT, "
              "peak_allocated_bytes BIGINT, peak_ts_ns BIGINT, peak_reserved_bytes BIGINT, min_allocated_bytes BIGINT, "
              "rebuilt BOOLEAN, phase VARCHAR, ops_at_peak VARCHAR[]", PREPARE_MEMORY),
    RankTable("rank_launches", RANK_LAUNCHES,
              f"e.kind IN {GPU_KINDS_SQL} AND e.dur_ns IS NOT NULL AND e.correlation IS NOT NULL",
              "source VARCHAR, launches BIGINT, launch_ns BIGINT, launched_gpu_ns BIGINT, short_launches BIGINT, "
              "median_launch_delay_ns DOUBLE"),
    RankTable("rank_memory_live", RANK_MEMORY_LIVE, _MEMORY,
              "source VARCHAR, device_type BIGINT, device BIGINT, first_ts_ns BIGINT, last_ts_ns BIGINT, "
              "peak_ts_ns BIGINT, peak_allocated_bytes BIGINT, live_allocations BIGINT, live_bytes BIGINT",
              PREPARE_MEMORY),
    RankTable("rank_memory_steps", RANK_MEMORY_STEPS, _MEMORY,
              "source VARCHAR, device_type BIGINT, device BIGINT, step BIGINT, allocations BIGINT, bytes BIGINT",
              PREPARE_MEMORY),
    RankTable("rank_memory_allocations", RANK_MEMORY_ALLOCATIONS, _MEMORY,
              "source VARCHAR, memory_index BIGINT, device_type BIGINT, device BIGINT, addr BIGINT, bytes BIGINT, "
              "step BIGINT, alloc_ts_ns BIGINT, free_ts_ns BIGINT, allocated_by VARCHAR[]", PREPARE_MEMORY),
    RankTable("rank_memory_curve", RANK_MEMORY_CURVE, _MEMORY,
              "source VARCHAR, device_type BIGINT, device BIGINT, bucket BIGINT, ts_ns BIGINT, total_allocated BIGINT, "
              "total_reserved BIGINT, rebuilt BOOLEAN", PREPARE_MEMORY),
    RankTable("rank_p2p", RANK_P2P, P2P_SQL,
              "source VARCHAR, step BIGINT, ts_ns BIGINT, dur_ns BIGINT, send BOOLEAN, peer_index BIGINT"),
    RankTable("rank_pipeline_actions", RANK_PIPELINE_ACTIONS, ACTION_SQL,
              "source VARCHAR, ts_ns BIGINT, end_ns BIGINT, stage BIGINT, action VARCHAR, microbatch BIGINT"),
    RankTable("rank_pipeline_work", RANK_PIPELINE_WORK, f"({P2P_SQL}) OR ({ACTION_SQL})",
              "source VARCHAR, issue_ns BIGINT, start_ns BIGINT, end_ns BIGINT, phase VARCHAR, on_gpu BOOLEAN"),
    RankTable("rank_flop_ops", RANK_FLOP_OPS, _FLOP_OPS,
              "source VARCHAR, pid BIGINT, tid BIGINT, step BIGINT, name VARCHAR, family VARCHAR, leaf BOOLEAN, "
              "ts_ns BIGINT, dur_ns BIGINT, flops BIGINT, flops_source VARCHAR, dtype VARCHAR, counted BOOLEAN, "
              "reason VARCHAR, gpu_ns BIGINT, kernels BIGINT, tf32 BOOLEAN", (_FLOP_ROWS,)),
    RankTable("rank_flop_skipped", RANK_FLOP_SKIPPED, _FLOP_OPS,
              "source VARCHAR, family VARCHAR, ops BIGINT, kernel_ns BIGINT", (_FLOP_ROWS,)),
    RankTable("rank_flop_traces", RANK_FLOP_TRACES),
    RankTable("rank_edges", RANK_EDGES, EDGES_NEEDS, EDGES_COLUMNS),
    RankTable("rank_step_windows", step_windows_query()),
    RankTable("rank_segments", segments_query()),
)
"""Every per-rank table, in the order they are written."""


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def trace_views(con: Any, parts: dict[str, Path], run: str, rank: int) -> None:
    """Temporary views ``events``, ``steps`` (and ``memory``) of ``con`` over one trace's part
    files, with the ``run`` and ``rank`` columns the store's views have."""
    for table, path in parts.items():
        con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS SELECT *, {_sql_string(run)} AS run, "
                    f"{int(rank)}::INTEGER AS rank FROM read_parquet({_sql_string(str(path))})")


def params(query: str, run: str) -> dict[str, str]:
    """The parameters of a per-rank query (``$run`` where it reads the views; DuckDB refuses
    parameters a statement does not use)."""
    return {"run": run} if "$run" in query else {}


def prepare(con: Any, run: str) -> None:
    """The temporary tables the queries of :data:`TABLES` share (one sweep per breakdown), over
    the views :func:`trace_views` made."""
    for statement in PREPARE:
        con.execute(statement, params(statement, run))


def no_rows(table: RankTable) -> str:
    """A query of no rows with ``table``'s columns (it plans in about a millisecond)."""
    if table.columns is None:
        raise ValueError(f"{table.name} is always computed: it has no columns declared")
    casts = ", ".join(f"NULL::{kind} AS {name}" for name, kind in
                      (column.strip().split(" ", 1) for column in table.columns.split(", ")))
    return f"SELECT {casts} WHERE FALSE"


def _facts() -> dict[str, str]:
    """Every condition :func:`present` checks: each table's ``needs`` under the table's name, each
    :class:`Specialised` statement's facts under theirs."""
    facts = {t.name: t.needs for t in TABLES if t.needs is not None}
    for table in TABLES:
        for shared in table.shared:
            if isinstance(shared, Specialised):
                facts |= dict(shared.facts)
    return facts


def present(con: Any, run: str) -> dict[str, bool]:
    """Table name -> whether the trace in ``con``'s views holds a row its ``needs`` asks for, and
    the name of each fact a :class:`Specialised` statement asks about -> whether the trace holds
    it (one scan of ``events``); tables that are always computed are left out."""
    facts = _facts()
    distinct = list(dict.fromkeys(facts.values()))
    flags = con.execute("SELECT " + ", ".join(f"count(*) FILTER ({sql}) > 0" for sql in distinct)
                        + " FROM events e WHERE e.run = $run", {"run": run}).fetchone()
    found = dict(zip(distinct, flags))
    return {name: bool(found[sql]) for name, sql in facts.items()}


def queries(con: Any, run: str) -> Iterator[tuple[str, str]]:
    """Each table's name and the query that writes its part for the trace in ``con``'s views
    (after :func:`prepare`): its own, or :func:`no_rows` where the trace lacks its input. The
    ``shared`` statements of a computed table run before it is yielded, once, each written for
    what the trace holds (:class:`Specialised`)."""
    has = present(con, run)
    done: set[str] = set()
    for table in TABLES:
        if not has.get(table.name, True):
            yield table.name, no_rows(table)
            continue
        share(con, run, table, done, has)
        yield table.name, table.query


def share(con: Any, run: str, table: RankTable, done: set[str] | None = None,
          held: Mapping[str, bool] | None = None) -> None:
    """Run ``table``'s ``shared`` statements in ``con`` (those not in ``done``, which gains them):
    a :class:`Specialised` one written for the facts ``held`` (:func:`present`), for any trace
    when None."""
    done = set() if done is None else done
    for shared in table.shared:
        statement = shared.statement(held) if isinstance(shared, Specialised) else shared
        if statement not in done:
            con.execute(statement, params(statement, run))
            done.add(statement)
