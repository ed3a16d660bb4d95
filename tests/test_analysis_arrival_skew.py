"""comm.arrival_skew (the dashboard's rank x collective heatmap) against the raw JSON."""

from __future__ import annotations

from pathlib import Path

from stepscope.analysis.comm import arrival_skew
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests.conftest import load_raw
from tests.rawcalc import comm_kernels, profiler_steps, span_ns


def test_lateness_per_rank_and_collective_on_two_real_ranks(tmp_path: Path, shared_traces: Path) -> None:
    """trace_filter/sampled_rank-0 and -1: kernels matched by (step of their launch, order in the
    step), as the comm analysis documents; late = start minus the earliest start of the pair."""
    paths = [shared_traces / f"hta/trace_filter/sampled_rank-{r}.json.gz" for r in (0, 1)]
    assert ingest_paths(paths, tmp_path / "store", "pair").ok
    starts = []
    for path in paths:
        doc = load_raw(path)
        steps = profiler_steps(doc)
        launch = {e["args"]["correlation"]: span_ns(doc, e)[0] for e in doc["traceEvents"]
                  if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
        by_step: dict[int, list[int]] = {}
        for k in comm_kernels(doc):
            t = launch[k["args"]["correlation"]]
            by_step.setdefault(next(s for s, a, b in steps if a <= t < b), []).append(span_ns(doc, k)[0])
        starts.append([s for step in sorted(by_step) for s in by_step[step]])
    assert len(starts[0]) == len(starts[1]) == 10
    late = [[s - min(pair) for s in pair] for pair in zip(*starts)]
    rows = {r["rank"]: r for r in arrival_skew(open_store(tmp_path / "store"), "pair").to_pylist()}
    assert set(rows) == {0, 1}
    for rank in (0, 1):
        mine = [pair[rank] for pair in late]
        assert rows[rank]["collective"] == "send_recv"
        assert rows[rank]["instances"] == 10
        assert rows[rank]["mean_late_ns"] == sum(mine) / 10
        assert rows[rank]["max_late_ns"] == max(mine)
        assert rows[rank]["last_count"] == sum(1 for pair in late if pair[rank] > pair[1 - rank])
