"""The summary: JSON contract, CLI, kernels/ops/step statistics against hand counts from the raw
JSON, and each of this module's findings rules on a real trace that triggers it and one that
does not."""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from stepscope.units import duration
from stepscope.analysis.absent import NO_GPU_EVENTS, NO_STEPS
from stepscope.analysis.breakdown import host_breakdown, step_breakdown
from stepscope.analysis.findings import RULES, evaluate
from stepscope.analysis.kernels import launch_overhead, step_stats, top_cpu_ops, top_kernels
from stepscope.analysis.quantiles import median
from stepscope.analysis.summary import GPU_STEP_KEYS, build_summary, ranks_section
from stepscope.cli import main
from stepscope.store import open_store
from tests._intervals import clip, length, load_trace, to_ns, union

pytestmark = pytest.mark.shared

DFIR = "hta/df_index_resolver/df_index_resolver.json.gz"
CPU_ONLY = "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
NO_STEPS_TRACE = "param/linear_kineto.json.gz"
RESNET = "kineto_tb_plugin/old_2021-02/resnet50_profiler_api_num_workers_0.worker0.pt.trace.json.gz"
UNSTEADY = "hta/trace_diff/test/test.json.gz"
OWN_RULES = ("gpu.idle", "host.data_loading", "steps.unstable")
EXPOSED_PARTS = [k for k in GPU_STEP_KEYS if k.endswith("_exposed_ns") and k != "comm_overlapped_ns"]


