"""Memory analysis on real traces, every number checked against the raw ``[memory]`` events."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis import Absent, evaluate
from stepscope.analysis.findings import RULES
from stepscope.analysis.memory import (
    largest_allocations,
    live_at_peak,
    memory_section,
    memory_timeline,
    role_allocations,
    roles_at_peak,
    snapshot_blocks,
    snapshot_summary,
    step_peaks,
)
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests.conftest import load_raw, write_trace
from tests.rawcalc import profiler_steps, span_ns

DFI = "hta/df_index_resolver/df_index_resolver.json.gz"  # V100 32 GB, 5 steps, 28k [memory] events


def _raw_memory(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """[memory] events as dicts with absolute ns, in time order (file order on ties)."""
    out = []
    for e in doc["traceEvents"]:
        if e.get("name") != "[memory]":
            continue
        a = e["args"]
        out.append({"ts": span_ns(doc, {**e, "dur": 0})[0], "addr": a["Addr"], "bytes": a["Bytes"],
                    "alloc": a["Total Allocated"], "reserved": a["Total Reserved"],
                    "dtype": a["Device Type"], "dev": a["Device Id"], "tid": e["tid"]})
    return sorted(out, key=lambda m: m["ts"])


def _allocations(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Allocation/free pairs: an allocation is freed by the next event at its address."""
    by_addr: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for m in events:
        by_addr[(m["dtype"], m["dev"], m["addr"])].append(m)
    allocs = []
    for seq in by_addr.values():
        for i, m in enumerate(seq):
            if m["bytes"] > 0:
                nxt = seq[i + 1] if i + 1 < len(seq) else None
                allocs.append({**m, "free": nxt["ts"] if nxt and nxt["bytes"] < 0 else None})
    return allocs


@pytest.fixture(scope="module")
def dfi(shared_traces: Path, ingested):
    """The trace's store (run ``t``, the session's shared ingest), its raw JSON and [memory] events."""
    doc = load_raw(shared_traces / DFI)
    return open_store(ingested(DFI)), doc, _raw_memory(doc)


def test_step_peaks_match_raw(dfi) -> None:
    store, doc, events = dfi
    steps = profiler_steps(doc)
    capacity = next(p["totalGlobalMem"] for p in doc["deviceProperties"] if p["id"] == 1)
    expected = {}
    for m in events:
        step = next((s for s, a, b in steps if a <= m["ts"] < b), None)
        key = (m["dtype"], m["dev"], step)
        cur = expected.setdefault(key, {"peak": m["alloc"], "ts": m["ts"], "reserved": m["reserved"], "n": 0})
        cur["n"] += 1
        cur["reserved"] = max(cur["reserved"], m["reserved"])
        if m["alloc"] > cur["peak"]:
            cur["peak"], cur["ts"] = m["alloc"], m["ts"]
    rows = step_peaks(store, "t").to_pylist()
    got = {(r["device_type"], r["device"], r["step"]):
           {"peak": r["peak_allocated_bytes"], "ts": r["peak_ts_ns"], "reserved": r["peak_reserved_bytes"], "n": r["events"]}
           for r in rows}
    assert got == expected
    for r in rows:
        if r["device_type"] == 1:
            assert r["capacity_bytes"] == capacity
            assert r["peak_allocated_pct"] == pytest.approx(100 * r["peak_allocated_bytes"] / capacity)
            assert r["peak_reserved_pct"] == pytest.approx(100 * r["peak_reserved_bytes"] / capacity)
        else:
            assert r["capacity_bytes"] is None and r["absent_reason"] == "host memory: no device capacity"


