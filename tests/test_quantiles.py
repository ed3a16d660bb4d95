"""One median (stepscope/analysis/quantiles.py): an even count's median is the mean of the two
middle values, in Python and in SQL, and the summary and the gate report the same one."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

import duckdb
import numpy as np
import pytest

from stepscope.analysis.quantiles import median, median_sql, quantile, quantile_sql

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "cpu-transformer"


def test_even_count_median_is_the_mean_of_the_middle_two() -> None:
    assert median([40, 10, 30, 20]) == 25 == statistics.median([10, 20, 30, 40])
    assert median([3, 1, 2]) == 2
    values = [5.0, 1.0, 9.5, 2.25, 7.0, 3.0]
    for q in (0, 0.1, 0.25, 0.5, 0.9, 1):
        assert quantile(values, q) == pytest.approx(float(np.percentile(values, 100 * q)))
    with pytest.raises(ValueError):
        median([])


def test_sql_gives_the_same_numbers() -> None:
    values = [5.0, 1.0, 9.5, 2.25, 7.0, 3.0]
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT unnest(?) AS v", [values])
    got = con.sql(f"SELECT {median_sql('v')} AS m, {quantile_sql('v', 0.9)} AS p FROM t").fetchall()[0]
    assert got == pytest.approx((median(values), quantile(values, 0.9)))


def test_summary_and_gate_report_the_same_median_of_an_even_number_of_steps(tmp_path: Path) -> None:
    from stepscope.analysis.compare import compare_runs
    from stepscope.analysis.summary import build_summary
    from stepscope.store import open_store
    from stepscope.store.ingest import ingest_paths

    raw = json.loads(gzip.decompress((SAMPLE / "rank0.pt.trace.json.gz").read_bytes()))
    durs = [round(e["dur"] * 1000) for e in raw["traceEvents"]
            if e.get("ph") == "X" and re.fullmatch(r"ProfilerStep#\d+", e.get("name", ""))]
    assert len(durs) == 2  # even: the lower median and the mean of the middle two differ
    assert ingest_paths([SAMPLE], tmp_path / "s", "cpu").ok
    with open_store(tmp_path / "s") as store:
        stats = build_summary(store, "cpu")["ranks"][0]["step_stats"]
        gate = compare_runs(store, "cpu", store, "cpu").metric("step_time").baseline
    summary_median = next(s["median_ns"] for s in stats if s["source"] == "profiler_steps")
    assert summary_median == gate.median == pytest.approx(sum(durs) / 2, abs=1)
