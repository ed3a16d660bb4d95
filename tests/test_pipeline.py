"""Pipeline parallelism on the project's own recordings (sample_traces/pp-*): stage order,
microbatches, schedule, and every stage's bubble against a plain loop over the raw JSON."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import pytest

from stepscope.analysis.absent import Absent
from stepscope.analysis.findings import evaluate
from stepscope.analysis.pipeline import (
    GPIPE,
    INTERLEAVED,
    ONE_F_ONE_B,
    PipelineResult,
    bubble_findings,
    one_f_one_b,
    pipeline_analysis,
)
from stepscope.analysis.pipeline_stages import NO_P2P
from stepscope.analysis.sections import compute_sections
from stepscope.analysis.summary import build_summary
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests._intervals import load_trace, to_ns

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
RUNS = {  # folder: (schedule, stages, microbatches, stages per rank)
    "pp-gpipe-3stages": (GPIPE, 3, 4, 1),
    "pp-1f1b-4stages": (ONE_F_ONE_B, 4, 8, 1),
    "pp-1f1b-3stages-slow": (ONE_F_ONE_B, 3, 4, 1),
    "pp-interleaved-2ranks": (INTERLEAVED, 2, 4, 2),
}


@pytest.fixture(scope="module")
def pp_store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Every sample run, each under its folder's name (the pipeline runs among them), in the
    store the dashboard tests read too: ingested once per test run."""
    from tests._dashboard_stores import build_sample_store

    return open_store(build_sample_store(tmp_path_factory))


def _result(store: Any, run: str) -> PipelineResult:
    result = pipeline_analysis(store, run)
    assert isinstance(result, PipelineResult), result
    return result


@pytest.mark.parametrize("folder", list(RUNS))
def test_stage_order_microbatches_and_schedule(pp_store: Any, folder: str) -> None:
    schedule, stages, microbatches, per_rank = RUNS[folder]
    result = _result(pp_store, folder)
    assert [p.ranks for p in result.pipelines] == [tuple(range(stages))]  # the example puts stage s on rank s
    assert (result.schedule, result.stages_count, result.microbatches, result.stages_per_rank) == (
        schedule, stages, microbatches, per_rank)
    assert result.ideal_fraction == pytest.approx((stages - 1) / (per_rank * microbatches + stages - 1))
    for row in result.stages:
        assert row.stage == row.rank
        forwards = [s for s in row.spans if s["kind"] == "forward"]
        backwards = [s for s in row.spans if s["kind"] == "backward"]
        assert sorted(s["microbatch"] for s in forwards) == sorted(s["microbatch"] for s in backwards)
        assert len(forwards) == microbatches * per_rank
        if schedule == ONE_F_ONE_B:
            assert row.order == one_f_one_b(row.stage, stages, microbatches)
        if schedule == INTERLEAVED:
            assert row.virtual_stages == (row.rank, row.rank + stages)


# ---- the independent count: a plain loop over each rank's raw JSON ----

COMM = ("c10d::", "gloo:", "nccl:", "record_param_comms")
GAP_NS = 1_000_000


