"""The streaming conversion: a trace cut into many pieces stores exactly what one piece stores;
the parts DuckDB writes follow ``schema.py``; the step rule on awkward windows."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepscope.store import open_store, schema, split, textstream
from stepscope.store.ingest import ingest_trace_file
from tests.conftest import write_trace


def _busy_trace(steps: int = 30) -> list[dict[str, Any]]:
    """Steps with launches, kernels that run after their step, memory events and collectives."""
    rng = random.Random(3)
    events: list[dict[str, Any]] = []
    corr = 0
    for step in range(steps):
        base = 1_000 + step * 1_000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step + 10}", "pid": 7,
                       "tid": 7, "ts": base, "dur": 900.25})
        for _ in range(20):
            corr += 1
            t = base + rng.randint(0, 890) + 0.125
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7,
                           "ts": t, "dur": 2, "args": {"correlation": corr, "External id": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": rng.choice(["gemm", "ncclDevKernel_AllReduce"]),
                           "pid": 0, "tid": 7, "ts": t + rng.randint(5, 1500), "dur": 3.5,
                           "args": {"correlation": corr, "stream": 7, "device": 0, "In msg nelems": 1024,
                                    "Out msg nelems": 1024, "dtype": "Float", "Group size": 2}})
            events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 7, "tid": 7,
                           "ts": t + 1, "args": {"Addr": corr * 64, "Bytes": 512, "Total Allocated": corr,
                                                  "Total Reserved": 4096, "Device Type": 1, "Device Id": 0}})
    rng.shuffle(events)  # the file's order is not time order
    return events


EVENT_COLUMNS = "kind, category, name, ph, ts_ns, dur_ns, pid, tid, stream, device, correlation, step, bytes, collective, in_nelems"


def _stored(store: Path) -> tuple[list, list, list]:
    s = open_store(store)
    return (s.sql(f"SELECT {EVENT_COLUMNS} FROM events ORDER BY ts_ns, name, correlation").to_pylist(),
            s.sql("SELECT step, start_ns, end_ns FROM steps ORDER BY step").to_pylist(),
            s.sql("SELECT ts_ns, step, addr, bytes FROM memory ORDER BY ts_ns, addr").to_pylist())


def test_many_pieces_store_what_one_piece_stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = write_trace(tmp_path / "rank0.json", _busy_trace(), distributedInfo={"rank": 0})
    ingest_trace_file(trace, tmp_path / "one", "r")
    monkeypatch.setattr(split, "PIECE_BYTES", 3_000)
    monkeypatch.setattr(textstream, "READ_BYTES", 2_000)
    ingest_trace_file(trace, tmp_path / "many", "r")
    one, many = _stored(tmp_path / "one"), _stored(tmp_path / "many")
    assert one == many
    events, steps, memory = one
    assert len(events) == 30 * 61 and len(steps) == 30 and len(memory) == 600
    late = [e for e in events if e["kind"] == "kernel" and e["step"] is not None
            and e["ts_ns"] >= next(s["end_ns"] for s in steps if s["step"] == e["step"])]
    assert late, "kernels that run after their step keep their launch's step"


def test_the_step_is_the_window_that_starts_last_before_the_event(tmp_path: Path) -> None:
    """Nested windows (step 1 holds step 2): an event after step 2 ended, inside step 1, is in no
    step (the rule: the window that starts last at or before it, if it has not ended)."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 10, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "inside-2", "pid": 1, "tid": 1, "ts": 15, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "after-2", "pid": 1, "tid": 1, "ts": 50, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "before-2", "pid": 1, "tid": 1, "ts": 5, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "after-all", "pid": 1, "tid": 1, "ts": 150, "dur": 1},
    ]
    ingest_trace_file(write_trace(tmp_path / "t.json", events), tmp_path / "s", "r")
    rows = open_store(tmp_path / "s").sql("SELECT name, step FROM events WHERE kind = 'cpu_op'").to_pylist()
    assert {r["name"]: r["step"] for r in rows} == {"inside-2": 2, "after-2": None, "before-2": 1, "after-all": None}


def test_a_trace_without_events_is_stored_empty(tmp_path: Path) -> None:
    done = ingest_trace_file(write_trace(tmp_path / "t.json", []), tmp_path / "s", "r")
    assert not done.skipped and done.events == 0
    assert open_store(tmp_path / "s").sql("SELECT count(*) AS n FROM events").to_pylist() == [{"n": 0}]


def _plain(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _no_communication(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events without the collectives: the conversion then skips its ``comm`` query."""
    return [e for e in events if not e["name"].startswith("nccl")]


@pytest.mark.parametrize("events", [_busy_trace, lambda steps: _no_communication(_busy_trace(steps))],
                         ids=["with collectives", "without communication"])
def test_every_part_follows_the_schema(tmp_path: Path, events) -> None:
    """Names, order and types of each part's columns are those of ``schema.py`` (dictionary
    encoding is a Parquet page matter: the files hold plain strings), also where the trace has no
    communication event (its collective columns come from the empty ``comm`` table)."""
    trace = write_trace(tmp_path / "rank0.json", events(2), distributedInfo={"rank": 0})
    ingest_trace_file(trace, tmp_path / "s", "r")
    for table in ("events", "steps", "memory", "sources"):
        [part] = (tmp_path / "s" / table).rglob("*.parquet")
        written = pq.read_schema(part)
        expected = schema.TABLES[table].schema
        assert written.names == expected.names, table
        assert [_plain(f.type) for f in written] == [_plain(f.type) for f in expected], table
        assert written.metadata[b"stepscope.table"] == table.encode()
