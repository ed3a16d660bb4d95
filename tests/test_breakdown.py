"""Step breakdown, host breakdown and totals: invariants on every shared trace with steps and GPU
work, exact hand counts from the raw JSON, and abstention where a figure cannot be computed."""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from stepscope.analysis.absent import NO_GPU_EVENTS, NO_STEPS, Absent
from stepscope.analysis.breakdown import host_breakdown, rank_totals, step_breakdown, step_windows
from stepscope.store.rankstats.parts import GPU, HOST
from stepscope.store import open_store
from tests._intervals import clip, intersect, length, load_trace, subtract, to_ns, union

pytestmark = pytest.mark.shared

# Every Kineto trace in ../shared/traces that has ProfilerSteps and GPU work (MANIFEST.md, and
# checked by test_the_list_of_breakdown_traces_is_complete below).
GPU_STEP_TRACES = [
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta/call_stack/backward_thread.json",
    "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/negative_queue_length_values_check/rank0.json.gz",
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta/trace_compare/base/base.json.gz",
    "hta/trace_compare/test/test.json.gz",
    "hta/trace_diff/control/control.json.gz",
    "hta/trace_diff/test/test.json.gz",
    "hta/trace_filter/sampled_rank-0.json.gz",
    "hta/trace_filter/sampled_rank-1.json.gz",
    "hta/triton_example/triton_example.json.gz",
    "kineto_tb_plugin/old_2021-02/resnet50_profiler_api_num_workers_0.worker0.pt.trace.json.gz",
    "kineto_tb_plugin/test/gpu_metrics_expected.json",
    "kineto_tb_plugin/test/gpu_metrics_input.json",
    "tracelens/inference/sglang_decode/capture_traces/bs_32_rank0.json.gz",
    "tracelens/inference/xdit_flux.1_aiter_sage/profile_trace_rank_0.json.gz",
    "tracelens/inference/xdit_sd_3.5/profile_trace_rank_0.json.gz",
    "tracelens/mi300/resnet_act_checkpoint.json.gz",
]


def _rows(table: Any) -> list[dict[str, Any]]:
    assert not isinstance(table, Absent), table
    return table.to_pylist()


@pytest.mark.parametrize("relative", GPU_STEP_TRACES)
def test_step_parts_are_disjoint_and_sum_exactly_to_the_step(ingested: Callable[[str], Path], relative: str) -> None:
    store = open_store(ingested(relative))
    rows = _rows(step_breakdown(store, "t"))
    assert rows
    previous_end: dict[int, int] = {}
    for row in rows:
        parts = [row[c] for c in GPU.columns]
        assert all(p >= 0 for p in parts), row
        assert sum(parts) == row["dur_ns"] == row["end_ns"] - row["start_ns"], row
        assert sum(row[leaf.column] for leaf in GPU.leaves()) == row["dur_ns"], row
        for part in GPU.parts:
            if part.sub_parts:  # e.g. idle = host wait + kernel wait + other
                assert sum(row[s.column] for s in part.sub_parts) == row[part.column], (part.name, row)
                assert all(row[s.column] >= 0 for s in part.sub_parts), (part.name, row)
        assert 0 <= row["comm_overlapped_ns"] <= row["compute_ns"], row
        # The window holds the CPU step (unless an earlier step's GPU work ran past its start)
        # and never overlaps the previous window.
        assert row["start_ns"] >= previous_end.get(row["rank"], row["start_ns"]), row
        assert row["end_ns"] >= row["cpu_start_ns"] + row["cpu_dur_ns"], row
        previous_end[row["rank"]] = row["end_ns"]


@pytest.mark.parametrize("relative", GPU_STEP_TRACES)
def test_host_parts_are_disjoint_and_sum_exactly_to_the_step(ingested: Callable[[str], Path], relative: str) -> None:
    rows = _rows(host_breakdown(open_store(ingested(relative)), "t"))
    for row in rows:
        parts = [row[c] for c in HOST.columns]
        assert all(p >= 0 for p in parts), row
        assert sum(parts) == row["dur_ns"], row


