"""Traces as Kineto writes them: device types, memory without totals, host time blocked in a
sync, self time of CPU ops, ProfilerStep#N as the step and not an operator."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.breakdown import host_breakdown
from stepscope.analysis.compare.metrics import peak_memory_samples
from stepscope.store.rankstats.devices import DEVICE_TYPES, device_name, is_accelerator
from stepscope.analysis.kernels import top_cpu_ops
from stepscope.analysis.memory import memory_timeline, step_peaks
from stepscope.analysis.summary import build_summary
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests._intervals import load_trace, to_ns
from tests.conftest import load_raw

MI300 = "tracelens/inference/sglang_decode/capture_traces/bs_32_rank0.json.gz"
RESNET_2021 = "kineto_tb_plugin/old_2021-02/resnet50_profiler_api_num_workers_0.worker0.pt.trace.json.gz"


def test_device_types_follow_c10() -> None:
    """c10/core/DeviceType.h: the numbers are the enum's order; AMD's HIP is 6 and a GPU."""
    assert [d.number for d in DEVICE_TYPES] == list(range(21))
    assert (device_name(0), device_name(1), device_name(6), device_name(19)) == ("CPU", "CUDA", "HIP", "MTIA")
    assert device_name(42) == "device type 42" and device_name(None) == "unknown"
    assert [n for n in range(21) if not is_accelerator(n)] == [0, 2, 5, 14, 17]


def test_amd_memory_is_gpu_memory(ingested, shared_traces: Path) -> None:
    """MI300X trace, [memory] events with Device Type 6 (HIP): the peak is GPU memory, equal to the
    largest Total Allocated in the JSON, against the GPU's capacity; compare gates it as GPU."""
    doc = load_raw(shared_traces / MI300)
    memory = [e["args"] for e in doc["traceEvents"] if e.get("name") == "[memory]"]
    assert {a["Device Type"] for a in memory} == {6}
    store = open_store(ingested(MI300))
    peaks = step_peaks(store, "t").to_pylist()
    assert {(p["device_name"], p["accelerator"]) for p in peaks} == {("HIP", True)}
    assert max(p["peak_allocated_bytes"] for p in peaks) == max(a["Total Allocated"] for a in memory)
    total = doc["deviceProperties"][0]["totalGlobalMem"]
    assert all(p["capacity_bytes"] == total and p["absent_reason"] is None for p in peaks)
    values, label = peak_memory_samples(store, "t")
    assert label == "gpu" and max(values) == max(a["Total Allocated"] for a in memory)
    summary = build_summary(store, "t")
    assert all("host memory" not in str(p.get("absent_reasons")) for p in summary["memory"]["peaks"])


def test_memory_without_totals_is_rebuilt_from_the_deltas(tmp_path: Path, make_trace) -> None:
    """Older traces: [memory] events with Bytes and no Total Allocated/Reserved. The timeline is
    the running sum of the deltas, raised so its minimum is 0 (a free of memory allocated before
    the trace: -64 here), flagged as rebuilt; reserved memory stays unknown."""
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100}
    deltas = [-64, 256, 512, -256, 1024, -512]
    events = [step] + [{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1,
                        "ts": 10 + 10 * i, "args": {"Bytes": b, "Addr": 1000 + i % 3, "Device Type": 1,
                                                     "Device Id": 0}}
                       for i, b in enumerate(deltas)]
    path = make_trace("old.json", events, deviceProperties=[{"id": 0, "name": "GPU", "totalGlobalMem": 10_000}])
    assert ingest_paths([path], tmp_path / "store", "old").ok
    store = open_store(tmp_path / "store")
    running, rebuilt = 0, []
    for b in deltas:
        running += b
        rebuilt.append(running)
    expected = [r - min(min(rebuilt), 0) for r in rebuilt]
    rows = memory_timeline(store, "old", max_points=None).to_pylist()
    assert [r["total_allocated"] for r in rows] == expected == [0, 256, 768, 512, 1536, 1024]
    assert all(r["rebuilt"] and r["total_reserved"] is None and r["ts_ns"] is not None for r in rows)
    bucketed = memory_timeline(store, "old").to_pylist()
    assert max(r["total_allocated"] for r in bucketed) == 1536 and all(r["ts_ns"] is not None for r in bucketed)
    [peak] = step_peaks(store, "old").to_pylist()
    assert peak["peak_allocated_bytes"] == 1536 and peak["capacity_bytes"] == 10_000
    assert "rebuilt from the Bytes deltas" in peak["absent_reason"]


