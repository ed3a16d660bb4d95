"""Who made whom wait, on the project's own 3-rank gloo recordings (examples/late_rank_gloo.py):
rank 2 sleeps 30 ms before its all-reduce in every step of gloo-3ranks-late, nobody sleeps in
gloo-3ranks-even. Waits are checked against a loop over the raw JSON (tests/rawmatch.py), the
late-rank finding against the known cause, and clock alignment against known offsets added to
the ranks' timestamps."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis import Absent, evaluate
from stepscope.analysis.breakdown import host_breakdown, step_breakdown
from stepscope.analysis.findings import RULES
from stepscope.analysis.lateness import late_arrivals, late_section
from stepscope.analysis.matching import clock_offsets
from stepscope.store.rankstats.parts import COMM_EXPOSED, COMMUNICATION_OPS, GPU, HOST
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests import rawmatch
from tests._intervals import clip, intersect, length, subtract, union
from tests.conftest import REPO, copy_run, load_raw, write_trace
from tests.rawcalc import comm_kernels, kernels, span_ns, step_windows

SAMPLES = REPO / "sample_traces"
SHIFT_US = {0: 0.0, 1: 3000.0, 2: -5000.0}
"""Known clock offsets added to the ranks' timestamps: +3 ms, -5 ms."""


def _files(folder: str) -> list[Path]:
    return sorted((SAMPLES / folder).glob("rank*.pt.trace.json.gz"))


def _shifted(path: Path, rank: int, out: Path) -> Path:
    """The trace as if recorded on a host of its own whose clock runs ``SHIFT_US`` ahead (ranks
    naming one host share its clock and are never corrected)."""
    doc = load_raw(path)
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += SHIFT_US[rank]
    doc["host_name"] = f"{doc.get('host_name', 'host')}-{rank}"
    return write_trace(out / path.name, doc["traceEvents"], **{k: v for k, v in doc.items() if k != "traceEvents"})


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, sample_run) -> Any:
    """One store, four runs: late and even as recorded (copied from the session's sample stores),
    and each with its ranks' clocks shifted."""
    root = tmp_path_factory.mktemp("late")
    for name in ("late", "even"):
        files = _files(f"gloo-3ranks-{name}")
        assert len(files) == 3
        copy_run(sample_run(f"gloo-3ranks-{name}"), root / "store", f"gloo-3ranks-{name}", as_run=name)
        shifted = [_shifted(p, r, root / f"{name}-shifted") for r, p in enumerate(files)]
        assert ingest_paths(shifted, root / "store", f"{name}-shifted").ok
    return open_store(root / "store")


def _late_findings(store: Any, run: str) -> list[Any]:
    result = late_section(store, run, None)
    return [] if isinstance(result, Absent) else evaluate({"late": result}, [RULES["comm.late_rank"]])


def test_the_sleeping_rank_is_named_with_the_wait_it_caused(store: Any) -> None:
    """Rank 2 sleeps 30 ms before the all-reduce: ranks 0 and 1 wait about 30 ms each, every step;
    the lateness comes from inside the step, on the host (no op runs while it sleeps)."""
    [finding] = _late_findings(store, "late")
    assert finding.ranks == (2,) and finding.evidence["waiting_ranks"] == [0, 1]
    assert finding.evidence["origin"] == "inside_step" and finding.evidence["cause"] == "host"
    assert finding.evidence["cause_part"] == "other"
    assert finding.message.startswith("rank 2 arrived late at the all_reduce in 4 of 4 steps")
    for row in late_arrivals(store, "late").to_pylist():
        assert row["late_ranks"] == [2]
        assert row["caused_wait_ns"] == pytest.approx(2 * 30e6, rel=0.15)
        assert row["cause_excess_ns"] == pytest.approx(30e6, rel=0.15)
    # the same waits from the raw JSON, with the documented matching
    instances = rawmatch.match([load_raw(p) for p in _files("gloo-3ranks-late")])
    assert len(instances) == 4 and all(i.valid for i in instances)
    for inst in instances:
        by_rank = {m.rank: m for m in inst.members}
        assert by_rank[2].late and not by_rank[0].late and not by_rank[1].late
        assert by_rank[0].wait + by_rank[1].wait == pytest.approx(2 * 30e6, rel=0.15)