def _union(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    total, reach = 0, lo
    for start, end in sorted(intervals):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total, reach = total + end - start, end
    return total


def hand_bubbles(path: Path, stage: int, stages: int) -> dict[str, int]:
    """busy, fill, wait, drain of one CPU-only rank's one profiled step, straight from the JSON.

    Items: CPU ops that are not communication. Phase at an op's start: backward inside an
    ``autograd::engine::evaluate_function`` or ``*backward*`` event, optimizer inside an
    ``*optimizer*`` one (first wins), else forward. A new chunk starts at a phase change or when a
    c10d::send / c10d::recv_ lies between two items; a chunk is a microbatch's forward (backward)
    when a forward (backward) receive precedes it or a forward (backward) send follows it;
    runtime-schedule annotations PP:<s>F<mb> / PP:<s>B<mb> make one chunk each instead.
    """
    trace = load_trace(path)
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("dur") is not None]

    def span(e: dict[str, Any]) -> tuple[int, int]:
        start = to_ns(trace, e["ts"])
        return start, start + round(e["dur"] * 1000)

    (w0, w1), = [span(e) for e in ev if e["name"].startswith("ProfilerStep#")]
    markers = {"backward": [], "optimizer": []}
    for e in ev:
        name = e["name"]
        if e.get("cat") in ("cpu_op", "user_annotation", "python_function"):
            if "optimizer" in name.lower():
                markers["optimizer"].append(span(e))
            elif name.startswith("autograd::engine::evaluate_function:") or "backward" in name.lower():
                markers["backward"].append(span(e))

    def phase(t: int) -> str:
        for which in ("optimizer", "backward"):
            if any(a <= t <= b for a, b in markers[which]):
                return which
        return "forward"

    items = sorted((span(e)[0], span(e)[1]) for e in ev if e.get("cat") == "cpu_op" and w0 <= span(e)[0] < w1
                   and not e["name"].startswith(COMM) and not e["name"].startswith("ProfilerStep#"))
    moves = []  # (ts, send, forward)
    for e in ev:
        if e["name"] in ("c10d::send", "c10d::recv_") and w0 <= span(e)[0] < w1:
            peer, send = int(e["args"]["Concrete Inputs"][2]), e["name"] == "c10d::send"
            moves.append((span(e)[0], send, (peer > stage) if send else (peer < stage)))
    actions = [(span(e), m) for e in ev for m in [re.match(r"^PP:(\d+)([FBIW])(\d+)$", e["name"])] if m]
    groups: list[dict[str, Any]] = []  # chunks: first item's start, phase, items, kind
    for (a0, a1), m in actions:
        mine = [it for it in items if a0 <= it[0] < a1]
        if mine:
            groups.append({"first": mine[0][0], "phase": "action", "items": mine, "kind": "F" if m.group(2) == "F" else "B"})
    inside = {it for g in groups for it in g["items"]}
    rest: list[dict[str, Any]] = []
    for it in (it for it in items if it not in inside):
        g = rest[-1] if rest else None
        cut = g is not None and any(g["items"][-1][0] < t <= it[0] for t, _, _ in moves)
        if g is None or g["phase"] != phase(it[0]) or cut:
            rest.append({"first": it[0], "phase": phase(it[0]), "items": [it], "kind": None})
        else:
            g["items"].append(it)
    for i, g in enumerate(rest if not actions else []):
        lo = rest[i - 1]["items"][-1][0] if i else w0 - 1
        hi = rest[i + 1]["first"] if i + 1 < len(rest) else w1
        before = [m for m in moves if lo < m[0] < g["first"]]
        after = [m for m in moves if g["items"][-1][0] < m[0] < hi]
        back = g["phase"] == "backward"
        if g["phase"] != "optimizer" and (any(not s and f != back for _, s, f in before)
                                           or any(s and f != back for _, s, f in after)):
            g["kind"] = "B" if back else "F"
    groups += rest
    segments = []
    for g in groups:
        seg = list(g["items"][0])
        for start, end in sorted(g["items"])[1:]:
            if start > seg[1] + GAP_NS:
                segments.append(tuple(seg))
                seg = [start, end]
            else:
                seg[1] = max(seg[1], end)
        segments.append(tuple(seg))
    busy = _union(segments, w0, w1)
    first = min(min(s for s, _ in g["items"]) for g in groups if g["kind"] == "F")
    last = max(max(e for _, e in g["items"]) for g in groups if g["kind"] == "B")
    fill = (first - w0) - _union(segments, w0, first)
    drain = (w1 - last) - _union(segments, last, w1)
    return {"busy_ns": busy, "fill_ns": fill, "drain_ns": drain, "wait_ns": (w1 - w0) - busy - fill - drain,
            "bubble_ns": (w1 - w0) - busy}


@pytest.mark.parametrize("folder", list(RUNS))
def test_bubbles_against_the_raw_json(pp_store: Any, folder: str) -> None:
    _, stages, _, _ = RUNS[folder]
    result = _result(pp_store, folder)
    got = {row.rank: row for row in result.stages}
    for rank in range(stages):
        expected = hand_bubbles(SAMPLES / folder / f"rank{rank}.pt.trace.json.gz", rank, stages)
        row = got[rank]
        assert {k: getattr(row, k) for k in expected} == expected, (folder, rank)
        assert row.fill_ns + row.wait_ns + row.drain_ns == row.bubble_ns == row.step_ns - row.busy_ns


@pytest.mark.parametrize("folder", ["pp-gpipe-3stages", "pp-1f1b-4stages", "pp-1f1b-3stages-slow"])
def test_fill_and_drain_grow_toward_the_last_stage(pp_store: Any, folder: str) -> None:
    """Activations reach stage s after s forwards (fill), and stage s finishes its backwards s
    backwards before the first stage, then waits at the step's meeting point (drain): the first
    stage has the least of both, the last stage more than the first."""
    rows = sorted(_result(pp_store, folder).stages, key=lambda r: r.stage)
    fills, drains = [r.fill_ns for r in rows], [r.drain_ns for r in rows]
    assert fills[0] == min(fills) and drains[0] == min(drains)
    assert fills[-1] > fills[0] + 1_000_000 and drains[-1] > drains[0] + 1_000_000
    if folder == "pp-gpipe-3stages":  # measured: fill 0.0, 2.7, 3.5 ms; drain 0.3, 19.7, 24.2 ms
        assert fills == sorted(fills) and drains == sorted(drains)
        # GPipe's first stage idles between its last forward and first backward: a wait, not fill or drain
        assert rows[0].wait_ns > 10 * (rows[0].fill_ns + rows[0].drain_ns)


