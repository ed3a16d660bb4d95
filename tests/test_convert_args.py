"""The stored ``args`` column: each event's args JSON exactly as recorded, null when absent."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from stepscope.store import open_store
from stepscope.store.ingest import ingest_trace_file
from tests.conftest import load_raw


def test_args_keep_every_value_and_absent_args_are_null(tmp_path: Path, make_trace) -> None:
    args = [{"a": 1}, None, {"é": "∑", "q": "a\"b"}, {},
            {"big": 18446744073709551616, "neg": -9223372036854775809, "f": 0.30000000000000004, "e": 1e-7,
             "nested": {"l": [1, [2, {"x": None}]]}, "t": True}]
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1,
               **({} if a is None else {"args": a})} for i, a in enumerate(args)]
    ingest_trace_file(make_trace("rank0.json", events), tmp_path / "s", "r")
    rows = open_store(tmp_path / "s").sql("SELECT name, args FROM events ORDER BY ts_ns").to_pylist()
    assert [None if r["args"] is None else json.loads(r["args"]) for r in rows] == args
    assert '18446744073709551616' in rows[4]["args"] and '-9223372036854775809' in rows[4]["args"]


@pytest.mark.shared
def test_stored_args_match_the_raw_json(ingested, shared_traces: Path) -> None:
    """Same multiset of args objects as json.loads reads from the file (events are re-sorted)."""
    relative = "hta/trace_diff/control"
    raw = load_raw(next((shared_traces / relative).glob("*.json.gz")))["traceEvents"]

    def canonical(args: object) -> str:
        return json.dumps(args, sort_keys=True)

    expected = Counter(canonical(e["args"]) for e in raw if "args" in e)
    stored = open_store(ingested(relative)).sql("SELECT args FROM events")["args"].to_pylist()
    assert sum(a is None for a in stored) == sum("args" not in e for e in raw)
    assert Counter(canonical(json.loads(a)) for a in stored if a is not None) == expected