def _nulls(value: Any, path: str = "$") -> Iterator[tuple[str, Any]]:
    """(path, parent) of every null in a JSON tree."""
    if isinstance(value, dict):
        for key, item in value.items():
            if item is None:
                yield f"{path}.{key}", value
            else:
                yield from _nulls(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            assert item is not None, f"{path}[{i}] is a bare null"
            yield from _nulls(item, f"{path}[{i}]")


def _check_contract(doc: dict[str, Any]) -> None:
    assert {"run", "ranks", "findings"} <= set(doc)
    json.dumps(doc)
    # The abstention rule (every null carries its reason) is checked on this module's sections
    # and the contract's top level; other sections document their own nulls.
    own = {"ranks": doc["ranks"], "kernels": doc["kernels"],
           "findings": [f for f in doc["findings"] if f["rule"] in OWN_RULES]}
    for path, parent in _nulls(own):
        key = path.rsplit(".", 1)[1]
        reason = parent.get("absent_reasons", {}).get(key) or parent.get("absent_reason")
        assert reason, f"{path} is null without a reason"
    for rank in doc["ranks"]:
        assert {"rank", "steps", "totals"} <= set(rank)
        for step in rank["steps"] or []:
            assert {"step", "dur_ns"} <= set(step)
            if step["compute_ns"] is not None:
                parts = [step["compute_ns"], step["idle_ns"], *(step[k] for k in EXPOSED_PARTS)]
                assert all(p >= 0 for p in parts)
                assert sum(parts) == step["dur_ns"]
        if rank["totals"] is not None:
            assert {"gpu_span_ns", "gpu_idle_ns", "compute_ns", "non_compute_ns", "comm_comp_overlap_pct"} <= set(rank["totals"])
    for finding in doc["findings"]:
        assert finding["severity"] in ("critical", "warning", "info") and finding["rule"] in RULES


@pytest.mark.parametrize("relative", [DFIR, CPU_ONLY, NO_STEPS_TRACE, RESNET])
def test_summary_json_keeps_its_contract(ingested: Callable[[str], Path], relative: str) -> None:
    _check_contract(build_summary(open_store(ingested(relative)), "t"))


def test_summary_abstains_per_rank(ingested: Callable[[str], Path]) -> None:
    cpu = build_summary(open_store(ingested(CPU_ONLY)), "t")
    [rank] = cpu["ranks"]
    assert rank["totals"]["gpu_span_ns"] is None
    assert rank["totals"]["absent_reasons"]["gpu_span_ns"] == NO_GPU_EVENTS
    [step] = rank["steps"]
    assert step["compute_ns"] is None and step["host"]["communication_ops_ns"] > 0
    no_steps = build_summary(open_store(ingested(NO_STEPS_TRACE)), "t")
    [rank] = no_steps["ranks"]
    assert rank["steps"] is None and rank["absent_reasons"]["steps"] == NO_STEPS
    assert rank["totals"]["gpu_span_ns"] > 0
    missing = build_summary(open_store(ingested(DFIR)), "t", ranks=[1, 7])
    assert [r["rank"] for r in missing["ranks"]] == [1, 7]
    assert missing["ranks"][1]["totals"] is None
    assert "rank 7 is not in this run" in missing["ranks"][1]["absent_reasons"]["totals"]


def test_cli_prints_every_format(ingested: Callable[[str], Path], capsys: pytest.CaptureFixture[str]) -> None:
    store = str(ingested(DFIR))
    assert main(["summary", "--store", store, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    _check_contract(doc)
    assert doc["run"] == "t" and [r["rank"] for r in doc["ranks"]] == [1]
    assert main(["summary", "--store", store, "--run", "t", "--rank", "1", "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out
    assert markdown.startswith("# stepscope summary: run `t`") and "## What bounds the step" in markdown
    assert "| step | step time |" not in markdown  # per-rank tables only when asked for
    assert main(["summary", "--store", store, "--format", "markdown", "--section", "ranks"]) == 0
    assert "| step | step time |" in capsys.readouterr().out
    assert main(["summary", "--store", store]) == 0
    screen = capsys.readouterr().out
    assert screen.startswith("run t: 1 rank traced of 2, nccl, Tesla V100-SXM2-32GB x2\nstep time ")
    assert "rank 1: GPU time per step" not in screen and "Findings, by time at stake per step" in screen
    assert main(["summary", "--store", store, "--verbose"]) == 0
    assert "rank 1: GPU time per step" in capsys.readouterr().out
    assert main(["summary", "--store", store, "--section", "nope"]) == 2
    assert "--section nope: no such section; sections: ranks, windows, kernels, comm" in capsys.readouterr().err
    assert main(["summary", "--store", store, "--run", "nope"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err


# ---- kernels, ops and step statistics against hand counts ----


def _steps(trace: dict[str, Any]) -> list[tuple[int, int, int]]:
    return sorted(
        (to_ns(trace, e["ts"]), to_ns(trace, e["ts"]) + round(e["dur"] * 1000), int(e["name"].split("#")[1]))
        for e in trace["traceEvents"]
        if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"
    )


def test_top_kernels_match_a_hand_count(ingested: Callable[[str], Path], shared_traces: Path) -> None:
    trace = load_trace(shared_traces / DFIR)
    totals: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for e in trace["traceEvents"]:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("dur", 0) > 0:
            totals[e["name"]] += round(e["dur"] * 1000)
            counts[e["name"]] += 1
    step_ns = sum(end - start for start, end, _ in _steps(trace))  # GPU work ends inside its CPU step here
    expected = [(name, counts[name], total) for name, total in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:5]]
    rows = top_kernels(open_store(ingested(DFIR)), "t", n=5).to_pylist()
    assert [(r["name"], r["count"], r["total_ns"]) for r in rows] == expected
    assert rows[0]["share_of_steps_pct"] == pytest.approx(100 * expected[0][2] / step_ns)


def test_top_cpu_ops_match_a_hand_count(ingested: Callable[[str], Path], shared_traces: Path) -> None:
    trace = load_trace(shared_traces / DFIR)
    steps = _steps(trace)
    totals: Counter[str] = Counter()
    for e in trace["traceEvents"]:
        if e.get("cat") == "cpu_op" and "dur" in e:
            t = to_ns(trace, e["ts"])
            if any(s0 <= t < s1 for s0, s1, _ in steps):
                totals[e["name"]] += round(e["dur"] * 1000)
    expected = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    rows = top_cpu_ops(open_store(ingested(DFIR)), "t", n=5).to_pylist()
    assert [(r["name"], r["total_ns"]) for r in rows] == expected


def test_launch_overhead_matches_a_hand_count(ingested: Callable[[str], Path], shared_traces: Path) -> None:
    trace = load_trace(shared_traces / DFIR)
    gpu: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "correlation" in e.get("args", {}):
            gpu[e["args"]["correlation"]].append((to_ns(trace, e["ts"]), round(e["dur"] * 1000)))
    launches = [
        (round(e["dur"] * 1000), sum(d for _, d in gpu[c]), min(t for t, _ in gpu[c]) - to_ns(trace, e["ts"]))
        for e in trace["traceEvents"]
        if e.get("cat") == "cuda_runtime" and (c := e.get("args", {}).get("correlation")) in gpu
    ]
    [row] = launch_overhead(open_store(ingested(DFIR)), "t").to_pylist()
    delays = sorted(d for _, _, d in launches)
    assert row["launches"] == len(launches)
    assert row["launch_ns"] == sum(d for d, _, _ in launches)
    assert row["launched_gpu_ns"] == sum(g for _, g, _ in launches)
    assert row["short_launches"] == sum(1 for d, g, _ in launches if g < d)
    assert row["median_launch_delay_ns"] == statistics.median(delays)  # even count: mean of the middle two


@pytest.mark.parametrize("relative", [DFIR, UNSTEADY])
def test_step_stats_match_interpolated_quantiles_of_the_json(
    ingested: Callable[[str], Path], shared_traces: Path, relative: str
) -> None:
    durs = sorted(end - start for start, end, _ in _steps(load_trace(shared_traces / relative)))
    n = len(durs)
    p90 = float(np.percentile(durs, 90))  # linear interpolation, numpy's default
    [row] = step_stats(open_store(ingested(relative)), "t").to_pylist()
    assert (row["source"], row["steps"], row["min_ns"], row["max_ns"]) == ("profiler_steps", n, durs[0], durs[-1])
    assert row["median_ns"] == statistics.median(durs) and row["p90_ns"] == pytest.approx(p90)
    assert row["spread_pct"] == pytest.approx(100 * (durs[-1] - durs[0]) / statistics.median(durs))


def test_data_loading_matches_a_hand_count(ingested: Callable[[str], Path], shared_traces: Path) -> None:
    trace = load_trace(shared_traces / RESNET)
    loading = union([
        (to_ns(trace, e["ts"]), to_ns(trace, e["ts"]) + round(e["dur"] * 1000))
        for e in trace["traceEvents"]
        if str(e.get("name", "")).startswith("enumerate(DataLoader)#") and e.get("ph") == "X"
    ])
    expected = {n: length(clip(loading, s0, s1)) for s0, s1, n in _steps(trace)}
    rows = host_breakdown(open_store(ingested(RESNET)), "t").to_pylist()
    assert {r["step"]: r["data_loading_ns"] for r in rows} == expected
    assert all(v > 0 for v in expected.values())


# ---- findings rules of the ranks section ----


def _findings(ingested: Callable[[str], Path], relative: str, rule_id: str) -> list[Any]:
    results = {"ranks": ranks_section(open_store(ingested(relative)), "t", None)}
    return evaluate(results, [RULES[rule_id]])


def test_gpu_idle_rule(ingested: Callable[[str], Path]) -> None:
    """df_index_resolver: idle over the five steps (hand counts of test_breakdown), worst step 3."""
    rows = {r["step"]: r for r in step_breakdown(open_store(ingested(DFIR)), "t").to_pylist()}
    [finding] = _findings(ingested, DFIR, "gpu.idle")
    assert finding.evidence["cause"] == "host_wait" and finding.evidence["step"] == 3
    assert finding.evidence["worst_step_idle_pct"] == pytest.approx(100 * 177042000 / 365256000, abs=0.01)
    idle = sum(r["idle_ns"] for r in rows.values())
    assert finding.evidence["idle_pct"] == pytest.approx(100 * idle / sum(r["dur_ns"] for r in rows.values()), abs=0.01)
    assert finding.time_at_stake_ns == round(idle / len(rows)) and finding.ranks == (1,)
    # one rank: its summed idle over its summed windows is the share of the mean step (the basis)
    assert finding.message.startswith(f"rank 1: GPU idle {duration(finding.time_at_stake_ns)} per step "
                                      f"({finding.evidence['idle_pct']:.0f}% of the mean step")
    assert "worst step: 3 of rank 1, idle 48% of that step" in finding.message
    assert _findings(ingested, UNSTEADY, "gpu.idle") == []


def test_idle_that_data_loading_explains_is_the_data_loading_finding(ingested: Callable[[str], Path]) -> None:
    """ResNet-50, DataLoader in the main process: the GPU idles 25-58 ms per step waiting for the
    host, and the host spends ~44 ms per step in the DataLoader. One cause, one finding: data
    loading, with the GPU's wait in it; no separate idle finding (what is left over is ~2 ms)."""
    assert _findings(ingested, RESNET, "gpu.idle") == []
    [finding] = _findings(ingested, RESNET, "host.data_loading")
    assert finding.evidence["data_loading_pct_median"] >= 10
    assert "the GPU idles" in finding.message and finding.evidence["gpu_host_wait_ns_median"] > 20e6
    host = host_breakdown(open_store(ingested(RESNET)), "t").to_pylist()
    loading = sorted(r["data_loading_ns"] for r in host)
    assert finding.time_at_stake_ns == round(median(loading))  # ns per step


def test_a_data_loading_bound_trace_gets_data_loading_first(ingested: Callable[[str], Path]) -> None:
    """ResNet-50 with its DataLoader in the main process: 44 ms per step of data loading ahead of
    the 2 ms per step of pageable H2D copies (the order once had them the other way round)."""
    findings = build_summary(open_store(ingested(RESNET)), "t")["verdict"]["findings"]
    assert [f["rule"] for f in findings][:2] == ["host.data_loading", "copies.pageable"]
    assert findings[0]["time_at_stake_ns"] > 10 * findings[1]["time_at_stake_ns"]


def test_data_loading_rule(ingested: Callable[[str], Path]) -> None:
    [finding] = _findings(ingested, RESNET, "host.data_loading")
    assert finding.evidence["data_loading_pct_median"] >= 10
    assert _findings(ingested, DFIR, "host.data_loading") == []


def test_unstable_steps_rule(ingested: Callable[[str], Path]) -> None:
    [finding] = _findings(ingested, UNSTEADY, "steps.unstable")
    assert finding.evidence["spread_pct"] > 25
    assert _findings(ingested, DFIR, "steps.unstable") == []


def test_every_column_of_these_frames_is_documented(ingested: Callable[[str], Path]) -> None:
    from stepscope.analysis.breakdown import rank_totals, step_breakdown, step_windows

    docs = (Path(__file__).resolve().parents[1] / "docs" / "ANALYSIS.md").read_text()
    store = open_store(ingested(DFIR))
    frames = [
        step_breakdown(store, "t"), host_breakdown(store, "t"), rank_totals(store, "t"),
        step_windows(store, "t"), top_kernels(store, "t"), top_cpu_ops(store, "t"),
        launch_overhead(store, "t"), step_stats(store, "t"),
    ]
    for frame in frames:
        for column in frame.column_names:
            assert re.search(rf"`[^`]*\b{column}\b[^`]*`", docs), f"column {column} is not in docs/ANALYSIS.md"