def test_slow_stage_is_named(pp_store: Any) -> None:
    """Stage 1 got an extra product: the finding names rank 1 and the others' bubbles exceed its own."""
    result = _result(pp_store, "pp-1f1b-3stages-slow")
    findings = list(bubble_findings(result))
    assert [f.rule for f in findings] == ["pipeline.bubble"]
    finding = findings[0]
    assert finding.evidence["ranks"] == [1] and finding.evidence["slow_stage"] == 1
    assert "stage 1 (rank 1)" in finding.message
    fractions = {r.rank: r.bubble_ns / r.step_ns for r in result.stages}
    assert fractions[1] < min(fractions[0], fractions[2])


@pytest.mark.parametrize("folder", ["pp-gpipe-3stages", "pp-1f1b-4stages"])
def test_balanced_runs_name_no_slow_stage(pp_store: Any, folder: str) -> None:
    """The even recordings exceed the ideal too (gloo transfers take milliseconds on this machine),
    but no stage's extra work explains it: the finding says so and names every stage's rank."""
    findings = list(bubble_findings(_result(pp_store, folder)))
    assert len(findings) == 1 and "no stage is much slower" in findings[0].message
    assert findings[0].evidence["ranks"] == list(range(RUNS[folder][1]))


def test_summary_json_contract(pp_store: Any) -> None:
    doc = build_summary(pp_store, "pp-1f1b-3stages-slow")
    pipe = doc["pipeline"]
    assert {"schedule", "stages_count", "microbatches", "ideal_fraction", "stages"} <= set(pipe)
    assert (pipe["schedule"], pipe["stages_count"], pipe["microbatches"]) == ("1f1b", 3, 4)
    for row in pipe["stages"]:
        assert {"rank", "stage", "step", "busy_ns", "bubble_ns", "fill_ns", "drain_ns", "wait_ns",
                "bubble_fraction"} <= set(row)
        assert len(row["microbatches"]) == 8
    assert list(pipe)[:5] == ["schedule", "stages_count", "microbatches", "ideal_fraction", "measured_fraction"]
    assert list(pipe["stages"][0])[:9] == ["rank", "stage", "step", "busy_ns", "bubble_ns", "fill_ns", "drain_ns",
                                           "wait_ns", "bubble_fraction"]
    bubble = [f for f in doc["findings"] if f["rule"] == "pipeline.bubble"]
    assert len(bubble) == 1 and bubble[0]["ranks"] == [1]
    slow = pipe["stages"][1]
    assert bubble[0]["time_at_stake_ns"] == bubble[0]["evidence"]["extra_busy_ns"] > 0.3 * slow["step_ns"]


def test_slow_stage_leads_the_verdict(pp_store: Any) -> None:
    """The slow stage is the cause: pipeline.bubble comes first among the findings, on the first
    screen; comm.exposed does not claim the stages' sends and receives (they wait for stage 1)."""
    from stepscope.commands.summary import render_table

    doc = build_summary(pp_store, "pp-1f1b-3stages-slow")
    assert doc["verdict"]["findings"][0]["rule"] == "pipeline.bubble"
    exposed = [f for f in doc["findings"] if f["rule"] == "comm.exposed"]
    assert all("recv" not in f["message"] and "left out" in f["message"] for f in exposed)
    assert all("not traced" not in f["message"] for f in exposed)  # every rank is traced; a send has two members
    # rank 2 (the last stage) waits at the stages' all-reduce because 1F1B drains from the last
    # stage back to the first: the pipeline's drain, not a late rank
    assert not [f for f in doc["findings"] if f["rule"] == "comm.late_rank"]
    late = doc["late"]["steps"][0]
    assert late["waiting_ranks"] == [2] and late["collective"] == "all_reduce"
    first_screen = render_table(doc, 200).split("per rank and per section")[0]
    first = next(line for line in first_screen.splitlines() if line.startswith("1 "))
    assert "stage 1 (rank 1)" in first


def test_no_pipeline_is_absent(sample_run: Callable[[str], Path]) -> None:
    store = open_store(sample_run("ddp-gloo-2ranks"))
    assert pipeline_analysis(store, "ddp-gloo-2ranks") == Absent(NO_P2P)
    assert evaluate(compute_sections(store, "ddp-gloo-2ranks")) is not None  # the rule skips an absent section


