"""A rank table whose input a trace lacks is not planned at ingest: what it writes instead is right.

``rankstats.queries`` gives a table whose ``needs`` no event of the trace meets a query of no
rows with the table's declared columns. Two things make that safe, checked here on real traces
that lack one input or another (no GPU, no memory events, no pipeline, no events at all):

- every such table's own query, run over the same trace, returns no row (so ``needs`` is not
  narrower than what the query reads);
- the declared columns are exactly the query's columns and DuckDB types (so the empty part has
  the schema the computed one would have).

Likewise the FLOP rows are computed by a statement written for the FLOP families the trace holds
(``rankstats.Specialised``): it gives the rows the statement of every family gives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from stepscope.store import engine, open_store, rankstats
from stepscope.store.ingest import ingest_paths
from stepscope.store.rankstats.flops import FAMILIES, FLOP_ROWS, materialize_flop_ops
from tests.conftest import SHARED_TRACES

REPO = Path(__file__).resolve().parent.parent

SAMPLES = [
    "sample_traces/gloo-3ranks-late/rank0.pt.trace.json.gz",
    "sample_traces/pp-gpipe-3stages/rank1.pt.trace.json.gz",
    "sample_traces/cpu-transformer/rank0.pt.trace.json.gz",
]
"""This project's recordings: CPU-only (gloo), a pipeline stage, a CPU model."""

SHARED = [
    "hta/trace_filter/sampled_rank-0.json.gz",
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "hta/rank_non_gpu/rank_non_gpu.json.gz",
    "hta/trace_compare/base/base.json.gz",
]
"""Shared traces with GPU work but no memory events or pipeline, or without GPU work, or tiny."""


def _stores(tmp_path: Path, ingested: Callable[[str], Path]) -> dict[str, Path]:
    """Each trace's name -> its store (run ``t``, the trace alone): the shared traces' from the
    session's ingest of them (``ingested``), the others ingested here."""
    stores = {}
    for k, trace in enumerate([*(REPO / s for s in SAMPLES), _empty_trace(tmp_path)]):
        report = ingest_paths([trace], tmp_path / f"store{k}", "t")
        assert report.ok, report.errors
        stores[trace.name] = tmp_path / f"store{k}"
    if SHARED_TRACES.is_dir():
        stores |= {Path(s).name: ingested(s) for s in SHARED if (SHARED_TRACES / s).is_file()}
    return stores


def _empty_trace(tmp_path: Path) -> Path:
    empty = tmp_path / "empty.json"
    empty.write_text('{"schemaVersion": 1, "traceEvents": []}')
    return empty


def _trace_connection(store: Path):
    """A connection whose views hold the one trace of ``store`` (as ingest computes its tables)."""
    with open_store(store) as opened:
        [stored] = opened.sql("SELECT rank, source FROM sources WHERE run = 't'").to_pylist()
    con = engine.connect(limit="512MB", threads=1)
    parts = {t: store / t / "run=t" / f"rank={stored['rank']}" / f"part-{stored['source']}.parquet"
             for t in ("events", "steps", "memory")}
    rankstats.trace_views(con, parts, "t", stored["rank"])
    rankstats.prepare(con, "t")
    return con


def _columns(con, query: str) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in con.execute(f"DESCRIBE {query}", rankstats.params(query, "t")).fetchall()]


def test_tables_whose_input_is_absent_have_no_rows_and_the_declared_columns(
        tmp_path: Path, ingested: Callable[[str], Path]) -> None:
    skipped: set[str] = set()
    for name, store in _stores(tmp_path, ingested).items():
        con = _trace_connection(store)
        has = rankstats.present(con, "t")
        for table in rankstats.TABLES:
            if table.needs is None:
                continue
            rankstats.share(con, "t", table)
            assert _columns(con, rankstats.no_rows(table)) == _columns(con, table.query), table.name
            if not has[table.name]:
                skipped.add(table.name)
                (rows,) = con.execute(f"SELECT count(*) FROM ({table.query})",
                                      rankstats.params(table.query, "t")).fetchone()
                assert rows == 0, f"{name}: {table.name} has {rows} rows although its input is absent"
        con.close()
    # every table that can be skipped was skipped on some trace (else the check above proved nothing)
    assert skipped == {t.name for t in rankstats.TABLES if t.needs is not None}


def test_queries_give_the_real_query_where_the_input_is_present(tmp_path: Path) -> None:
    assert ingest_paths([REPO / SAMPLES[1]], tmp_path / "store", "t").ok
    con = _trace_connection(tmp_path / "store")
    chosen = dict(rankstats.queries(con, "t"))
    by_name = {t.name: t for t in rankstats.TABLES}
    assert list(chosen) == list(by_name)
    has = rankstats.present(con, "t")
    assert has["rank_pipeline_work"] and not has["rank_gpu_totals"]
    assert chosen["rank_pipeline_work"] == by_name["rank_pipeline_work"].query
    assert chosen["rank_gpu_totals"] == rankstats.no_rows(by_name["rank_gpu_totals"])
    assert chosen["rank_step_host"] == by_name["rank_step_host"].query  # always computed


def test_a_table_that_is_always_computed_has_no_empty_query() -> None:
    always = next(t for t in rankstats.TABLES if t.needs is None)
    with pytest.raises(ValueError):
        rankstats.no_rows(always)


@pytest.mark.shared
@pytest.mark.parametrize(("relative", "families"), [
    ("hta/trace_filter/sampled_rank-0.json.gz", {"matmul"}),
    ("tracelens/mi300/resnet_act_checkpoint.json.gz", {"matmul", "conv"}),
    ("tracelens/inference/xdit_flux.1_aiter_sage/profile_trace_rank_0.json.gz", {"matmul", "conv", "attention"}),
])
def test_the_flop_rows_of_the_families_a_trace_holds_equal_those_of_every_family(
        ingested: Callable[[str], Path], relative: str, families: set[str]) -> None:
    con = _trace_connection(ingested(relative))
    has = rankstats.present(con, "t")
    held = {family for family in FAMILIES if has[f"flop family {family}"]}
    assert held == families
    rows = []
    for statement in (materialize_flop_ops(), materialize_flop_ops(frozenset(held))):
        con.execute(statement, rankstats.params(statement, "t"))
        rows.append(sorted(map(repr, con.execute(f"SELECT * FROM {FLOP_ROWS}").fetchall())))
    con.close()
    assert rows[0], "no FLOP rows: the comparison proved nothing"
    assert rows[1] == rows[0]
    # what ingest runs for the trace is that statement
    [flop_rows] = next(t for t in rankstats.TABLES if t.name == "rank_flop_ops").shared
    assert flop_rows.statement(has) == materialize_flop_ops(frozenset(held))


def test_the_flop_statement_of_every_set_of_families_binds(tmp_path: Path) -> None:
    """Each of the statements a trace can get is well formed (the test above runs three of them)."""
    assert ingest_paths([_empty_trace(tmp_path)], tmp_path / "store", "t").ok
    con = _trace_connection(tmp_path / "store")
    for k in range(1, 1 << len(FAMILIES)):
        families = frozenset(f for i, f in enumerate(FAMILIES) if k >> i & 1)
        statement = materialize_flop_ops(families)
        con.execute(statement, rankstats.params(statement, "t"))
        assert con.execute(f"SELECT count(*) FROM {FLOP_ROWS}").fetchone() == (0,), families
    con.close()
    with pytest.raises(ValueError):
        materialize_flop_ops(frozenset())