SYNC_TRACE = [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
    {"ph": "X", "cat": "cpu_op", "name": "aten::index", "pid": 1, "tid": 1, "ts": 100, "dur": 500},
    {"ph": "X", "cat": "cpu_op", "name": "aten::nonzero", "pid": 1, "tid": 1, "ts": 150, "dur": 400},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1, "ts": 200, "dur": 300,
     "args": {"correlation": 9}},
    {"ph": "X", "cat": "cuda_runtime", "name": "hipDeviceSynchronize", "pid": 1, "tid": 1, "ts": 700, "dur": 50,
     "args": {"correlation": 10}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "pid": 1, "tid": 1, "ts": 800, "dur": 20,
     "args": {"correlation": 11}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 790, "dur": 100},
]
"""By hand: aten::index [100, 600) holds aten::nonzero [150, 550), which blocks in
cudaStreamSynchronize [200, 500). hipDeviceSynchronize [700, 750) outside any op. aten::mm [790,
890) with a cudaStreamWaitEvent (only enqueues a wait: not blocked) inside."""


def test_host_time_blocked_in_a_sync_is_its_own_part(tmp_path: Path, make_trace) -> None:
    """sync_wait = 300 + 50 us; compute ops = the rest of the ops' union: 500 - 300 + 100 us."""
    assert ingest_paths([make_trace("sync.json", SYNC_TRACE)], tmp_path / "store", "sync").ok
    [row] = host_breakdown(open_store(tmp_path / "store"), "sync").to_pylist()
    assert row["sync_wait_ns"] == 350_000
    assert row["compute_ops_ns"] == 300_000
    assert row["other_ns"] == 1_000_000 - 650_000


def test_cpu_ops_have_self_and_sync_time(tmp_path: Path, make_trace) -> None:
    """aten::index 500 us inclusive, 100 us self (aten::nonzero runs the other 400), 300 us blocked
    in the sync; aten::nonzero: 400 inclusive and self, 300 sync; ProfilerStep#N is no op."""
    events = [{**e, "cat": "cpu_op"} if e["name"].startswith("ProfilerStep") else e for e in SYNC_TRACE]
    assert ingest_paths([make_trace("sync.json", events)], tmp_path / "store", "sync").ok
    rows = {r["name"]: r for r in top_cpu_ops(open_store(tmp_path / "store"), "sync").to_pylist()}
    assert set(rows) == {"aten::index", "aten::nonzero", "aten::mm"}
    assert (rows["aten::index"]["total_ns"], rows["aten::index"]["self_ns"], rows["aten::index"]["sync_ns"]) == (
        500_000, 100_000, 300_000)
    assert (rows["aten::nonzero"]["total_ns"], rows["aten::nonzero"]["self_ns"], rows["aten::nonzero"]["sync_ns"]) == (
        400_000, 400_000, 300_000)
    assert rows["aten::mm"]["sync_ns"] == 0


def _self_times(path: Path) -> dict[str, tuple[int, int]]:
    """name -> (inclusive, self) of the cpu_ops starting inside a step, from the JSON: each op's
    children are the ops nested in it on its thread, one level down (a stack walk)."""
    trace = load_trace(path)
    steps = [(to_ns(trace, e["ts"]), to_ns(trace, e["ts"]) + round(e["dur"] * 1000)) for e in trace["traceEvents"]
             if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    ops: dict[Any, list[tuple[int, int, str]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("cat") in ("cpu_op", "Operator") and e.get("ph") == "X" and "dur" in e \
                and not e["name"].startswith("ProfilerStep#"):
            start = to_ns(trace, e["ts"])
            ops[(e["pid"], e["tid"])].append((start, start + round(e["dur"] * 1000), e["name"]))
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for events in ops.values():
        events.sort(key=lambda x: (x[0], -(x[1] - x[0])))
        stack: list[list[Any]] = []  # [start, end, name, children's time]

        def close(item: list[Any]) -> None:
            if any(a <= item[0] < b for a, b in steps):
                out[item[2]][0] += item[1] - item[0]
                out[item[2]][1] += max(0, item[1] - item[0] - item[3])

        for start, end, name in events:
            while stack and stack[-1][1] <= start:
                close(stack.pop())
            if stack:
                stack[-1][3] += end - start
            stack.append([start, end, name, 0])
        while stack:
            close(stack.pop())
    return {k: (v[0], v[1]) for k, v in out.items()}


@pytest.mark.parametrize("relative", [RESNET_2021, "hta/nccl_parser_config/nccl_data.json.gz"])
def test_self_time_matches_a_stack_walk_over_the_json(ingested, shared_traces: Path, relative: str) -> None:
    """The 2021 ResNet-50 (ProfilerStep#N is an Operator there, thread ids are strings) and a
    2023 NCCL trace: inclusive and self time of the top ops, by a stack walk over the raw events."""
    expected = _self_times(shared_traces / relative)
    rows = top_cpu_ops(open_store(ingested(relative)), "t", n=15).to_pylist()
    assert rows and all(not r["name"].startswith("ProfilerStep#") for r in rows)
    assert any(r["self_ns"] < r["total_ns"] for r in rows)
    for r in rows:
        assert (r["total_ns"], r["self_ns"]) == expected[r["name"]], r["name"]