def test_the_list_of_breakdown_traces_is_complete(shared_traces: Path) -> None:
    """Every shared trace with ProfilerSteps and GPU events is in GPU_STEP_TRACES (found by a
    byte scan of the raw files, not through the store), so the invariants run on all of them."""
    gpu_cat = re.compile(rb'"cat"\s*:\s*"(kernel|gpu_memcpy|gpu_memset|Kernel|Memcpy|Memset)"')
    found = []
    for path in sorted(shared_traces.rglob("*")):
        if not path.name.endswith((".json", ".json.gz")) or "execution_details" in path.name or path.name.endswith("_et.json.gz"):
            continue
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        if b'"ProfilerStep#' in data and gpu_cat.search(data):
            found.append(str(path.relative_to(shared_traces)))
    assert found == sorted(GPU_STEP_TRACES)


# ---- hand counts: an independent interval union straight from the JSON ----

_GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


def _hand_breakdown(path: Path) -> dict[int, dict[str, int]]:
    """Per-step GPU breakdown from the raw JSON: merge each class into a union, then subtract
    the unions of higher priority (not a sweep, unlike the SQL)."""
    trace = load_trace(path)
    events = trace["traceEvents"]
    steps = sorted(
        (to_ns(trace, e["ts"]), to_ns(trace, e["ts"]) + round(e["dur"] * 1000), int(e["name"].split("#")[1]))
        for e in events
        if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"
    )
    launch = {
        e["args"]["correlation"]: to_ns(trace, e["ts"])
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }

    def step_at(t: int) -> int | None:
        return next((n for s0, s1, n in steps if s0 <= t < s1), None)

    classes: dict[str, list[tuple[int, int]]] = {k: [] for k in ("compute", "comm", "h2d", "d2h", "d2d", "other", "memset")}
    gpu_end: dict[int, int] = {}
    first_launch: dict[int, int] = {}  # GPU start time -> earliest recorded launch of work starting then
    for e in events:
        kind = _GPU_CATS.get(e.get("cat", ""))
        if kind is None or e.get("dur", 0) <= 0:
            continue
        t0 = to_ns(trace, e["ts"])
        t1 = t0 + round(e["dur"] * 1000)
        name = e["name"]
        if kind == "kernel":
            cls = "comm" if name.startswith("nccl") else "compute"
        elif kind == "memset":
            cls = "memset"
        else:
            cls = next((c for c, key in (("h2d", "HtoD"), ("d2h", "DtoH"), ("d2d", "DtoD")) if key in name), "other")
        classes[cls].append((t0, t1))
        launched = launch.get(e.get("args", {}).get("correlation"))
        if launched is not None:
            first_launch[t0] = min(first_launch.get(t0, launched), launched)
        step = step_at(launched) if launched is not None else step_at(t0)
        if step is not None:
            gpu_end[step] = max(gpu_end.get(step, t1), t1)
    unions = {k: union(v) for k, v in classes.items()}
    # HTA's idle causes on the gaps between islands of GPU work (all streams together).
    busy = union([i for v in classes.values() for i in v])
    gaps = [(None, busy[0][0])] + [(a[1], b[0]) for a, b in zip(busy, busy[1:])] + [(busy[-1][1], None)]

    def cause(g0: int | None, g1: int | None) -> str:
        launched = first_launch.get(g1) if g1 is not None else None
        if g0 is None or g1 is None or (launched is not None and launched > g0):
            return "idle_host_wait_ns"
        return "idle_kernel_wait_ns" if g1 - g0 < 30_000 else "idle_other_ns"

    caused = [(g0, g1, cause(g0, g1)) for g0, g1 in gaps]
    out: dict[int, dict[str, int]] = {}
    prev_end: int | None = None
    for s0, s1, n in steps:
        w0 = s0 if prev_end is None else max(s0, prev_end)
        w1 = max(s1, gpu_end.get(n, s1), w0)
        prev_end = w1
        covered = clip(unions["compute"], w0, w1)
        row = {"dur_ns": w1 - w0, "compute_ns": length(covered)}
        row["comm_overlapped_ns"] = length(intersect(clip(unions["comm"], w0, w1), covered))
        compute_or_comm = union(covered + clip(unions["comm"], w0, w1))
        copies = union([i for k in ("h2d", "d2h", "d2d", "other") for i in clip(unions[k], w0, w1)])
        row["memcpy_overlapped_ns"] = length(intersect(copies, compute_or_comm))
        for cls, column in (
            ("comm", "comm_exposed_ns"),
            ("h2d", "memcpy_h2d_exposed_ns"),
            ("d2h", "memcpy_d2h_exposed_ns"),
            ("d2d", "memcpy_d2d_exposed_ns"),
            ("other", "memcpy_other_exposed_ns"),
            ("memset", "memset_exposed_ns"),
        ):
            exposed = subtract(clip(unions[cls], w0, w1), covered)
            row[column] = length(exposed)
            covered = union(covered + exposed)
        row["idle_ns"] = (w1 - w0) - length(covered)
        for key in ("idle_host_wait_ns", "idle_kernel_wait_ns", "idle_other_ns"):
            row[key] = sum(
                max(0, min(w1, g1 if g1 is not None else w1) - max(w0, g0 if g0 is not None else w0))
                for g0, g1, c in caused if c == key
            )
        out[n] = row
    return out