# ---- a GPU pipeline, built: the same on GPU time ----

def _gpu_rank(rank: int, pattern: list[tuple[str, int]], kernel_us: int) -> list[dict[str, Any]]:
    """A 2-stage GPipe rank: ``pattern`` is (what, ts_us) with what in F, B (a compute op that
    launches one kernel of ``kernel_us``), S or R (a c10d send/recv to the other rank)."""
    peer = 1 - rank
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000}]
    for i, (what, ts) in enumerate(pattern):
        if what in "SR":
            events.append({"ph": "X", "cat": "cpu_op", "name": "c10d::send" if what == "S" else "c10d::recv_",
                           "pid": 1, "tid": 1, "ts": ts, "dur": 2, "args": {"Concrete Inputs": ["", "", str(peer), "0"]}})
            continue
        name = "aten::mm" if what == "F" else "autograd::engine::evaluate_function: MmBackward0"
        events += [
            {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 4},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts + 1, "dur": 2,
             "args": {"correlation": 100 + i}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": ts + 5, "dur": kernel_us,
             "args": {"correlation": 100 + i, "stream": 7, "device": 0}},
        ]
    return events


def test_gpu_pipeline_on_kernel_time(make_trace: Callable[..., Path], tmp_path: Path) -> None:
    """Two GPU stages, two microbatches: spans and busy time come from the kernels, placed by
    their launches between the send/recv ops."""
    rank0 = _gpu_rank(0, [("F", 10), ("S", 40), ("F", 50), ("S", 80), ("R", 200), ("B", 300), ("R", 400), ("B", 500)], 20)
    rank1 = _gpu_rank(1, [("R", 45), ("F", 100), ("R", 130), ("F", 140), ("B", 170), ("S", 260), ("B", 270),
                          ("S", 350)], 50)
    paths = [make_trace(f"rank{r}.json", events, distributedInfo={"rank": r, "world_size": 2})
             for r, events in ((0, rank0), (1, rank1))]
    report = ingest_paths(paths, tmp_path / "s", "gpu")
    assert report.ok, report.errors
    result = _result(open_store(tmp_path / "s"), "gpu")
    assert (result.schedule, result.stages_count, result.microbatches) == (GPIPE, 2, 2)
    rows = {r.rank: r for r in result.stages}
    # rank 0: kernels [15, 35), [55, 75), [305, 325), [505, 525) (us); the step ends at 1000 us
    assert [(s["kind"], s["start_ns"] // 1000, s["end_ns"] // 1000) for s in rows[0].spans] == [
        ("forward", 15, 35), ("forward", 55, 75), ("backward", 305, 325), ("backward", 505, 525)]
    assert rows[0].busy_ns == 4 * 20_000
    assert (rows[0].fill_ns, rows[0].drain_ns) == (15_000, 1000_000 - 525_000)
    # rank 1: kernels of 50 us from 105, 145 (forwards), 175, 275 (backwards): [105, 225) and [275, 325)
    assert [(s["kind"], s["start_ns"] // 1000) for s in rows[1].spans] == [
        ("forward", 105), ("forward", 145), ("backward", 175), ("backward", 275)]
    assert rows[1].busy_ns == 120_000 + 50_000
    assert rows[1].fill_ns == 105_000


def test_summary_text_shows_bubbles_beside_the_ideal_and_the_slow_stage(pp_store: Any) -> None:
    from stepscope.commands.summary import render_table

    doc = build_summary(pp_store, "pp-1f1b-3stages-slow")
    text = render_table(doc, 200, ("pipeline",))
    assert "pipeline: 1f1b, 3 stages, 4 microbatches" in text
    assert "ideal bubble" in text and "33.3%" in text and "76.7%" in text
    stage1 = next(line for line in text.splitlines() if line.startswith("1 ") and "FFBFBFBB" in line)
    assert "51.4%" in stage1 and "+18 pts" in stage1
    assert "stage 1 (rank 1) is busy" in " ".join(text.split())


def test_transfers_without_peers_say_so(make_trace: Callable[..., Path], tmp_path: Path) -> None:
    from stepscope.analysis.pipeline_stages import NO_PEERS

    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
              {"ph": "X", "cat": "cpu_op", "name": "c10d::send", "pid": 1, "tid": 1, "ts": 10, "dur": 5}]
    report = ingest_paths([make_trace("rank0.json", events)], tmp_path / "s", "old")
    assert report.ok
    assert pipeline_analysis(open_store(tmp_path / "s"), "old") == Absent(NO_PEERS)
