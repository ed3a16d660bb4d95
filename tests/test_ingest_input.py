"""Bad input, rank rules, deduplication and atomic writes, on small generated traces."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from stepscope.cli import main
from stepscope.errors import TraceFormatError
from stepscope.store import open_store
from stepscope.store import writer as writer_module
from stepscope.store.ingest import ingest_paths, ingest_trace_file

GOOD_EVENTS = [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1, "ts": 1000, "dur": 100},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1010, "dur": 5,
     "args": {"correlation": 42, "External id": 3}},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1150, "dur": 20.5,
     "args": {"correlation": 42, "stream": 7, "device": 0, "External id": 3}},
]


def _count(store: Path, table: str = "events") -> int:
    return open_store(store).sql(f"SELECT count(*) AS n FROM {table}")["n"][0].as_py()


def _bad_files(tmp_path: Path) -> dict[str, tuple[bytes, str]]:
    good = gzip.compress(b'{"traceEvents": []}')
    return {
        "truncated.json.gz": (good[: len(good) // 2], "truncated gzip"),
        "notgzip.json.gz": (b'{"traceEvents": []}', "not gzip"),
        "notjson.json": (b"{this is not json", "not valid JSON"),
        "array.json": (b"[1, 2, 3]", "bare array"),
        "et.json": (b'{"schema": "1.0.1", "nodes": []}', "Execution Trace"),
        "empty.json": (b"", "empty file"),
        "bigint.json": (b'{"traceEvents": [{"ph": "X", "name": "k", "cat": "kernel", "ts": 1, "dur": 1,'
                        b' "args": {"correlation": 18446744073709551615}}]}', "int64"),
        "negative.json": (b'{"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": -3}]}', "negative duration"),
    }


@pytest.mark.parametrize("name", list(_bad_files(Path())))
def test_bad_file_gets_one_clear_line(tmp_path: Path, name: str) -> None:
    data, problem = _bad_files(tmp_path)[name]
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(TraceFormatError) as info:
        ingest_trace_file(path, tmp_path / "store", "r")
    message = str(info.value)
    assert message.startswith(f"{path}: ") and problem in message and "\n" not in message


def test_batch_stores_good_files_and_reports_bad_ones(tmp_path: Path, make_trace, capsys) -> None:
    good = make_trace("rank0.json", GOOD_EVENTS)
    for name, (data, _) in _bad_files(tmp_path).items():
        (good.parent / name).write_bytes(data)
    store = tmp_path / "store"
    code = main(["ingest", str(good.parent), "--store", str(store), "--run", "batch"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert len(err) == len(_bad_files(tmp_path))
    assert all(re.match(r"^\S+: .+", line) for line in err)
    assert _count(store) == len(GOOD_EVENTS)


def test_refused_file_does_not_touch_stored_data(tmp_path: Path, make_trace) -> None:
    store = tmp_path / "store"
    ingest_trace_file(make_trace("rank0.json", GOOD_EVENTS), store, "r")
    before = sorted(p.read_bytes() for p in store.rglob("*.parquet"))
    bad = tmp_path / "rank1.json"
    bad.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": -3}]}')
    with pytest.raises(TraceFormatError):
        ingest_trace_file(bad, store, "r")
    assert sorted(p.read_bytes() for p in store.rglob("*.parquet")) == before


def test_same_file_twice_adds_nothing(tmp_path: Path, make_trace) -> None:
    path = make_trace("rank0.json", GOOD_EVENTS)
    store = tmp_path / "store"
    first = ingest_trace_file(path, store, "r")
    second = ingest_trace_file(path, store, "r")
    assert not first.skipped and second.skipped
    assert _count(store) == len(GOOD_EVENTS)
    assert _count(store, "sources") == 1
    ingest_trace_file(path, store, "other-run")
    assert _count(store, "runs") == 2


@pytest.mark.parametrize(
    ("name", "top", "rank", "how"),
    [
        ("anything.json", {"distributedInfo": {"rank": 5, "world_size": 8}}, 5, "distributedInfo"),
        ("trace_rank-3.json", {}, 3, "filename"),
        ("trace.rank3.json", {}, 3, "filename"),
        ("host.worker3.pt.trace.json", {}, 3, "filename"),
        ("job_rank_3.json", {}, 3, "filename"),
        ("rank_unavailable.json", {"distributedInfo": {"backend": "nccl"}}, 0, "position"),
    ],
)
def test_rank_resolution(tmp_path: Path, make_trace, name: str, top: dict, rank: int, how: str) -> None:
    outcome = ingest_trace_file(make_trace(name, GOOD_EVENTS, **top), tmp_path / "store", "r")
    assert (outcome.rank, outcome.rank_from) == (rank, how)


def test_position_decides_rank_when_nothing_else_does(tmp_path: Path, make_trace, capsys) -> None:
    make_trace("a.json", GOOD_EVENTS)
    make_trace("b.json", GOOD_EVENTS + [{"ph": "i", "name": "x", "ts": 1, "pid": 1, "tid": 1}])
    assert main(["ingest", str(tmp_path / "traces"), "--store", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "rank 0 (rank from position)" in out and "rank 1 (rank from position)" in out
    assert open_store(tmp_path / "s").sql("SELECT ranks FROM runs")["ranks"][0].as_py() == 2


def test_step_of_gpu_work_comes_from_its_launch(tmp_path: Path, make_trace) -> None:
    store = tmp_path / "store"
    ingest_trace_file(make_trace("r.json", GOOD_EVENTS), store, "r")
    row = open_store(store).sql("SELECT step, ts_ns, dur_ns, stream FROM events WHERE kind = 'kernel'").to_pylist()
    # The kernel starts at 1150 us, after step 7's CPU window [1000, 1100) ended; its launch is inside.
    assert row == [{"step": 7, "ts_ns": 1_150_000, "dur_ns": 20_500, "stream": 7}]


def test_crash_mid_ingest_leaves_nothing_visible_and_rerun_heals(tmp_path: Path, make_trace, monkeypatch) -> None:
    path = make_trace("rank0.json", GOOD_EVENTS)
    store = tmp_path / "store"
    real_write = writer_module.write_partition
    calls = []

    def crash_on_sources(root, table, *args, **kwargs):
        calls.append(table)
        if table == "sources":
            raise KeyboardInterrupt
        return real_write(root, table, *args, **kwargs)

    monkeypatch.setattr("stepscope.store.commit.write_partition", crash_on_sources)
    with pytest.raises(KeyboardInterrupt):
        ingest_trace_file(path, store, "r")
    assert calls[-1] == "sources"
    assert _count(store) == 0 and _count(store, "steps") == 0
    monkeypatch.setattr("stepscope.store.commit.write_partition", real_write)
    assert not ingest_trace_file(path, store, "r").skipped
    assert _count(store) == len(GOOD_EVENTS)


@pytest.mark.parametrize("table", ["events", "memory", "sources"])
def test_interrupted_file_write_leaves_no_partial_parquet(tmp_path: Path, make_trace, monkeypatch,
                                                          table: str) -> None:
    """Ctrl-C while a part is half written (by DuckDB's COPY: ingest writes every part so):
    neither the half file nor any part written before it is left."""
    from stepscope.store.convert import SqlPart

    real = SqlPart.write_parquet

    def interrupted(self, target, metadata):
        if metadata[b"stepscope.table"] == table.encode():
            target.write_bytes(b"PAR1 half a file")
            raise KeyboardInterrupt
        return real(self, target, metadata)

    monkeypatch.setattr(SqlPart, "write_parquet", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ingest_trace_file(make_trace("rank0.json", GOOD_EVENTS), tmp_path / "store", "r")
    assert not list((tmp_path / "store").rglob("*.parquet*"))


def test_every_parquet_file_carries_the_schema_version(tmp_path: Path, make_trace) -> None:
    import pyarrow.parquet as pq

    from stepscope.store.ingest import PARTS
    from stepscope.store.schema import SCHEMA_VERSION

    store = tmp_path / "store"
    ingest_trace_file(make_trace("rank0.json", GOOD_EVENTS), store, "r")
    files = list(store.rglob("*.parquet"))
    assert len(files) == len(PARTS) + 1  # each part of the trace, and its sources row
    assert {f.parts[-4] for f in files} == {*PARTS, "sources"}
    for file in files:
        meta = pq.read_schema(file).metadata
        assert meta[b"stepscope.schema_version"] == str(SCHEMA_VERSION).encode()


def test_plain_duckdb_reads_the_store(tmp_path: Path, make_trace) -> None:
    import duckdb

    store = tmp_path / "store"
    ingest_trace_file(make_trace("rank0.json", GOOD_EVENTS), store, "my run")
    rows = duckdb.sql(
        f"SELECT run, rank, kind FROM read_parquet('{store}/events/**/*.parquet', hive_partitioning=true) "
        "ORDER BY ts_ns").fetchall()
    assert rows == [("my-run", 0, "user_annotation"), ("my-run", 0, "cuda_runtime"), ("my-run", 0, "kernel")]


def test_newer_schema_version_is_refused(tmp_path: Path, make_trace) -> None:
    import pyarrow.parquet as pq

    from stepscope.errors import StoreError

    store = tmp_path / "store"
    ingest_trace_file(make_trace("rank0.json", GOOD_EVENTS), store, "r")
    part = next((store / "sources").rglob("*.parquet"))
    table = pq.read_table(part)
    table = table.replace_schema_metadata({b"stepscope.schema_version": b"999"})
    pq.write_table(table.drop_columns(["run", "rank"]) if "run" in table.column_names else table, part)
    with pytest.raises(StoreError, match="newer"):
        open_store(store)


def test_sql_command_is_read_only(tmp_path: Path, make_trace, capsys) -> None:
    store = tmp_path / "store"
    ingest_trace_file(make_trace("rank0.json", GOOD_EVENTS), store, "r")
    assert main(["sql", "SELECT count(*) AS n FROM events", "--store", str(store), "--format", "csv"]) == 0
    assert capsys.readouterr().out.strip().splitlines() == ["\"n\"", "3"]
    for query in [f"COPY (SELECT 1) TO '{tmp_path}/x.csv'", "ATTACH 'x.db'", "INSTALL httpfs",
                  "CREATE TABLE t AS SELECT 1", "SELECT * FROM read_csv('/etc/passwd')"]:
        assert main(["sql", query, "--store", str(store)]) == 2, query
    assert not (tmp_path / "x.csv").exists()


def test_missing_store_is_a_clear_error(tmp_path: Path, capsys) -> None:
    assert main(["runs", "--store", str(tmp_path / "nope")]) == 3
    assert "no such store" in capsys.readouterr().err
