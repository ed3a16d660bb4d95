"""export_chrome_trace: a rank's events back as Chrome-trace JSON that ingest reads identically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope.store import open_store
from stepscope.store.export import export_chrome_trace, original_trace
from stepscope.store.ingest import ingest_paths
from tests.conftest import load_raw

PER_KIND = """
SELECT kind, category, count(*) AS n, sum(dur_ns) AS dur, sum(ts_ns) AS ts, count(step) AS stepped,
       sum(bytes) AS bytes, count(correlation) AS corr, count(flow_id) AS flows
FROM events {where} GROUP BY ALL ORDER BY ALL
"""


@pytest.mark.shared
@pytest.mark.parametrize("relative", ["hta/trace_diff/control/control.json.gz",
                                      "hta/trace_filter/sampled_rank-1.json.gz"])
def test_export_round_trips_through_ingest(shared_traces: Path, ingested, tmp_path: Path, relative: str) -> None:
    raw = load_raw(shared_traces / relative)
    rank = raw["distributedInfo"]["rank"]
    with open_store(ingested(relative)) as store:
        exported = export_chrome_trace(store, "t", rank)
        before = store.sql(PER_KIND.format(where="WHERE run = 't' AND rank = $rank"), {"rank": rank}).to_pylist()
        steps_before = store.sql("SELECT step, start_ns, end_ns FROM steps ORDER BY step").to_pylist()
    doc = json.loads(exported)
    assert len(doc["traceEvents"]) == len(raw["traceEvents"])  # independent count: the original JSON
    assert doc["distributedInfo"]["rank"] == rank
    target = tmp_path / f"rank-{rank}.pt.trace.json"
    target.write_bytes(exported)
    report = ingest_paths([target], tmp_path / "again", "again")
    assert report.ok, report.errors
    assert report.stored[0].events == len(raw["traceEvents"])
    with open_store(tmp_path / "again") as again:
        assert again.sql(PER_KIND.format(where="")).to_pylist() == before
        assert again.sql("SELECT step, start_ns, end_ns FROM steps ORDER BY step").to_pylist() == steps_before


def test_original_trace_only_when_unchanged(make_trace, tmp_path: Path) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 5, "pid": 1, "tid": 1}]
    path = make_trace("rank-0.json", events)
    ingest_paths([path], tmp_path / "s", "r")
    with open_store(tmp_path / "s") as store:
        assert original_trace(store, "r", 0) == path
        path.write_text(path.read_text().replace("aten::mm", "aten::xx"))
        assert original_trace(store, "r", 0) is None
        path.unlink()
        assert original_trace(store, "r", 0) is None
        assert json.loads(export_chrome_trace(store, "r", 0))["traceEvents"][0]["name"] == "aten::mm"
        with pytest.raises(KeyError):
            export_chrome_trace(store, "r", 7)