def test_no_late_rank_without_the_sleep(store: Any) -> None:
    """The same job without the sleep: waits of a millisecond or two that move from rank to rank
    (three processes on two cores): jitter, no finding."""
    assert _late_findings(store, "even") == []


def test_clock_offsets_are_recovered_and_the_findings_do_not_change(store: Any) -> None:
    """+3 ms on rank 1's clock, -5 ms on rank 2's: the estimated offsets move by that much, within
    the spread of the end times they are estimated from, and the diagnosis is the unshifted one."""
    for run in ("late", "even"):
        plain = {r["rank"]: r for r in clock_offsets(store, run).to_pylist()}
        shifted = {r["rank"]: r for r in clock_offsets(store, f"{run}-shifted").to_pylist()}
        assert {r["reference_rank"] for r in plain.values()} == {0} and shifted[0]["clock_offset_ns"] == 0
        for rank, shift_us in SHIFT_US.items():
            moved = shifted[rank]["clock_offset_ns"] - plain[rank]["clock_offset_ns"]
            # both estimates carry the spread of their rank's and the reference's end times
            spread = max(shifted[rank]["clock_spread_ns"], plain[rank]["clock_spread_ns"]) + max(
                shifted[0]["clock_spread_ns"], plain[0]["clock_spread_ns"])
            assert abs(moved - shift_us * 1000) <= spread, (run, rank, moved, spread)
        for rank in (1, 2):
            assert shifted[rank]["clock_correction_ns"] != 0, "offsets of 3 and 5 ms exceed the spread"

        def key(findings: list[Any]) -> list[tuple]:
            return [(f.rule, f.ranks, f.evidence["origin"], f.evidence["cause"]) for f in findings]

        assert key(_late_findings(store, f"{run}-shifted")) == key(_late_findings(store, run))
    # the summary says the clocks were aligned, and on which ranks
    from stepscope.analysis.summary import build_summary
    from stepscope.commands.summary import render_table

    doc = build_summary(store, "late-shifted")
    assert {c["rank"] for c in doc["verdict"]["clock_corrections"]} >= {1, 2}
    assert "clocks aligned on rank 0's from the end times of matched collectives: " in render_table(doc)
    plain_rows = late_arrivals(store, "late").to_pylist()
    shifted_rows = late_arrivals(store, "late-shifted").to_pylist()
    for a, b in zip(plain_rows, shifted_rows, strict=True):
        assert b["caused_wait_ns"] == pytest.approx(a["caused_wait_ns"], rel=0.1)


def _host_exposed_comm(doc: dict, w0: int, w1: int) -> list[tuple[int, int]]:
    """Host time in a window where a communication op runs and no earlier host part does."""
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("dur", 0) > 0]
    comm, before = [], []
    for e in events:
        name, cat = e.get("name", ""), e.get("cat")
        if cat not in ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"):
            continue
        if name.startswith(("c10d::", "gloo:", "nccl:", "record_param_comms")):
            comm.append(span_ns(doc, e))
        elif (cat == "cpu_op" and not name.startswith("ProfilerStep#")) or name.startswith(
                ("enumerate(DataLoader)#", "Optimizer.step#", "Optimizer.zero_grad#")) or name.endswith("Synchronize"):
            before.append(span_ns(doc, e))
    return subtract(clip(union(comm), w0, w1), union(before))


