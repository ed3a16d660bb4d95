"""``analysis.steps.step_times``: every timed step, throughput, and abstention without a timer."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from stepscope.analysis import is_absent
from stepscope.analysis.steps import step_times
from stepscope.store import open_store
from stepscope.store.ingest import ingest_trace_file
from stepscope.store.schema import STEP_TIMES
from stepscope.store.writer import write_partition

EVENTS = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 10, "dur": 5}]


def test_step_times_with_throughput(tmp_path: Path, make_trace) -> None:
    store = tmp_path / "s"
    stored = ingest_trace_file(make_trace("rank0.json", EVENTS), store, "r")
    assert is_absent(step_times(open_store(store), "r"))
    rows = [  # step 3 was profiled; 4 has no token count
        {"source": stored.source, "step": 3, "start_ns": 10, "wall_ns": 250_000_000, "gpu_ns": None,
         "profiled": True, "tokens": 4096, "samples": 8},
        {"source": stored.source, "step": 4, "start_ns": 20, "wall_ns": 200_000_000, "gpu_ns": None,
         "profiled": False, "tokens": None, "samples": 8},
    ]
    write_partition(store, "step_times", "r", 0, stored.source, pa.Table.from_pylist(rows, schema=STEP_TIMES))
    got = step_times(open_store(store), "r").to_pylist()
    assert [(r["step"], r["wall_ns"], r["profiled"]) for r in got] == [(3, 250_000_000, True), (4, 200_000_000, False)]
    assert got[0]["tokens_per_s"] == 4096 / 0.25 and got[0]["samples_per_s"] == 8 / 0.25
    assert got[1]["tokens_per_s"] is None and got[1]["samples_per_s"] == 8 / 0.2
    assert is_absent(step_times(open_store(store), "r", ranks=[1]))
