"""The per-rank tables, and computing all of them for one trace.

Each :class:`RankTable` is a query over relations named like the store's views (``events``,
``steps``, with ``run`` and ``rank``; and the temporary tables of :func:`prepare`) that returns the table's columns (``source`` first, no
``run``/``rank``: the partition gives them). :func:`trace_views` makes those relations over one
trace's parts, so the converter writes a trace's tables from the parts it just wrote, and
``stepscope migrate`` from the parts a store already holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.store.rankstats.breakdown import PREPARE, comm_spans_query, gpu_totals_query, rank_step_query
from stepscope.store.rankstats.collectives import RANK_COLLECTIVES, RANK_HIDING_SPANS
from stepscope.store.rankstats.copies import RANK_COPIES
from stepscope.store.rankstats.flops import RANK_FLOP_OPS, RANK_FLOP_TRACES
from stepscope.store.rankstats.kernels import RANK_CPU_OPS, RANK_KERNELS, RANK_LAUNCHES
from stepscope.store.rankstats.memory import (RANK_MEMORY_ALLOCATIONS, RANK_MEMORY_CURVE, RANK_MEMORY_LIVE,
                                              RANK_MEMORY_PEAKS, RANK_MEMORY_STEPS)
from stepscope.store.rankstats.parts import GPU, HOST
from stepscope.store.rankstats.pipeline import RANK_P2P, RANK_PIPELINE_ACTIONS, RANK_PIPELINE_WORK
from stepscope.store.rankstats.segments import segments_query, step_windows_query


@dataclass(frozen=True)
class RankTable:
    """A table of per-rank answers: its name in the store and the query that computes it."""

    name: str
    query: str


TABLES: tuple[RankTable, ...] = (
    RankTable("rank_copies", RANK_COPIES),
    RankTable("rank_step_gpu", rank_step_query(GPU)),
    RankTable("rank_step_host", rank_step_query(HOST)),
    RankTable("rank_comm_spans", comm_spans_query()),
    RankTable("rank_gpu_totals", gpu_totals_query()),
    RankTable("rank_collectives", RANK_COLLECTIVES),
    RankTable("rank_hiding_spans", RANK_HIDING_SPANS),
    RankTable("rank_kernels", RANK_KERNELS),
    RankTable("rank_cpu_ops", RANK_CPU_OPS),
    RankTable("rank_memory_peaks", RANK_MEMORY_PEAKS),
    RankTable("rank_launches", RANK_LAUNCHES),
    RankTable("rank_memory_live", RANK_MEMORY_LIVE),
    RankTable("rank_memory_steps", RANK_MEMORY_STEPS),
    RankTable("rank_memory_allocations", RANK_MEMORY_ALLOCATIONS),
    RankTable("rank_memory_curve", RANK_MEMORY_CURVE),
    RankTable("rank_p2p", RANK_P2P),
    RankTable("rank_pipeline_actions", RANK_PIPELINE_ACTIONS),
    RankTable("rank_pipeline_work", RANK_PIPELINE_WORK),
    RankTable("rank_flop_ops", RANK_FLOP_OPS),
    RankTable("rank_flop_traces", RANK_FLOP_TRACES),
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