def test_host_wait_split_matches_the_raw_json(store: Any) -> None:
    """communication_wait_ns per rank and step = |union of the rank's waits ∩ its exposed host
    communication ∩ the ProfilerStep|, computed from the JSON; the two sub-parts sum to the part."""
    docs = [load_raw(p) for p in _files("gloo-3ranks-late")]
    waits: dict[int, list[tuple[int, int]]] = {0: [], 1: [], 2: []}
    for inst in rawmatch.match(docs):
        for m in inst.members:
            waits[m.rank].append((m.start, m.start + m.wait))
    rows = host_breakdown(store, "late").to_pylist()
    for row in rows:
        doc = docs[row["rank"]]
        exposed = _host_exposed_comm(doc, row["start_ns"], row["end_ns"])
        expected = length(intersect(union(waits[row["rank"]]), exposed))
        assert row[HOST.parts[4].sub_parts[0].column] == expected, (row["rank"], row["step"])
        assert sum(row[p.column] for p in COMMUNICATION_OPS.sub_parts) == row[COMMUNICATION_OPS.column]
        assert sum(row[p.column] for p in HOST.leaves()) == row["dur_ns"]
    assert sum(r["communication_wait_ns"] for r in rows if r["rank"] in (0, 1)) > 8 * 25e6


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, shared_traces: Path) -> tuple[Any, list[Path]]:
    """trace_filter/sampled_rank-0 and -1 (two ranks of one NCCL job) as run ``pair``, and their files."""
    paths = [shared_traces / f"hta/trace_filter/sampled_rank-{r}.json.gz" for r in (0, 1)]
    root = tmp_path_factory.mktemp("pair") / "store"
    assert ingest_paths(paths, root, "pair").ok
    return open_store(root), paths


def test_gpu_wait_split_matches_the_raw_json(pair: tuple[Any, list[Path]]) -> None:
    """trace_filter/sampled_rank-0 and -1 (two ranks of one NCCL job): comm_wait_ns per rank and
    step = |union of the waits (rawmatch) ∩ (communication union - compute union) ∩ the step
    window|; the parts (leaves) still sum to the step exactly."""
    paired, paths = pair
    docs = [load_raw(p) for p in paths]
    waits: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    for inst in rawmatch.match(docs):
        for m in inst.members:
            if inst.valid and m.wait:
                waits[m.rank].append((m.start, m.start + m.wait))
    rows = step_breakdown(paired, "pair").to_pylist()
    assert len(rows) == 4
    for row in rows:
        doc = docs[row["rank"]]
        w0, w1 = step_windows(doc)[row["step"]]
        assert (row["start_ns"], row["end_ns"]) == (w0, w1)
        comm_ids = {id(e) for e in comm_kernels(doc)}
        comm = union([span_ns(doc, e) for e in comm_kernels(doc)])
        compute = union([span_ns(doc, e) for e in kernels(doc) if id(e) not in comm_ids and e["dur"] > 0])
        exposed = subtract(clip(comm, w0, w1), compute)
        assert row["comm_wait_ns"] == length(intersect(union(waits[row["rank"]]), exposed))
        assert row["comm_wait_ns"] + row["comm_transfer_ns"] == row[COMM_EXPOSED.column]
        assert sum(row[p.column] for p in GPU.leaves()) == row["dur_ns"]
    assert sum(r["comm_wait_ns"] for r in rows) > 0
    assert statistics.mean(r["comm_wait_ns"] for r in rows if r["rank"] == 1) == 0  # rank 1 arrives last


def test_step_timeline_tiles_each_rank_as_its_breakdown(store: Any, pair: tuple[Any, list[Path]]) -> None:
    """The dashboard's cross-rank timeline: per rank, its segments of each part sum to the step
    breakdown's leaves (host here, GPU on trace_filter), segments tile the window without gaps,
    and the late arrival is marked on rank 2."""
    from stepscope.analysis.timeline import late_marks, step_timeline, timeline_parts

    cases = [(store, "late", 3, host_breakdown, HOST), (pair[0], "pair", 552, step_breakdown, GPU)]
    for st, run, step, breakdown, parts in cases:
        segments = step_timeline(st, run, step).to_pylist()
        rows = {r["rank"]: r for r in breakdown(st, run).to_pylist() if r["step"] == step}
        for rank, row in rows.items():
            mine = sorted((s for s in segments if s["rank"] == rank), key=lambda s: s["t0_ns"])
            assert {s["part"] for s in mine} <= {p.name for p in timeline_parts(parts)}
            for part in timeline_parts(parts):
                assert sum(s["dur_ns"] for s in mine if s["part"] == part.name) == row[part.column], (run, rank, part)
            assert all(a["t1_ns"] == b["t0_ns"] for a, b in zip(mine, mine[1:]))
            assert mine[-1]["t1_ns"] - mine[0]["t0_ns"] == row["dur_ns"]
    marks = late_marks(store, "late", 3).to_pylist()
    assert [m["rank"] for m in marks] == [2] and marks[0]["others_wait_ns"] > 50e6


