"""Communication analysis on real traces, every number checked against the raw JSON."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from stepscope.analysis import Absent, evaluate
from stepscope.analysis.comm import (
    collective_instances,
    collective_kernels,
    collective_summary,
    comm_section,
    group_phase_summary,
    rank_arrivals,
    skew_summary,
)
from stepscope.analysis.findings import RULES
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests.conftest import load_raw, write_trace
from stepscope.analysis.breakdown import step_breakdown
from stepscope.analysis.lateness import late_section
from stepscope.analysis.summary import ranks_section
from stepscope.analysis.matching import collective_rows
from tests import rawmatch
from tests.rawcalc import comm_kernels, compute_union, covered, profiler_steps, rank_copy, span_ns

NCCL = "hta/nccl_parser_config/nccl_data.json.gz"
DFI = "hta/df_index_resolver/df_index_resolver.json.gz"
ELEMENT = {"Float": 4, "Long": 8, "BFloat16": 2, "Half": 2, "Int": 4}


def _rules(*ids: str):
    return [RULES[i] for i in ids]


def test_bandwidth_of_each_kernel_matches_nccl_tests_by_hand(ingested, shared_traces: Path) -> None:
    """algbw = S / t, busbw = algbw x 2(n-1)/n for all-reduce, x 1 for broadcast (GB = 1e9)."""
    doc = load_raw(shared_traces / NCCL)
    expected = []
    for e in comm_kernels(doc):
        a = e["args"]
        size = max(a["In msg nelems"], a["Out msg nelems"]) * ELEMENT[a["dtype"]]
        n = a["Group size"]
        factor = 2 * (n - 1) / n if a["Collective name"] == "allreduce" else 1.0
        dur_ns = round(e["dur"] * 1000)
        expected.append((size, size / dur_ns, size / dur_ns * factor))
    rows = collective_kernels(open_store(ingested(NCCL)), "t").to_pylist()
    assert len(rows) == len(expected) == 21
    for row, (size, algbw, busbw) in zip(rows, expected):
        assert row["bytes"] == size
        assert row["algbw_gbps"] == pytest.approx(algbw, rel=1e-12)
        assert row["busbw_gbps"] == pytest.approx(busbw, rel=1e-12)
    # One kernel by hand: all-reduce of 6,637,568 floats in 2,636.669 us -> 10.0696 GB/s.
    hand = [r for r in rows if r["bytes"] == 6637568 * 4 and r["dur_ns"] == 2636669]
    assert len(hand) == 1 and hand[0]["busbw_gbps"] == pytest.approx(26550272 / 2636669)


def test_busbw_factor_for_eight_ranks(ingested, shared_traces: Path) -> None:
    """MI300X, group of 8: all-reduce factor 2*7/8 = 1.75, broadcast 1 (RCCL ncclDevKernel_Generic)."""
    relative = "tracelens/mi300/resnet_act_checkpoint.json.gz"
    doc = load_raw(shared_traces / relative)
    expected = {}
    for e in comm_kernels(doc):
        a = e["args"]
        if "Collective name" not in a:
            continue
        size = max(a["In msg nelems"], a["Out msg nelems"]) * ELEMENT[a["dtype"]]
        factor = {"allreduce": 1.75, "broadcast": 1.0}[a["Collective name"]]
        expected[span_ns(doc, e)[0]] = size / round(e["dur"] * 1000) * factor
    rows = collective_kernels(open_store(ingested(relative)), "t").to_pylist()
    got = {r["ts_ns"]: r["busbw_gbps"] for r in rows if r["busbw_gbps"] is not None}
    assert got.keys() == expected.keys() and len(got) == 12
    for ts, value in expected.items():
        assert got[ts] == pytest.approx(value, rel=1e-12)
    unsized = [r for r in rows if r["bytes"] is None]
    assert len(unsized) == 5 and all(r["absent_reason"] for r in unsized)


@pytest.mark.parametrize("relative", [NCCL, DFI, "hta/trace_diff/control/control.json.gz"])
def test_hidden_time_is_the_overlap_with_the_compute_union(ingested, shared_traces: Path, relative) -> None:
    doc = load_raw(shared_traces / relative)
    islands = compute_union(doc)
    expected = [covered(*span_ns(doc, e), islands) for e in comm_kernels(doc)]
    rows = collective_kernels(open_store(ingested(relative)), "t").to_pylist()
    assert [r["hidden_ns"] for r in rows] == expected
    assert all(r["exposed_ns"] == r["dur_ns"] - r["hidden_ns"] for r in rows)
    if relative == DFI:
        assert sum(expected) == 0  # this trace's all-reduces never overlap compute
    else:
        assert sum(expected) > 0


def test_phase_of_each_collective(ingested, shared_traces: Path) -> None:
    """DDP: the broadcasts of buffers run in forward, gradient all-reduces in backward
    (hand-read from the enclosing annotations: ``## forward ##`` / autograd engine)."""
    rows = collective_kernels(open_store(ingested(NCCL)), "t").to_pylist()
    assert Counter((r["collective"], r["phase"]) for r in rows) == {
        ("broadcast", "forward"): 6, ("all_reduce", "backward"): 15}


@pytest.mark.parametrize("relative", ["hta/trace_diff/control/control.json.gz",
                                      "hta/trace_filter/sampled_rank-0.json.gz"])
def test_phase_from_enclosing_markers(ingested, shared_traces: Path, relative) -> None:
    """control (recommender): the input all-to-alls issued under ``## sparse_data_dist ##`` are in
    no phase marker; backward all-to-alls and all-reduces are under the autograd engine.
    sampled_rank-0: send/recv in every phase, optimizer included. Recomputed from the JSON: the
    enclosing host events of each kernel's launch, on its thread, in priority order."""
    doc = load_raw(shared_traces / relative)
    events = doc["traceEvents"]
    launch = {e["args"]["correlation"]: e for e in events
              if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", "python_function")]
    expected = Counter()
    for k in comm_kernels(doc):
        la = launch[k["args"]["correlation"]]
        names = [h["name"].lower() for h in host if h["pid"] == la["pid"] and h["tid"] == la["tid"]
                 and h["ts"] <= la["ts"] <= h["ts"] + h["dur"]]
        if any("optimizer" in n for n in names):
            expected["optimizer"] += 1
        elif any(n.startswith("autograd::engine::evaluate_function:") or "backward" in n for n in names):
            expected["backward"] += 1
        elif any("forward" in n for n in names):
            expected["forward"] += 1
        else:
            expected["other"] += 1
    rows = collective_kernels(open_store(ingested(relative)), "t").to_pylist()
    assert Counter(r["phase"] for r in rows) == expected
    if "control" in relative:
        assert expected["backward"] >= 24 and expected["other"] >= 10
    else:
        assert expected["optimizer"] == 2 and expected["forward"] == 2 and expected["backward"] == 4


def test_summary_by_collective_and_group_sums_match_raw(ingested, shared_traces: Path) -> None:
    doc = load_raw(shared_traces / NCCL)
    kernels = comm_kernels(doc)
    store = open_store(ingested(NCCL))
    by_coll = collective_summary(store, "t").to_pylist()
    raw_dur = Counter()
    raw_count = Counter()
    for e in kernels:
        name = {"allreduce": "all_reduce", "broadcast": "broadcast"}[e["args"]["Collective name"]]
        raw_dur[name] += round(e["dur"] * 1000)
        raw_count[name] += 1
    got_dur, got_count = Counter(), Counter()
    for r in by_coll:
        got_dur[r["collective"]] += r["dur_ns"]
        got_count[r["collective"]] += r["count"]
    assert got_dur == raw_dur and got_count == raw_count
    buckets = {(r["collective"], r["size_bucket"]): r["count"] for r in by_coll}
    # broadcasts: 3 of 212,480 bytes (64KiB-1MiB), 3 of 424 bytes (<64KiB)
    assert buckets[("broadcast", "64KiB-1MiB")] == 3 and buckets[("broadcast", "<64KiB")] == 3
    groups = group_phase_summary(store, "t").to_pylist()
    assert {(g["pg_name"], g["pg_desc"], g["pg_ranks"], g["phase"]) for g in groups} == {
        ("0", "default_pg", "[0, 1]", "backward"), ("0", "default_pg", "[0, 1]", "forward")}
    steps_ns = sum(end - start for _, start, end in profiler_steps(doc))
    islands = compute_union(doc)
    exposed_backward = sum(round(e["dur"] * 1000) - covered(*span_ns(doc, e), islands)
                           for e in kernels if e["args"]["Collective name"] == "allreduce")
    backward = next(g for g in groups if g["phase"] == "backward")
    assert backward["exposed_ns"] == exposed_backward
    assert backward["exposed_pct_of_steps"] == pytest.approx(100 * exposed_backward / steps_ns)


def test_exposed_rule_fires_on_poorly_overlapped_trace(ingested, shared_traces: Path) -> None:
    """df_index_resolver: all-reduces never overlap compute and take >20% of step time. One rank
    of two traced: nothing to match, so no wait is known and all exposed communication counts,
    with the warning that part of it may be waiting."""
    doc = load_raw(shared_traces / DFI)
    exposed = sum(round(e["dur"] * 1000) for e in comm_kernels(doc))
    steps = len(profiler_steps(doc))
    store = open_store(ingested(DFI))
    breakdown = step_breakdown(store, "t").to_pylist()
    union = sum(r["comm_exposed_ns"] for r in breakdown)  # the kernels never overlap each other here
    assert union == exposed
    results = {"comm": comm_section(store, "t", None), "ranks": ranks_section(store, "t", None)}
    [found] = evaluate(results, _rules("comm.exposed"))
    assert found.time_at_stake_ns == round(exposed / steps) and found.ranks == (1,)
    assert found.evidence["exposed_transfer_pct_of_steps"] == pytest.approx(
        100 * exposed / sum(r["dur_ns"] for r in breakdown), abs=0.01)
    assert found.message.startswith(f"rank 1: communication transfers exposed for {exposed / steps / 1e6:.1f} ms "
                                    "per step (21% of the mean step), mostly all_reduce in backward")
    assert "matched with another traced rank's, so part of this may be waiting for a peer" in found.message


def test_exposed_rule_quiet_when_mostly_overlapped_or_small(ingested) -> None:
    store = open_store(ingested(NCCL))
    results = {"comm": comm_section(store, "t", None), "ranks": ranks_section(store, "t", None)}
    assert evaluate(results, _rules("comm.exposed")) == []


def test_section_abstains_without_communication(ingested) -> None:
    result = comm_section(open_store(ingested("hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")), "t", None)
    assert isinstance(result, Absent) and "no communication" in result.reason


def test_single_rank_abstains_from_cross_rank_figures(ingested) -> None:
    result = comm_section(open_store(ingested(NCCL)), "t", None)
    assert isinstance(result.arrivals, Absent) and isinstance(result.skew, Absent)
    assert isinstance(result.clock_offsets, Absent)
    assert isinstance(late_section(open_store(ingested(NCCL)), "t", None), Absent)


# ---- several ranks: rank copies of a real trace with a hand-known skew --------------------------

LATE_US = 5.0
EARLY_US = -3.0


RANK2_LATE_US = 2.0


def _shift(rank: int, i: int) -> float:
    """Injected arrival of collective ``i`` on ``rank`` (us after rank 0)."""
    if rank == 1:
        return EARLY_US if i % 4 == 3 else LATE_US
    return RANK2_LATE_US if rank == 2 else 0.0


@pytest.fixture(scope="module")
def skewed_run(tmp_path_factory, shared_traces: Path):
    """Rank 0: nccl_data as recorded. Rank 1: the same trace, every collective starting 5 us
    late, except every 4th starting 3 us early (a straggler, last at 16 of 21). Rank 2: every
    collective 2 us late (last at the other 5), compute kernels 1.5x longer (a compute straggler)."""
    doc = load_raw(shared_traces / NCCL)
    folder = tmp_path_factory.mktemp("skewed")
    paths = [
        shared_traces / NCCL,
        rank_copy(doc, 1, lambda i: _shift(1, i), folder / "r1.json.gz"),
        rank_copy(doc, 2, lambda i: _shift(2, i), folder / "r2.json.gz", stretch_compute=1.5),
    ]
    store_dir = folder / "store"
    report = ingest_paths(paths, store_dir, "skew")
    assert report.ok, report.errors
    return open_store(store_dir), [load_raw(p) for p in paths]


@pytest.fixture(scope="module")
def alternating_run(tmp_path_factory, shared_traces: Path):
    """Rank 0 as recorded; rank 1 alternately 3 us early and 5 us late, same compute."""
    doc = load_raw(shared_traces / NCCL)
    folder = tmp_path_factory.mktemp("alternating")
    alternating = rank_copy(doc, 1, lambda i: LATE_US if i % 2 else EARLY_US, folder / "alt.json.gz")
    assert ingest_paths([shared_traces / NCCL, alternating], folder / "store", "alt").ok
    return open_store(folder / "store")


def test_instances_skew_and_last_rank_match_the_injected_shifts(skewed_run) -> None:
    store, docs = skewed_run
    starts = [[span_ns(d, e)[0] for e in comm_kernels(d)] for d in docs]
    durs = [[round(e["dur"] * 1000) for e in comm_kernels(d)] for d in docs]
    rows = collective_instances(store, "skew").to_pylist()
    assert len(rows) == 21 and all(r["ranks"] == 3 and r["absent_reason"] is None for r in rows)
    for i, row in enumerate(rows):
        s = [starts[r][i] for r in range(3)]
        assert row["start_skew_ns"] == max(s) - min(s)
        shifts = [_shift(r, i) for r in range(3)]
        # the injected skew, to within the float rounding of ts in the JSON
        assert abs(row["start_skew_ns"] - (max(shifts) - min(shifts)) * 1000) <= 1
        late = [r for r in range(3) if s[r] == max(s)]
        assert row["last_rank"] == (late[0] if len(late) == 1 else None)
        assert row["last_rank"] == max(range(3), key=lambda r: shifts[r])
        assert row["min_dur_ns"] == min(durs[r][i] for r in range(3))
        assert row["dur_spread_ns"] == max(durs[r][i] for r in range(3)) - row["min_dur_ns"]


def test_arrivals(skewed_run) -> None:
    """3 ranks; rank 1 is last at 16 of 21 collectives, rank 2 at the other 5."""
    store, _ = skewed_run
    rows = {r["rank"]: r for r in rank_arrivals(store, "skew").to_pylist()}
    assert [(r, rows[r]["instances"], rows[r]["last_count"]) for r in (0, 1, 2)] == [
        (0, 21, 0), (1, 21, 16), (2, 21, 5)]
    # 7 collectives per step; rank 1 is last at 5 or 6 of them in every step
    assert rows[1]["steps_last_most"] == 3 == rows[1]["steps_with_instances"]


def test_microsecond_skews_are_no_finding(skewed_run, alternating_run) -> None:
    """Ranks a few microseconds apart (and rank 2 computing 1.5x longer, hidden in the same
    waits): real numbers, no cause worth a finding (waits far below 1 ms and 5% of the step)."""
    for store, run in ((skewed_run[0], "skew"), (alternating_run, "alt")):
        result = late_section(store, run, None)
        found = [] if isinstance(result, Absent) else evaluate({"late": result}, _rules("comm.late_rank"))
        assert found == []
        waits = [r["max_wait_ns"] for r in collective_instances(store, run).to_pylist() if r["max_wait_ns"]]
        assert waits and max(waits) <= 5_001


def test_skew_summary(skewed_run) -> None:
    store, _ = skewed_run
    rows = skew_summary(store, "skew").to_pylist()
    assert {(r["collective"], r["instances"]) for r in rows} == {("all_reduce", 15), ("broadcast", 6)}
    for r in rows:
        assert abs(r["max_start_skew_ns"] - (LATE_US - 0.0) * 1000) <= 1


def test_compute_per_rank(skewed_run) -> None:
    store, _ = skewed_run
    result = comm_section(store, "skew", None)
    compute = {r["rank"]: r for r in result.compute.to_pylist()}
    assert compute[0]["mean_compute_ns"] == compute[1]["mean_compute_ns"]  # identical compute
    assert compute[2]["mean_compute_ns"] > 1.3 * compute[0]["mean_compute_ns"]
    assert compute[2]["compute_vs_median_pct"] > 30


def _doc_section(title: str) -> str:
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "ANALYSIS.md").read_text()
    match = re.search(rf"## {re.escape(title)}.*?(?=\n## |\Z)", text, re.S)
    assert match, f"docs/ANALYSIS.md has no section {title!r}"
    return match.group(0)


def test_every_column_and_rule_is_documented(ingested, skewed_run) -> None:
    section = _doc_section("Communication")
    store = open_store(ingested(NCCL))
    skew_store, _ = skewed_run
    frames = [collective_kernels(store, "t"), collective_summary(store, "t"), group_phase_summary(store, "t"),
              collective_instances(skew_store, "skew"), skew_summary(skew_store, "skew"),
              rank_arrivals(skew_store, "skew"), comm_section(skew_store, "skew", None).compute]
    for frame in frames:
        for column in frame.column_names:
            assert column in section, f"column {column} is not in docs/ANALYSIS.md"
    findings = _doc_section("Findings of communication, copies and memory")
    for rule_id in ("comm.exposed", "comm.late_rank"):
        assert f"`{rule_id}`" in findings


def test_instances_on_two_real_ranks_of_one_job(ingested, shared_traces: Path) -> None:
    """trace_filter/sampled_rank-0 and -1: two ranks of one 128-rank job, events sampled. Old NCCL
    kernels (``ncclKernel_SendRecv`` for all-to-alls and all-reduces alike) carry no args: what
    they are comes from the op that launched them. Matched by (collective, step, order); the
    sampling leaves pairs whose sizes differ or that do not overlap in time: those are refused.
    Recomputed from the JSON (tests/rawmatch.py). The store is the session's of the folder, which
    holds these two files and nothing else (run ``t``)."""
    folder = shared_traces / "hta/trace_filter"
    paths = [folder / f"sampled_rank-{r}.json.gz" for r in (0, 1)]
    assert sorted(folder.iterdir()) == paths
    store = open_store(ingested("hta/trace_filter"))
    raw = sorted((i for i in rawmatch.match([load_raw(p) for p in paths])), key=lambda i: min(m.aligned for m in i.members))
    expected = []
    for inst in raw:
        by_rank = {m.rank: m for m in inst.members}
        if inst.valid:
            s0, s1 = by_rank[0].aligned, by_rank[1].aligned
            expected.append((inst.members[0].collective, abs(s1 - s0), None if s0 == s1 else int(s1 > s0),
                             sum(m.wait for m in inst.members)))
        else:
            expected.append((inst.members[0].collective, None, None, None))
    rows = collective_instances(store, "t").to_pylist()
    assert [(r["collective"], r["start_skew_ns"], r["last_rank"], r["wait_ns"]) for r in rows] == expected
    assert Counter(r["collective"] for r in rows) == {"all_to_all": 4, "all_reduce": 4, "all_gather": 2}
    assert sum(r["absent_reason"] is None for r in rows) == 4
    assert all(r["matched_by"] == "step_order" and r["pg_name"] is None for r in rows)
    assert {r["absent_reason"] for r in rows} >= {
        None, "one rank finished before another started: the traces do not line up here"}


def test_arrivals_without_process_group_args(tmp_path, shared_traces: Path) -> None:
    """Older traces (df_index_resolver) carry no process-group args at all. Here: nccl_data with
    its process-group args and pg_config removed, and a rank copy 5 us late: the collectives
    are still matched one by one (pg_name null) and the copy is last at every one."""
    doc = load_raw(shared_traces / NCCL)
    doc["distributedInfo"] = {k: v for k, v in doc["distributedInfo"].items() if k != "pg_config"}
    for e in doc["traceEvents"]:  # the kernels' and their launching ops' (record_param_comms)
        for key in ("Process Group Name", "Process Group Description", "Process Group Ranks"):
            e.get("args", {}).pop(key, None)
    top = {k: v for k, v in doc.items() if k != "traceEvents"}
    plain = write_trace(tmp_path / "r0.json.gz", doc["traceEvents"], **top)
    late = rank_copy(doc, 1, lambda i: LATE_US, tmp_path / "r1.json.gz")
    assert ingest_paths([plain, late], tmp_path / "store", "nopg").ok
    store = open_store(tmp_path / "store")
    assert all(r["pg_name"] is None for r in collective_instances(store, "nopg").to_pylist())
    rows = {r["rank"]: r for r in rank_arrivals(store, "nopg").to_pylist()}
    assert rows[0]["instances"] == rows[1]["instances"] == 21
    assert rows[1]["last_count"] == 21 and rows[0]["last_count"] == 0
    assert rows[1]["steps_last_most"] == 3 == rows[1]["steps_with_instances"]


# ---- a real 2-rank gloo DDP run (CPU): host-side transfers ------------------------------------


GLOO = "ddp-test-2-ranks"
"""The run of the session's 2-rank gloo DDP recording (``ddp_recording``, tests/conftest.py)."""


@pytest.fixture(scope="module")
def gloo_run(ddp_recording: Path):
    """examples/train_ddp_cpu.py with 2 ranks under stepscope.profile, recorded once per test
    run and shared with test_collector_ddp."""
    docs = [load_raw(ddp_recording / "traces" / f"rank{r}.pt.trace.json.gz") for r in (0, 1)]
    return open_store(ddp_recording / "store"), docs


def _gloo_transfers(doc):
    """(step, start_ns, end_ns, collective, bytes) of every gloo:* annotation, in time order;
    bytes from Input Dims (float32) as the store documents."""
    steps = profiler_steps(doc)
    out = []
    for e in doc["traceEvents"]:
        if e.get("cat") == "user_annotation" and e["name"].startswith("gloo:"):
            start, end = span_ns(doc, e)
            dims = e["args"]["Input Dims"][0]
            shapes = dims if dims and isinstance(dims[0], list) else [dims]
            elements = sum(math.prod(shape) for shape in shapes)
            assert e["args"]["Input type"][0] == "float"
            step = next((s for s, a, b in steps if a <= start < b), None)
            out.append((step, start, end, e["name"].split(":")[1], 4 * elements))
    return sorted(out, key=lambda t: t[1])


@pytest.mark.slow
def test_gloo_transfers_are_collectives(gloo_run) -> None:
    store, docs = gloo_run
    rows = collective_kernels(store, GLOO).to_pylist()
    for rank, doc in enumerate(docs):
        raw = _gloo_transfers(doc)
        got = [r for r in rows if r["rank"] == rank]
        assert [(r["step"], r["ts_ns"], r["ts_ns"] + r["dur_ns"], r["collective"], r["bytes"]) for r in got] == raw
        assert len(raw) >= 4
        # hidden: under the main thread's compute ops (the host breakdown's communication_overlapped)
        assert all(r["host_side"] and r["phase"] is None and r["absent_reason"] for r in got)
        assert all(0 <= r["hidden_ns"] <= r["dur_ns"] and r["exposed_ns"] == r["dur_ns"] - r["hidden_ns"] for r in got)
        # the only process group of pg_config (default_pg, 2 ranks) gives the group size
        assert all(r["pg_desc"] == "default_pg" and r["group_size"] == 2 for r in got)
        for r in got:
            factor = 2 * (2 - 1) / 2 if r["collective"] == "all_reduce" else 1.0
            assert r["busbw_gbps"] == pytest.approx(r["bytes"] / r["dur_ns"] * factor)


@pytest.mark.slow
def test_gloo_instances_and_arrivals_match_raw(gloo_run) -> None:
    store, docs = gloo_run
    per_rank = []
    for doc in docs:
        by_step: dict = {}
        for step, start, end, coll, nbytes in _gloo_transfers(doc):
            by_step.setdefault(step, []).append((start, end))
        per_rank.append(by_step)
    expected, last = [], Counter()
    for step in sorted(per_rank[0]):
        for (s0, e0), (s1, e1) in zip(per_rank[0][step], per_rank[1][step], strict=True):
            who = None if s0 == s1 else int(s1 > s0)
            expected.append((step, abs(s1 - s0), min(e0 - s0, e1 - s1), max(e0 - s0, e1 - s1), who))
            last[who] += 1
    rows = collective_instances(store, GLOO).to_pylist()
    assert [(r["step"], r["start_skew_ns"], r["min_dur_ns"], r["max_dur_ns"], r["last_rank"]) for r in rows] == expected
    arrivals = {r["rank"]: r for r in rank_arrivals(store, GLOO).to_pylist()}
    for rank in (0, 1):
        assert arrivals[rank]["instances"] == len(expected)
        assert arrivals[rank]["last_count"] == last[rank]
    result = comm_section(store, GLOO, None)
    compute = result.compute.to_pylist()
    assert [r["compute_source"] for r in compute] == ["host", "host"]
    assert sum(r["compute_vs_median_pct"] for r in compute) == pytest.approx(0, abs=1e-9)  # two ranks: median = mean


@pytest.mark.parametrize("relative", [NCCL, DFI, "hta/trace_diff/control/control.json.gz"])
def test_frames_are_typed_and_sections_serialise(ingested, relative) -> None:
    """No DuckDB HUGEINT/DECIMAL leaks into a frame (pandas objects, JSON failures): every
    column is an integer, float, string, bool or list, and every section's JSON dumps."""
    import json

    import pyarrow as pa

    from stepscope.analysis import copies, jsonable, memory
    from stepscope.analysis import comm as comm_module
    from stepscope.analysis.sections import SECTIONS

    store = open_store(ingested(relative))
    frames = [collective_kernels(store, "t"), collective_summary(store, "t"), group_phase_summary(store, "t"),
              copies.copy_events(store, "t"), copies.copy_summary(store, "t"),
              memory.step_peaks(store, "t"), memory.live_at_peak(store, "t"), memory.memory_timeline(store, "t")]
    for frame in frames:
        for field in frame.schema:
            assert not pa.types.is_decimal(field.type), field
    for name, compute in (("comm", comm_module.comm_section), ("copies", copies.copies_section),
                          ("memory", memory.memory_section)):
        result = compute(store, "t", None)
        json.dumps(jsonable(result if isinstance(result, Absent) else SECTIONS[name].to_json(result)))


def test_instances_matched_by_sequence_number_when_recorded(tmp_path, shared_traces: Path) -> None:
    """Newer traces number each collective of a group (``Seq``). With it, matching ignores steps
    and order: here rank 1 numbers its collectives from the last, so instance ``n`` pairs rank 0's
    n-th kernel with rank 1's (20-n)-th, as the numbers say (order matching would pair n with n),
    and pairs that join different collectives are flagged."""
    doc = load_raw(shared_traces / NCCL)
    kernels = comm_kernels(doc)
    for i, k in enumerate(kernels):
        k["args"]["Seq"] = i
    top = {k: v for k, v in doc.items() if k != "traceEvents"}
    r0 = write_trace(tmp_path / "r0.json.gz", doc["traceEvents"], **top)
    for i, k in enumerate(kernels):
        k["args"]["Seq"] = len(kernels) - 1 - i
    r1 = rank_copy(doc, 1, lambda i: LATE_US, tmp_path / "r1.json.gz")
    assert ingest_paths([r0, r1], tmp_path / "store", "seq").ok
    store = open_store(tmp_path / "store")
    rows = collective_instances(store, "seq").to_pylist()
    assert len(rows) == 21 and {r["matched_by"] for r in rows} == {"comm_seq"}
    k0, k1 = comm_kernels(load_raw(r0)), comm_kernels(load_raw(r1))
    d0, d1 = load_raw(r0), load_raw(r1)
    names = {"allreduce": "all_reduce", "broadcast": "broadcast"}
    members = [(r["rank"], r["ts_ns"], r["inst_id"]) for r in collective_rows(store, "seq").to_pylist()]

    def instance(rank: int, ts_ns: int) -> int:  # the member starting there (float parse: +-2 ns)
        (inst,) = [i for r, t, i in members if r == rank and abs(t - ts_ns) <= 2]
        return inst

    for n in range(21):
        a, b = k0[n], k1[20 - n]
        assert instance(0, span_ns(d0, a)[0]) == instance(1, span_ns(d1, b)[0]), f"Seq {n} pairs these two"
    for row in rows:
        n = row["match_seq"]
        a, b = k0[n], k1[20 - n]
        same = a["args"]["Collective name"] == b["args"]["Collective name"]
        assert row["collective_mismatch"] == (not same)
        if not same:
            assert row["absent_reason"] == "the ranks ran different collectives at this place"
            continue
        assert row["collective"] == names[a["args"]["Collective name"]]
        (s0, e0), (s1, e1) = span_ns(d0, a), span_ns(d1, b)
        if a["args"]["In msg nelems"] != b["args"]["In msg nelems"]:
            assert row["start_skew_ns"] is None and row["absent_reason"].startswith("the ranks' dtypes or message sizes")
        elif max(s0, s1) > min(e0, e1) and row["collective"] != "broadcast":
            # numbered as pairs, but one ended before the other began: not one collective
            assert row["start_skew_ns"] is None and row["absent_reason"].startswith("one rank finished")
        else:
            # ts near 4.5e12 us: Python's float parse can round each start 1 ns off the store's exact
            # decimal parse, so a difference of two starts may be 2 ns off
            assert abs(row["start_skew_ns"] - abs(s1 - s0)) <= 2
    assert any(r["collective_mismatch"] for r in rows)
    assert any(r["start_skew_ns"] is not None for r in rows)