def test_phase_and_ops_at_peak(dfi) -> None:
    """The GPU peaks happen in backward: read the enclosing ops of the peak event from the JSON."""
    store, doc, events = dfi
    host = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
            and not e["name"].startswith("ProfilerStep#")]
    for r in step_peaks(store, "t").to_pylist():
        if r["device_type"] != 1:
            continue
        peak = next(m for m in events if m["ts"] == r["peak_ts_ns"] and m["alloc"] == r["peak_allocated_bytes"])
        enclosing = sorted((e for e in host if e["tid"] == peak["tid"]
                            and span_ns(doc, e)[0] <= peak["ts"] <= span_ns(doc, e)[1]),
                           key=lambda e: (e["ts"], -e["dur"]))
        assert r["ops_at_peak"] == [e["name"] for e in enclosing]
        assert r["ops_at_peak"][0].startswith("autograd::engine::evaluate_function:")
        assert r["phase"] == "backward"


def test_live_at_peak_and_largest_allocations_match_raw(dfi) -> None:
    store, doc, events = dfi
    allocs = _allocations(events)
    gpu = [m for m in events if m["dtype"] == 1]
    top = max(m["alloc"] for m in gpu)
    peak_ts = min(m["ts"] for m in gpu if m["alloc"] == top)
    live = [a for a in allocs if a["dtype"] == 1 and a["ts"] <= peak_ts and (a["free"] is None or a["free"] > peak_ts)]
    live.sort(key=lambda a: (-a["bytes"], a["ts"]))
    rows = [r for r in live_at_peak(store, "t", top=10).to_pylist() if r["device_type"] == 1]
    assert [(r["bytes"], r["addr"], r["alloc_ts_ns"], r["free_ts_ns"]) for r in rows] == [
        (a["bytes"], a["addr"], a["ts"], a["free"]) for a in live[:10]]
    assert all(r["peak_ts_ns"] == peak_ts and r["role"] == "other" for r in rows)
    assert all(r["allocated_by"] for r in rows)
    largest = sorted((a for a in allocs if a["dtype"] == 1), key=lambda a: (-a["bytes"], a["ts"]))[:10]
    rows = [r for r in largest_allocations(store, "t", top=10).to_pylist() if r["device_type"] == 1]
    assert [(r["bytes"], r["alloc_ts_ns"], r["free_ts_ns"]) for r in rows] == [
        (a["bytes"], a["ts"], a["free"]) for a in largest]


def test_timeline_keeps_every_peak(dfi) -> None:
    store, _, events = dfi
    full = memory_timeline(store, "t", max_points=None).to_pylist()
    assert len(full) == len(events)
    for dtype in (0, 1):
        raw = [m for m in events if m["dtype"] == dtype]
        thin = [r for r in memory_timeline(store, "t", max_points=50).to_pylist() if r["device_type"] == dtype]
        assert 0 < len(thin) <= 50
        assert max(r["total_allocated"] for r in thin) == max(m["alloc"] for m in raw)
        assert max(r["total_reserved"] for r in thin) == max(m["reserved"] for m in raw)


def test_roles_and_snapshot_abstain_on_plain_traces(dfi) -> None:
    store, _, _ = dfi
    assert isinstance(roles_at_peak(store, "t"), Absent)
    assert isinstance(snapshot_summary(store, "t"), Absent)
    result = memory_section(store, "t", None)
    assert isinstance(result.roles, Absent) and "model=" in result.roles.reason


def test_section_abstains_without_memory_events(ingested) -> None:
    result = memory_section(open_store(ingested("hta/nccl_parser_config/nccl_data.json.gz")), "t", None)
    assert isinstance(result, Absent) and "profile_memory" in result.reason


def test_near_capacity_rule_quiet_on_the_recorded_device(dfi) -> None:
    """V100 32 GB: peak 6.6 GB allocated, 12.8 GB reserved (37%)."""
    store, _, _ = dfi
    assert evaluate({"memory": memory_section(store, "t", None)}, [RULES["memory.near_capacity"]]) == []


