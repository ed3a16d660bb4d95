"""Steps the collector itself disturbed (``step_times.disturbed_by``) are left out of the step
statistics and of the ``steps.unstable`` finding, which says so; parts written before the
column existed read it as null. Expected values come from ``statistics`` over the rows written
here, never from the code under test."""

from __future__ import annotations

import statistics
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepscope.analysis.kernels import step_stats
from stepscope.analysis.findings import RULES, evaluate
from stepscope.analysis.summary import ranks_section
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from stepscope.store.constants import file_metadata
from stepscope.store.schema import STEP_TIMES
from stepscope.store.writer import part_path, write_partition

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "cpu-transformer" / "rank0.pt.trace.json.gz"
MS = 1_000_000


def _store_with(tmp_path: Path, walls_ms: list[int], disturbed: list[str | None] | None) -> Path:
    root = tmp_path / "store"
    assert ingest_paths([SAMPLE], root, "r").ok
    source = open_store(root).sql("SELECT source FROM sources").column("source")[0].as_py()
    n = len(walls_ms)
    columns = {"source": [source] * n, "step": list(range(n)),
               "start_ns": [sum(walls_ms[:i]) * MS for i in range(n)],
               "wall_ns": [w * MS for w in walls_ms], "gpu_ns": [None] * n,
               "profiled": [False] * n, "tokens": [None] * n, "samples": [None] * n}
    if disturbed is None:  # a part as a collector from before the columns wrote it
        path = part_path(root, "step_times", "r", 0, source)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns).replace_schema_metadata(file_metadata("step_times")), path)
    else:
        write_partition(root, "step_times", "r", 0, source,
                        pa.table({**columns, "cpu_ns": [None] * n, "preemptions": [None] * n, "others_cpu_ns": [None] * n,
                                  "disturbed_by": disturbed})
                        .select([f.name for f in STEP_TIMES]))
    return root


# A steady 100 ms step, the first after the window 475 ms (the collector's export), two steps
# during the conversion 130 ms: none of it the user's doing.
WALLS = [100, 101, 99, 475, 130, 130, 100, 102, 98, 100]
MARKS = [None, None, None, "profiler", "conversion", "conversion", None, None, None, None]


def test_disturbed_steps_are_left_out_of_the_step_statistics(tmp_path: Path) -> None:
    store = open_store(_store_with(tmp_path, WALLS, MARKS))
    [row] = [r for r in step_stats(store, "r").to_pylist() if r["source"] == "step_times"]
    kept = [w * MS for w, m in zip(WALLS, MARKS) if m is None]
    assert (row["steps"], row["disturbed_steps"]) == (len(kept), 3)
    assert (row["min_ns"], row["max_ns"]) == (min(kept), max(kept))
    assert row["median_ns"] == pytest.approx(statistics.median(kept))
    assert row["spread_pct"] == pytest.approx(100 * (max(kept) - min(kept)) / statistics.median(kept))
    # The same steps unmarked: the finding blames the user; marked, it does not fire.
    unmarked = open_store(_store_with(tmp_path / "plain", WALLS, [None] * len(WALLS)))
    assert [f.rule for f in _unstable(unmarked)] == ["steps.unstable"]
    assert _unstable(store) == []


def test_the_finding_says_how_many_steps_it_left_out(tmp_path: Path) -> None:
    walls = [100, 180, 60, 475, 100, 140, 100]  # unsteady on its own, one step marked
    marks = [None, None, None, "profiler", None, None, None]
    [finding] = _unstable(open_store(_store_with(tmp_path, walls, marks)))
    assert "1 steps stepscope itself disturbed" in finding.message and "left out" in finding.message
    kept = [w for w, m in zip(walls, marks) if m is None]
    assert finding.evidence["max_ns"] == max(kept) * MS


def test_parts_without_the_column_read_it_as_null(tmp_path: Path) -> None:
    store = open_store(_store_with(tmp_path, WALLS, None))
    assert store.sql("SELECT count(*) AS n, count(disturbed_by) AS marked FROM step_times"
                     ).to_pylist() == [{"n": len(WALLS), "marked": 0}]
    [row] = [r for r in step_stats(store, "r").to_pylist() if r["source"] == "step_times"]
    assert (row["steps"], row["disturbed_steps"]) == (len(WALLS), 0)


def _unstable(store: object) -> list:
    results = {"ranks": ranks_section(store, "r", None)}
    return [f for f in evaluate(results, [RULES["steps.unstable"]])
            if f.evidence.get("source") == "step_times"]
