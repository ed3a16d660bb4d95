"""Each rank's answers stored at ingest equal what the analysis computed from the events before.

``rank_copies`` is written by the converter from the trace's own parts; here the same figures
are computed the way the analysis did before this table existed (over the store's ``events``
view, every rank at once), on every shared trace with steps and copies; and independently in
plain Python (interval union of the compute kernels) on one. A store of the older schema
version is refused with a line that names ``stepscope migrate``, which brings it up to date.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepscope.cli import main
from stepscope.errors import StoreError
from stepscope.store.rankstats.copies import copies_ctes
from stepscope.store import open_store
from tests._intervals import clip, length, load_trace, to_ns, union

COPY_TRACES = [
    "hta/trace_diff/control/control.json.gz",
    "hta/trace_diff/test/test.json.gz",
    "hta/negative_queue_length_values_check/rank0.json.gz",
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/trace_filter/sampled_rank-0.json.gz",
    "kineto_tb_plugin/old_2021-02/resnet50_profiler_api_num_workers_0.worker0.pt.trace.json.gz",
    "tracelens/mi300/resnet_act_checkpoint.json.gz",
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
]
"""Shared traces with ProfilerSteps and memcpy events."""

COLUMNS = "rank, source, step, ts_ns, dur_ns, stream, name, bytes, direction, host_memory, hidden_ns, exposed_ns"


def _from_events(store) -> list[dict]:
    """The copies as the analysis computed them before ``rank_copies``: one query over the
    store's events, all ranks at once."""
    return store.sql(f"WITH {copies_ctes()} SELECT {COLUMNS} FROM copies ORDER BY rank, ts_ns, name, stream",
                     {"run": "t"}).to_pylist()


@pytest.mark.shared
@pytest.mark.parametrize("relative", COPY_TRACES, ids=[t.split("/")[-2] for t in COPY_TRACES])
def test_stored_copies_equal_the_analysis_from_events(ingested, relative: str) -> None:
    store = open_store(ingested(relative))
    stored = store.sql(f"SELECT {COLUMNS} FROM rank_copies WHERE run = 't' ORDER BY rank, ts_ns, name, stream")
    assert stored.num_rows > 0
    assert stored.to_pylist() == _from_events(store)


@pytest.mark.shared
def test_stored_hidden_time_against_the_raw_json(ingested, shared_traces: Path) -> None:
    relative = "hta/trace_diff/control/control.json.gz"
    doc = load_trace(shared_traces / relative)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
    compute = union([(to_ns(doc, k["ts"]), to_ns(doc, k["ts"]) + round(k["dur"] * 1000)) for k in kernels
                     if not k["name"].startswith("nccl") and k["dur"] > 0])
    copies = [e for e in doc["traceEvents"] if e.get("cat") == "gpu_memcpy"]
    expected = sorted(length(clip(compute, to_ns(doc, c["ts"]), to_ns(doc, c["ts"]) + round(c["dur"] * 1000)))
                      for c in copies)
    rows = open_store(ingested(relative)).sql("SELECT hidden_ns FROM rank_copies").to_pylist()
    assert sorted(r["hidden_ns"] for r in rows) == expected


def _downgrade(store: Path) -> None:
    """Make ``store`` look written by schema version 1: no rank tables, sources without
    ``process_id``, version 1 in their metadata."""
    for part in (store / "rank_copies").rglob("*.parquet"):
        part.unlink()
    for part in (store / "sources").rglob("*.parquet"):
        table = pq.read_table(part)
        table = table.drop_columns([c for c in ("process_id", "run", "rank") if c in table.column_names])
        pq.write_table(table.replace_schema_metadata({b"stepscope.schema_version": b"1",
                                                      b"stepscope.table": b"sources"}), part)


@pytest.mark.shared
def test_an_older_store_is_refused_until_migrated(ingested, tmp_path: Path, capsys) -> None:
    import shutil

    store = tmp_path / "store"
    shutil.copytree(ingested("hta/trace_diff/control/control.json.gz"), store)
    before = open_store(store).sql(f"SELECT {COLUMNS} FROM rank_copies ORDER BY ts_ns, name").to_pylist()
    pid = open_store(store).sql("SELECT process_id FROM sources").to_pylist()
    _downgrade(store)
    with pytest.raises(StoreError, match=r"schema version 1, older .*stepscope migrate --store"):
        open_store(store)
    assert main(["summary", "--store", str(store)]) == 3
    assert "stepscope migrate" in capsys.readouterr().err
    assert main(["migrate", "--store", str(store)]) == 0
    assert "1 traces migrated" in capsys.readouterr().out
    migrated = open_store(store)
    assert migrated.sql(f"SELECT {COLUMNS} FROM rank_copies ORDER BY ts_ns, name").to_pylist() == before
    assert migrated.sql("SELECT process_id FROM sources").to_pylist() == pid
    assert main(["migrate", "--store", str(store)]) == 0
    assert "0 traces migrated, 1 already" in capsys.readouterr().out