def test_near_capacity_rule_fires_on_a_smaller_device(dfi, tmp_path) -> None:
    """The same trace, its device declared with 13.5 GB: the 12.78 GB reserved is 94.7%."""
    _, doc, events = dfi
    small = dict(doc)
    small["deviceProperties"] = [{**p, "totalGlobalMem": 13_500_000_000} for p in doc["deviceProperties"]]
    path = write_trace(tmp_path / "small.json.gz", doc["traceEvents"],
                       **{k: v for k, v in small.items() if k != "traceEvents"})
    assert ingest_paths([path], tmp_path / "store", "small").ok
    found = evaluate({"memory": memory_section(open_store(tmp_path / "store"), "small", None)},
                     [RULES["memory.near_capacity"]])
    reserved = max(m["reserved"] for m in events if m["dtype"] == 1)
    allocated = max(m["alloc"] for m in events if m["dtype"] == 1)
    assert len(found) == 1
    assert found[0].evidence["peak_reserved_pct"] == pytest.approx(100 * reserved / 13.5e9)
    assert found[0].evidence["peak_allocated_pct"] == pytest.approx(100 * allocated / 13.5e9)
    assert found[0].message == (f"rank 1: memory peaks at {100 * allocated / 13.5e9:.0f}% of device capacity "
                                f"allocated, {100 * reserved / 13.5e9:.0f}% reserved in backward (worst: rank 1, "
                                f"GPU 1 step 2, {allocated / 1024**3:.2f} of {13.5e9 / 1024**3:.2f} GiB)")
    assert found[0].ranks == (1,) and found[0].time_at_stake_ns is None


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """A real single-process CPU training run under stepscope.profile with model= and optimizer=
    (examples/train_cpu.py): the collector records memory roles; ~15 s on 2 cores."""
    pytest.importorskip("torch")
    from tests.collector_support import EXAMPLES  # noqa: F401  (puts examples/ on sys.path)
    import train_cpu

    root = tmp_path_factory.mktemp("cpu")
    train_cpu.train(root / "store", "cpu", steps=6, wait=1, warmup=1, active=2, trace_dir=root / "traces")
    return open_store(root / "store"), load_raw(root / "traces" / "rank0.pt.trace.json.gz")


@pytest.mark.slow
def test_gradient_allocations_are_labelled_each_step(cpu_run) -> None:
    """zero_grad(set_to_none=True) frees the gradients, so every recorded step allocates each
    one again: exactly one labelled allocation per parameter, of the parameter's size."""
    import toy_transformer

    model, _ = toy_transformer.build(toy_transformer.ToyConfig())
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    n_params = len(list(model.parameters()))
    store, _ = cpu_run
    rows = role_allocations(store, "cpu").to_pylist()
    gradient = [(r["step"], r["allocations"], r["bytes"]) for r in rows if r["role"] == "gradient"]
    assert gradient == [(2, n_params, param_bytes), (3, n_params, param_bytes)]
    assert {r["role"] for r in rows} == {"gradient", "other"}  # params/optimizer state predate the trace


@pytest.mark.slow
def test_roles_at_peak_match_raw(cpu_run) -> None:
    """Live bytes per role at the peak, recomputed from the raw [memory] events and the role
    ranges; the recorded bytes per role from the model itself."""
    import toy_transformer

    model, optimizer = toy_transformer.build(toy_transformer.ToyConfig())
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    store, doc = cpu_run
    events = _raw_memory(doc)
    ranges = store.sql("SELECT m.role, m.addr, m.bytes, s.end_ns, m.step FROM memory_roles m "
                       "LEFT JOIN steps s USING (source, step)").to_pylist()
    last_ts = max(m["ts"] for m in events)
    top = max(m["alloc"] for m in events)
    peak_ts = min(m["ts"] for m in events if m["alloc"] == top)
    live = defaultdict(int)
    for a in _allocations(events):
        if not (a["ts"] <= peak_ts and (a["free"] is None or a["free"] > peak_ts)):
            continue
        role = next((r["role"] for r in ranges if r["addr"] <= a["addr"] < r["addr"] + r["bytes"]
                     and a["ts"] <= (r["end_ns"] or last_ts) and (a["free"] is None or a["free"] > (r["end_ns"] or last_ts))),
                    "other")
        live[role] += a["bytes"]
    rows = {r["role"]: r for r in roles_at_peak(store, "cpu").to_pylist()}
    for role in ("parameter", "gradient", "optimizer_state", "other"):
        assert rows[role]["live_bytes"] == live.get(role, 0), role
    assert rows["untracked"]["live_bytes"] == top - sum(live.values())
    assert rows["parameter"]["recorded_bytes"] == param_bytes == rows["gradient"]["recorded_bytes"]
    # AdamW: exp_avg and exp_avg_sq (parameter-sized) plus a 4-byte step per parameter
    n_params = len(list(model.parameters()))
    assert rows["optimizer_state"]["recorded_bytes"] == 2 * param_bytes + 4 * n_params


