"""Host breakdown on the project's own CPU/gloo sample traces (in the repo, always run):
exact hand count from the JSON and abstention of the GPU breakdown."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.analysis.absent import NO_GPU_EVENTS, Absent
from stepscope.analysis.breakdown import host_breakdown, step_breakdown
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests._intervals import clip, length, load_trace, subtract, to_ns, union

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
COMM_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms")


def _hand_host(path: Path) -> dict[int, dict[str, int]]:
    trace = load_trace(path)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("dur", 0) > 0]

    def span(e: dict) -> tuple[int, int]:
        start = to_ns(trace, e["ts"])
        return start, start + round(e["dur"] * 1000)

    host = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation", "python_function")]
    data = union([span(e) for e in host if e["name"].startswith("enumerate(DataLoader)#")])
    optim = union([span(e) for e in host if e["name"].startswith(("Optimizer.step#", "Optimizer.zero_grad#"))])
    comm = union([span(e) for e in host if e["name"].startswith(COMM_PREFIXES)])
    compute = union([span(e) for e in host if e["cat"] == "cpu_op" and not e["name"].startswith(COMM_PREFIXES)])
    out = {}
    for e in events:
        if not e["name"].startswith("ProfilerStep#"):
            continue
        w0, w1 = span(e)
        covered: list[tuple[int, int]] = []
        row = {"dur_ns": w1 - w0}
        for name, intervals in (("data_loading_ns", data), ("optimizer_ns", optim),
                                ("compute_ops_ns", compute), ("communication_ops_ns", comm)):
            part = subtract(clip(intervals, w0, w1), covered)
            row[name] = length(part)
            covered = union(covered + part)
        row["other_ns"] = (w1 - w0) - length(covered)
        out[int(e["name"].split("#")[1])] = row
    return out


@pytest.mark.parametrize("folder", ["ddp-gloo-2ranks", "cpu-transformer"])
def test_host_breakdown_matches_a_hand_count(tmp_path: Path, folder: str) -> None:
    files = sorted((SAMPLES / folder).glob("*.json.gz"))
    if not files:
        pytest.skip(f"sample_traces/{folder} is empty")
    report = ingest_paths(files, tmp_path / "store", "s")
    assert report.ok, report.errors
    store = open_store(tmp_path / "store")
    rows = host_breakdown(store, "s").to_pylist()
    for stored in report.stored:
        expected = _hand_host(Path(stored.path))
        got = {r["step"]: {k: r[k] for k in next(iter(expected.values()))} for r in rows if r["rank"] == stored.rank}
        assert got == expected, f"rank {stored.rank}"
    gpu = step_breakdown(store, "s")
    assert isinstance(gpu, Absent) and NO_GPU_EVENTS in gpu.reason
    assert all(r["compute_ops_ns"] > 0 for r in rows)
    if folder == "ddp-gloo-2ranks":
        assert all(r["communication_ops_ns"] > 0 for r in rows)