def _bars_slice_by_slice(segments: list[dict], slices: int) -> list[tuple]:
    """``drawn_bars`` counted in Python, slice by slice: per rank, each slice's time per part,
    the part with most (ties: its name), runs of one part joined."""
    origin = min(s["t0_ns"] for s in segments)
    width = max(1, -(-(max(s["t1_ns"] for s in segments) - origin) // slices))
    bars = []
    for rank in sorted({s["rank"] for s in segments}):
        ruled = []
        for i in range(slices):
            lo, hi = origin + i * width, origin + (i + 1) * width
            held: dict[str, list[int]] = {}
            for s in segments:
                if s["rank"] == rank and s["t0_ns"] < hi and s["t1_ns"] > lo:
                    h = held.setdefault(s["part"], [0, hi, lo, 0])
                    h[0] += min(s["t1_ns"], hi) - max(s["t0_ns"], lo)
                    h[1], h[2] = min(h[1], max(s["t0_ns"], lo)), max(h[2], min(s["t1_ns"], hi))
                    h[3] += s["t0_ns"] >= lo
            if held:
                part = min(held, key=lambda p: (-held[p][0], p))
                ruled.append((i, part, *held[part]))
        for i, part, ns, c0, c1, begun in ruled:
            last = bars[-1] if bars else None
            if last and last[0] == rank and last[1] == part and last[-1] == i - 1:
                bars[-1] = (rank, part, last[2], c1, last[4] + ns, last[5] + begun, i)
            else:
                bars.append((rank, part, c0, c1, ns, begun, i))
    return sorted(b[:6] for b in bars)


def test_drawn_bars_are_the_ruling_part_of_each_slice(store: Any, pair: tuple[Any, list[Path]]) -> None:
    """The timeline as drawn (``drawn_bars``) against the same rule counted slice by slice in
    Python, on a host run and a real GPU pair; and drawing it takes fewer bars than segments."""
    from stepscope.analysis.timeline import drawn_bars, step_timeline

    for st, run, step in ((store, "late", 3), (pair[0], "pair", 552)):
        segments = step_timeline(st, run, step)
        bars = drawn_bars(segments, slices=120)
        got = sorted((b["rank"], b["part"], b["t0_ns"], b["t1_ns"], b["part_ns"], b["segments"]) for b in bars.to_pylist())
        assert got == _bars_slice_by_slice(segments.to_pylist(), 120), run
        assert bars.num_rows < segments.num_rows, run


def test_drawn_bars_by_hand() -> None:
    """A 1 ns wait inside compute is drawn as compute (it rules no slice); a 10 ns wait keeps its
    place; the compute bar says how much of it is compute."""
    import pyarrow as pa

    from stepscope.analysis.timeline import drawn_bars

    rows = [(0, "compute", 0, 10), (0, "comm_wait", 10, 11), (0, "compute", 11, 20), (0, "comm_wait", 20, 30),
            (0, "compute", 30, 40)]
    segments = pa.table({k: [r[i] for r in rows] for i, k in enumerate(("rank", "part", "t0_ns", "t1_ns"))})
    assert drawn_bars(segments, slices=8).to_pylist() == [
        {"rank": 0, "part": "compute", "t0_ns": 0, "t1_ns": 20, "part_ns": 19, "segments": 2},
        {"rank": 0, "part": "comm_wait", "t0_ns": 20, "t1_ns": 30, "part_ns": 10, "segments": 1},
        {"rank": 0, "part": "compute", "t0_ns": 30, "t1_ns": 40, "part_ns": 10, "segments": 1},
    ]
    tie = pa.table({"rank": [1, 1], "part": ["idle", "compute"], "t0_ns": [0, 5], "t1_ns": [5, 10]})
    assert drawn_bars(tie, slices=1).to_pylist() == [  # 5 ns each: the first name rules
        {"rank": 1, "part": "compute", "t0_ns": 5, "t1_ns": 10, "part_ns": 5, "segments": 1}]
