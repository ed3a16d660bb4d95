"""comm.arrival_skew (the dashboard's rank x collective heatmap) against the raw JSON."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from stepscope.analysis.comm import arrival_skew
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests import rawmatch
from tests.conftest import load_raw


def test_lateness_per_rank_and_collective_on_two_real_ranks(tmp_path: Path, shared_traces: Path) -> None:
    """trace_filter/sampled_rank-0 and -1: the valid instances (tests/rawmatch.py, the documented
    matching); late = aligned start minus the earliest start of the instance."""
    paths = [shared_traces / f"hta/trace_filter/sampled_rank-{r}.json.gz" for r in (0, 1)]
    assert ingest_paths(paths, tmp_path / "store", "pair").ok
    late: dict[tuple[int, str], list[int]] = defaultdict(list)
    last: dict[tuple[int, str], int] = defaultdict(int)
    for inst in rawmatch.match([load_raw(p) for p in paths]):
        if not inst.valid:
            continue
        first = min(m.aligned for m in inst.members)
        top = max(m.aligned for m in inst.members)
        for m in inst.members:
            late[(m.rank, m.collective)].append(m.aligned - first)
            last[(m.rank, m.collective)] += m.aligned == top and sum(x.aligned == top for x in inst.members) == 1
    rows = {(r["rank"], r["collective"]): r for r in arrival_skew(open_store(tmp_path / "store"), "pair").to_pylist()}
    assert rows.keys() == late.keys() == {(r, c) for r in (0, 1) for c in ("all_reduce", "all_gather")}
    for key, values in late.items():
        assert rows[key]["instances"] == len(values) == 2
        assert rows[key]["mean_late_ns"] == sum(values) / len(values)
        assert rows[key]["max_late_ns"] == max(values)
        assert rows[key]["last_count"] == last[key]