@pytest.mark.slow
def test_every_column_and_rule_is_documented(dfi, cpu_run) -> None:
    from tests.test_analysis_comm import _doc_section

    section = _doc_section("Memory")
    store, _, _ = dfi
    cpu_store, _ = cpu_run
    frames = [memory_timeline(store, "t"), step_peaks(store, "t"), live_at_peak(store, "t"),
              largest_allocations(store, "t"), roles_at_peak(cpu_store, "cpu"), role_allocations(cpu_store, "cpu")]
    for frame in frames:
        for column in frame.column_names:
            assert column in section, f"column {column} is not in docs/ANALYSIS.md"
    assert "`memory.near_capacity`" in _doc_section("Findings of communication, copies and memory")


def test_snapshot_summary_matches_the_pickle(shared_traces: Path, tmp_path) -> None:
    """A real ``torch.cuda.memory._snapshot()`` (memsnap/) stored as the collector stores it,
    summarised, and recounted straight from the unpickled dict."""
    from stepscope.collector.memory_snapshot import load_snapshot, snapshot_table
    from stepscope.store.writer import write_partition

    snapshot = load_snapshot(shared_traces / "memsnap/magma27_cs336/memory_snapshot.pickle")
    trace = write_trace(tmp_path / "rank0.json", [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1,
                                                    "ts": 1.0, "dur": 1.0}], distributedInfo={"rank": 0})
    report = ingest_paths([trace], tmp_path / "store", "snap")
    assert report.ok
    source = report.stored[0].source
    write_partition(tmp_path / "store", "memory_snapshot", "snap", 0, source, snapshot_table(snapshot, source))
    store = open_store(tmp_path / "store")
    blocks = [b for seg in snapshot["segments"] for b in seg["blocks"]]
    active = [b for b in blocks if b["state"] == "active_allocated"]
    rows = snapshot_summary(store, "snap").to_pylist()
    assert rows == [{
        "run": "snap", "rank": 0, "device": 0,
        "segments": len(snapshot["segments"]),
        "reserved_bytes": sum(seg["total_size"] for seg in snapshot["segments"]),
        "active_bytes": sum(b["size"] for b in active),
        "inactive_bytes": sum(b["size"] for b in blocks if b["state"] == "inactive"),
        "largest_block_bytes": max(b["size"] for b in active),
        "ooms": sum(1 for t in snapshot["device_traces"] for e in t if e["action"] == "oom"),
    }]
    largest = sorted(active, key=lambda b: (-b["size"], b["address"]))[:5]
    got = snapshot_blocks(store, "snap", top=5).to_pylist()
    assert [(r["bytes"], r["addr"], r["requested_bytes"]) for r in got] == [
        (b["size"], b["address"], b["requested_size"]) for b in largest]
    assert [r["frames"] is not None for r in got] == [bool(b.get("frames")) for b in largest]
    result = memory_section(store, "snap", None)
    assert result.peaks.num_rows == 0 and not isinstance(result.snapshot, Absent)
    from tests.test_analysis_comm import _doc_section

    documented = _doc_section("Memory")
    for frame in (snapshot_summary(store, "snap"), snapshot_blocks(store, "snap")):
        assert all(column in documented for column in frame.column_names)
