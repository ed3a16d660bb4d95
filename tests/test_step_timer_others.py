"""The step timer's ``others_cpu_ns``: the CPU time the rest of the machine used during each
step (every CPU's busy time in /proc/stat less this process's CPU time), null where the platform
cannot tell; and the store reads it back beside the CPU step time, null in parts written before."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stepscope.collector import step_timer
from stepscope.collector.step_timer import StepTimer

MS = 1_000_000


def test_each_step_stores_the_rest_of_the_machines_cpu_time_during_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in counters: the machine's busy time 100, 130, 190, 190 ms, this process's CPU time
    10, 20, 40, 50 ms: the others used 20, 40 and -10 ms (ticks against ns: a step's value may be
    negative; only a run's sum means something). Without /proc/stat the column is null."""
    busy, own = iter([100 * MS, 130 * MS, 190 * MS, 190 * MS]), iter([10 * MS, 20 * MS, 40 * MS, 50 * MS])
    monkeypatch.setattr(step_timer, "_machine_busy", lambda: lambda: next(busy))
    monkeypatch.setattr(step_timer.time, "process_time_ns", lambda: next(own))
    timer = StepTimer(use_cuda=False)
    timer.begin()
    for step in range(3):
        timer.end_step(step, profiled=False)
    assert [r["others_cpu_ns"] for r in timer.snapshot().table("s").to_pylist()] == [20 * MS, 40 * MS, -10 * MS]

    monkeypatch.setattr(step_timer, "_machine_busy", lambda: None)
    timer = StepTimer(use_cuda=False)
    timer.begin()
    timer.end_step(0, profiled=False)
    assert [r["others_cpu_ns"] for r in timer.snapshot().table("s").to_pylist()] == [None]


def test_the_machines_busy_time_counts_this_process_too() -> None:
    """The real reader, against an independent count: while this thread spins, every CPU's busy
    time grows by at least the CPU time this process used (other processes only add to it), give
    or take one 10 ms tick per CPU at each end."""
    import os

    read = step_timer._machine_busy()
    if read is None:
        pytest.skip("no /proc/stat on this platform")
    tick = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    busy0, own0 = read(), time.process_time_ns()
    while time.process_time_ns() - own0 < 300 * MS:
        pass
    busy, own = read() - busy0, time.process_time_ns() - own0
    assert busy >= own - 2 * tick * (os.cpu_count() or 1), (busy, own)


def test_the_column_is_read_beside_the_cpu_time_and_null_in_older_parts(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stepscope.analysis.absent import Absent
    from stepscope.analysis.compare.comparison import compare_sides
    from stepscope.analysis.compare.metrics import step_samples
    from stepscope.store import open_store
    from stepscope.store.constants import file_metadata
    from stepscope.store.ingest import ingest_paths
    from stepscope.store.schema import STEP_TIMES
    from stepscope.store.writer import part_path, write_partition
    from tests.conftest import REPO

    root = tmp_path / "store"
    for run in ("new", "old"):
        assert ingest_paths([REPO / "sample_traces" / "cpu-transformer"], root, run).ok
    sources = {r["run"]: r["source"] for r in open_store(root).sql("SELECT run, source FROM sources").to_pylist()}
    columns = {"step": [0, 1, 2], "start_ns": [0, 10 * MS, 20 * MS], "wall_ns": [10 * MS, 10 * MS, 10 * MS],
               "cpu_ns": [4 * MS, 5 * MS, 6 * MS], "preemptions": [0, 1, 0], "gpu_ns": [None] * 3,
               "profiled": [False] * 3, "tokens": [None] * 3, "samples": [None] * 3, "disturbed_by": [None] * 3}
    new = pa.table({**columns, "source": [sources["new"]] * 3, "others_cpu_ns": [-3 * MS, 7 * MS, 2 * MS]})
    write_partition(root, "step_times", "new", 0, sources["new"],
                    new.select([f.name for f in STEP_TIMES]).cast(STEP_TIMES))
    old = part_path(root, "step_times", "old", 0, sources["old"])
    old.parent.mkdir(parents=True, exist_ok=True)
    older_columns = [f for f in STEP_TIMES if f.name != "others_cpu_ns"]  # a part from before the column
    pq.write_table(pa.table({**columns, "source": [sources["old"]] * 3}).select([f.name for f in older_columns])
                   .cast(pa.schema(older_columns)).replace_schema_metadata(file_metadata("step_times")), old)

    store = open_store(root)
    fresh, older = (step_samples(store, run, "step_times.cpu_ns") for run in ("new", "old"))
    assert fresh["others_cpu_ns"] == [-3 * MS, 7 * MS, 2 * MS] and isinstance(older["others_cpu_ns"], Absent)
    load = compare_sides([(store, "old")], [(store, "new")]).metric("step_time").load
    assert load is not None
    [base], [cand] = load.baseline_preemption, load.candidate_preemption
    assert base is not None and base.others is None and base.preempted == 1
    assert cand is not None and cand.others == pytest.approx(6 * MS / (30 * MS))