@pytest.mark.parametrize(
    "relative",
    [
        "hta/df_index_resolver/df_index_resolver.json.gz",  # NCCL all-reduce, D2D copies
        "hta/trace_diff/control/control.json.gz",  # H2D, D2H, D2D, comm under compute
        "hta/nccl_parser_config/nccl_data.json.gz",  # fractional-us timestamps
        "hta/negative_queue_length_values_check/rank0.json.gz",  # idle mostly 'other', CUDA graphs
    ],
)
def test_step_breakdown_matches_a_hand_count_from_the_json(
    ingested: Callable[[str], Path], shared_traces: Path, relative: str
) -> None:
    expected = _hand_breakdown(shared_traces / relative)
    rows = {row["step"]: row for row in _rows(step_breakdown(open_store(ingested(relative)), "t"))}
    assert sorted(rows) == sorted(expected)
    for step, hand in expected.items():
        got = {k: rows[step][k] for k in hand}
        assert got == hand, f"step {step}"


# ---- abstention ----


def test_cpu_only_trace_has_no_gpu_breakdown_but_a_host_one(ingested: Callable[[str], Path]) -> None:
    store = open_store(ingested("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"))
    assert step_breakdown(store, "t") == Absent(NO_GPU_EVENTS)
    totals = rank_totals(store, "t").to_pylist()
    assert [(r["rank"], r["gpu_span_ns"], r["compute_ns"], r["absent_reason"]) for r in totals] == [
        (34, None, None, NO_GPU_EVENTS)
    ]
    host = _rows(host_breakdown(store, "t"))
    assert [r["step"] for r in host] == [551]


def test_gpu_trace_without_steps_has_totals_but_no_step_breakdown(ingested: Callable[[str], Path]) -> None:
    store = open_store(ingested("param/linear_kineto.json.gz"))
    assert step_breakdown(store, "t") == Absent(NO_STEPS)
    assert host_breakdown(store, "t") == Absent(NO_STEPS)
    [totals] = rank_totals(store, "t").to_pylist()
    assert totals["gpu_span_ns"] > 0 and totals["absent_reason"] is None
    assert step_windows(store, "t").num_rows == 0


def test_missing_rank_is_absent_with_the_ranks_present(ingested: Callable[[str], Path]) -> None:
    store = open_store(ingested("hta/df_index_resolver/df_index_resolver.json.gz"))
    result = step_breakdown(store, "t", ranks=[5])
    assert isinstance(result, Absent)
    assert re.search(r"rank 5 is not in this run \(ranks present: 1\)", result.reason)
    assert rank_totals(store, "t", ranks=[5]).num_rows == 0
