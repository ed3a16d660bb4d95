"""Copies (H2D / D2H / D2D) on real traces, every number checked against the raw JSON."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from stepscope.analysis import Absent, evaluate
from stepscope.analysis.copies import copies_section, copy_events, copy_summary
from stepscope.analysis.breakdown import step_breakdown
from stepscope.analysis.findings import RULES
from stepscope.analysis.summary import ranks_section
from stepscope.store import open_store
from stepscope.units import bandwidth, size
from tests.conftest import load_raw
from tests.rawcalc import compute_union, covered, profiler_steps, span_ns

RESNET = "param/resnet_kineto.json.gz"  # RTX 2080 Ti, 61 pageable H2D copies
CONTROL = "hta/trace_diff/control/control.json.gz"  # A100, pinned H2D, pageable D2H
NEGQ = "hta/negative_queue_length_values_check/rank0.json.gz"  # A100, pinned and pageable H2D
DIRECTION = {"HtoD": "h2d", "DtoH": "d2h", "DtoD": "d2d"}


def _raw_copies(doc):
    """(start_ns, end_ns, direction, host memory, bytes) of every memcpy, in time order."""
    out = []
    for e in doc["traceEvents"]:
        if e.get("cat") != "gpu_memcpy":
            continue
        direction = DIRECTION[e["name"].split()[1]]
        host = "pageable" if "Pageable" in e["name"] else "pinned" if "Pinned" in e["name"] else None
        out.append((*span_ns(doc, e), direction, host, e["args"]["bytes"], e))
    return sorted(out, key=lambda c: c[:2])


@pytest.mark.parametrize("relative", [RESNET, CONTROL, NEGQ])
def test_each_copy_matches_raw_json(ingested, shared_traces: Path, relative) -> None:
    doc = load_raw(shared_traces / relative)
    islands = compute_union(doc)
    raw = _raw_copies(doc)
    rows = copy_events(open_store(ingested(relative)), "t").to_pylist()
    assert len(rows) == len(raw) > 0
    got = sorted(rows, key=lambda r: (r["ts_ns"], r["ts_ns"] + r["dur_ns"]))
    for row, (start, end, direction, host, nbytes, _) in zip(got, raw):
        assert (row["ts_ns"], row["dur_ns"], row["direction"], row["host_memory"], row["bytes"]) == (
            start, end - start, direction, host, nbytes)
        assert row["hidden_ns"] == covered(start, end, islands)
        if end > start:
            assert row["bandwidth_gbps"] == pytest.approx(nbytes / (end - start), rel=1e-12)
        else:
            assert row["bandwidth_gbps"] is None and row["absent_reason"]


def test_link_peak_from_gpu_name(ingested) -> None:
    """RTX 2080 Ti: PCIe Gen3 x16 (16 GB/s); A100: Gen4 (32 GB/s); D2D copies: no host link."""
    for relative, link, peak in ((RESNET, "PCIe Gen3 x16", 16.0), (CONTROL, "PCIe Gen4 x16", 32.0)):
        rows = copy_events(open_store(ingested(relative)), "t").to_pylist()
        host = [r for r in rows if r["direction"] in ("h2d", "d2h")]
        assert host and all(r["link"] == link and r["peak_gbps"] == peak for r in host)
        for r in host:
            if r["bandwidth_gbps"] is not None:
                assert r["pct_of_peak"] == pytest.approx(100 * r["bandwidth_gbps"] / peak)
        device = [r for r in rows if r["direction"] == "d2d"]
        assert device and all(r["peak_gbps"] is None and "device-side" in r["absent_reason"] for r in device)


def test_unknown_gpu_abstains_from_peak(ingested) -> None:
    """sampled_rank-0 records no deviceProperties: no GPU name, so no peak (never a guess)."""
    rows = copy_events(open_store(ingested("hta/trace_filter/sampled_rank-0.json.gz")), "t").to_pylist()
    host = [r for r in rows if r["direction"] == "h2d"]
    assert host and all(r["peak_gbps"] is None and r["pct_of_peak"] is None for r in host)
    assert all("no host-link peak known" in r["absent_reason"] for r in host if r["dur_ns"] > 0)


@pytest.mark.parametrize("relative", [CONTROL, NEGQ])
def test_totals_and_per_step_match_raw_json(ingested, shared_traces: Path, relative) -> None:
    doc = load_raw(shared_traces / relative)
    events = doc["traceEvents"]
    steps = profiler_steps(doc)

    def step_at(t: int) -> int | None:
        return next((s for s, a, b in steps if a <= t < b), None)

    # docs/STORE.md: GPU work takes the step of its launch; without a recorded launch (140 D2D
    # copies of negative_queue have none), the step its own start falls in.
    launch_step = {e["args"]["correlation"]: step_at(span_ns(doc, e)[0]) for e in events
                   if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    islands = compute_union(doc)
    totals = defaultdict(lambda: [0, 0, 0, 0])
    per_step = defaultdict(lambda: [0, 0, 0, 0])
    for start, end, direction, host, nbytes, e in _raw_copies(doc):
        for acc in (totals[(direction, host)], per_step[(launch_step.get(e["args"]["correlation"], step_at(start)), direction, host)]):
            acc[0] += 1
            acc[1] += nbytes
            acc[2] += end - start
            acc[3] += covered(start, end, islands)
    store = open_store(ingested(relative))
    got_totals = {(r["direction"], r["host_memory"]): [r["count"], r["bytes"], r["dur_ns"], r["hidden_ns"]]
                  for r in copy_summary(store, "t", per_step=False).to_pylist()}
    assert got_totals == dict(totals)
    got_steps = {(r["step"], r["direction"], r["host_memory"]): [r["count"], r["bytes"], r["dur_ns"], r["hidden_ns"]]
                 for r in copy_summary(store, "t").to_pylist()}
    assert got_steps == dict(per_step)


def test_bandwidth_distribution(ingested, shared_traces: Path) -> None:
    """Median and spread of per-copy bandwidth, against a sort of the raw values."""
    doc = load_raw(shared_traces / RESNET)
    bws = sorted(nbytes / (end - start) for start, end, d, h, nbytes, _ in _raw_copies(doc)
                 if d == "h2d" and end > start)
    row = next(r for r in copy_summary(open_store(ingested(RESNET)), "t", per_step=False).to_pylist()
               if r["direction"] == "h2d")

    def quantile(q: float) -> float:  # linear interpolation, as quantile_cont
        pos = q * (len(bws) - 1)
        lo = int(pos)
        return bws[lo] + (bws[min(lo + 1, len(bws) - 1)] - bws[lo]) * (pos - lo)

    assert row["p50_bandwidth_gbps"] == pytest.approx(quantile(0.5))
    assert row["p10_bandwidth_gbps"] == pytest.approx(quantile(0.1))
    assert row["p90_bandwidth_gbps"] == pytest.approx(quantile(0.9))
    assert row["max_bandwidth_gbps"] == pytest.approx(bws[-1])
    assert row["p50_pct_of_peak"] == pytest.approx(100 * quantile(0.5) / 16.0)


def test_pageable_rule_fires_on_pageable_h2d(ingested, shared_traces: Path) -> None:
    doc = load_raw(shared_traces / RESNET)
    pageable = [(end - start, nbytes) for start, end, d, h, nbytes, _ in _raw_copies(doc) if d == "h2d" and h == "pageable"]
    total_bytes = sum(b for _, b in pageable)
    total_ns = sum(t for t, _ in pageable)
    found = evaluate({"copies": copies_section(open_store(ingested(RESNET)), "t", None)}, [RULES["copies.pageable"]])
    assert len(found) == 1
    assert found[0].evidence["bytes"] == total_bytes == 2312140804
    assert found[0].evidence["bandwidth_gbps"] == pytest.approx(total_bytes / total_ns)
    assert found[0].message.startswith(f"rank 0: H2D copies from pageable memory: {size(total_bytes)} at "
                                       f"{bandwidth(total_bytes / total_ns)}")
    assert "2.15 GiB at 3.67 GB/s" in found[0].message  # 2,312,140,804 B / 2**30 = 2.15 GiB
    assert found[0].time_at_stake_ns is None  # no steps in this trace: no time per step


@pytest.mark.parametrize("relative", [CONTROL, NEGQ])
def test_pageable_rule_quiet_on_pinned_or_tiny_pageable(ingested, relative) -> None:
    """control: H2D all pinned, D2H pageable 0.1 MB; negative_queue: 6.7 KB pageable H2D."""
    found = evaluate({"copies": copies_section(open_store(ingested(relative)), "t", None)}, [RULES["copies.pageable"]])
    assert found == []


def test_section_abstains_without_copies(ingested) -> None:
    result = copies_section(open_store(ingested("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")), "t", None)
    assert isinstance(result, Absent) and "no memcpy" in result.reason


def test_every_column_and_rule_is_documented(ingested) -> None:
    from tests.test_analysis_comm import _doc_section

    section = _doc_section("Copies and offload")
    store = open_store(ingested(CONTROL))
    for frame in (copy_events(store, "t"), copy_summary(store, "t")):
        for column in frame.column_names:
            assert column in section, f"column {column} is not in docs/ANALYSIS.md"
    for rule_id in ("copies.pageable", "copies.exposed"):
        assert f"`{rule_id}`" in _doc_section("Findings of communication, copies and memory")


def test_exposed_rule_fires_on_exposed_device_copies(ingested, shared_traces: Path) -> None:
    """trace_diff/test (V100): 4,645 D2D copies, 27.9 GB, almost none under compute: 12% of the
    summed ProfilerStep windows."""
    relative = "hta/trace_diff/test/test.json.gz"
    doc = load_raw(shared_traces / relative)
    islands = compute_union(doc)
    exposed = sum(end - start - covered(start, end, islands)
                  for start, end, d, h, nbytes, _ in _raw_copies(doc) if d == "d2d")
    steps_ns = sum(end - start for _, start, end in profiler_steps(doc))
    store = open_store(ingested(relative))
    found = evaluate({"copies": copies_section(store, "t", None), "ranks": ranks_section(store, "t", None)},
                     [RULES["copies.exposed"]])
    assert [f.evidence["direction"] for f in found] == ["d2d"]
    assert found[0].evidence["exposed_ns"] == exposed
    assert found[0].evidence["exposed_pct_of_steps"] == pytest.approx(100 * exposed / steps_ns)
    steps = len(profiler_steps(doc))
    assert found[0].time_at_stake_ns == round(exposed / steps)
    windows = [r["dur_ns"] for r in step_breakdown(store, "t").to_pylist()]  # the basis: the mean step window
    share = 100 * (exposed / steps) / (sum(windows) / len(windows))
    assert found[0].message.startswith(f"rank 1: D2D copies exposed for {exposed / steps / 1e6:.1f} ms per step "
                                       f"({share:.0f}% of the mean step; {size(found[0].evidence['bytes'])}")


def test_exposed_rule_quiet_when_copies_are_small_or_hidden(ingested) -> None:
    """control (A100): H2D exposed 3.6% of step time, D2D 0.6%."""
    found = evaluate({"copies": copies_section(open_store(ingested(CONTROL)), "t", None)}, [RULES["copies.exposed"]])
    assert found == []


def test_exposed_share_of_each_step(ingested, shared_traces: Path) -> None:
    doc = load_raw(shared_traces / CONTROL)
    steps = {s: end - start for s, start, end in profiler_steps(doc)}
    rows = copy_summary(open_store(ingested(CONTROL)), "t").to_pylist()
    for r in rows:
        if r["step"] is None:
            assert r["exposed_pct_of_steps"] is None and "no ProfilerStep" in r["absent_reason"]
        else:
            assert r["exposed_pct_of_steps"] == pytest.approx(100 * r["exposed_ns"] / steps[r["step"]])
    totals = copy_summary(open_store(ingested(CONTROL)), "t", per_step=False).to_pylist()
    for r in totals:
        assert r["exposed_pct_of_steps"] == pytest.approx(100 * r["exposed_ns"] / sum(steps.values()))
