"""The step's graph across ranks, its critical path and its replay (issue 21), on the project's
3-rank gloo recordings (rank 2 sleeps 30 ms before its all-reduce in gloo-3ranks-late) and on
shared traces with steps. The edges are checked against a plain-Python pass over the raw JSON."""

from __future__ import annotations

import json
import shutil
import statistics
from collections import defaultdict
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.critical_path import (Collective, Mark, RankStep, RunGraph, Segments, StepGraph,
                                              step_paths, transfer_end)
from stepscope.analysis.replay import busy_ns, on_time_excess, parse_change, replay, replay_step, volume_costs, what_if
from stepscope.cli import main
from stepscope.errors import Inconclusive, StoreError, UsageError
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests._store_versions import as_older_version
from tests.conftest import REPO, built_once, copy_run, load_raw, sample_store, write_trace

SAMPLES = REPO / "sample_traces"
MULTI_RANK = ("gloo-3ranks-late", "gloo-3ranks-even", "pp-1f1b-3stages-slow", "ddp-gloo-2ranks", "pp-gpipe-3stages",
              "pp-1f1b-4stages", "pp-interleaved-2ranks")
SHARED_WITH_STEPS = ("hta/trace_diff/control/control.json.gz", "hta/nccl_parser_config/nccl_data.json.gz")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The runs of ``MULTI_RANK`` in one store, copied from the session's store of each sample
    run (:func:`tests.conftest.sample_store`, ingested once per test run) rather than ingested
    again (:func:`tests.conftest.copy_run` writes what their ingest writes)."""
    def build(folder: Path) -> None:
        for name in MULTI_RANK:
            copy_run(sample_store(tmp_path_factory, name), folder, name)

    return open_store(built_once(tmp_path_factory, "critical-path-samples", build))


def _ns(us: Any) -> int:
    return int(Decimal(str(us)) * 1000)


def _raw_edges(path: Path) -> set[tuple[str, int, int, int]]:
    """(kind, host start, host end, awaited end) relative to the trace's first ProfilerStep start,
    from the JSON: a gloo transfer is issued by the latest main-thread ``c10d::`` op starting at
    or before it; the host waits for it in the main-thread stretch (an idle gap up to the next op
    or the step's end, or a ``c10d::`` op) in which it ends."""
    events = [e for e in load_raw(path, exact=True)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    main = (steps[0]["pid"], steps[0]["tid"])
    base = _ns(steps[0]["ts"])
    host = sorted((e for e in events if (e["pid"], e["tid"]) == main and not e["name"].startswith("ProfilerStep#")
                   and e.get("cat") in ("cpu_op", "user_annotation")), key=lambda e: e["ts"])
    gloo = [e for e in events if e["name"].startswith("gloo:")]
    out = set()
    for s in steps:
        w0, w1 = _ns(s["ts"]), _ns(s["ts"]) + _ns(s["dur"])
        inside = [e for e in host if w0 <= _ns(e["ts"]) < w1]
        stretches, reach = [], None
        for e in inside:
            t0 = _ns(e["ts"])
            if reach is not None and t0 > reach:
                stretches.append((reach, t0))
            reach = max(reach or t0, t0 + _ns(e["dur"]))
            if e["name"].startswith("c10d::"):
                stretches.append((t0, t0 + _ns(e["dur"])))
        if reach is not None and w1 > reach:
            stretches.append((reach, w1))
        for g in gloo:
            g0, g1 = _ns(g["ts"]), _ns(g["ts"]) + _ns(g["dur"])
            ops = [_ns(e["ts"]) for e in host if e["name"].startswith("c10d::") and _ns(e["ts"]) <= g0]
            if ops and w0 <= max(ops) < w1:
                out.add(("issue", max(ops) - base, max(ops) - base, g1 - base))
            for a, b in stretches:
                if a < g1 <= b:
                    out.add(("wait", a - base, b - base, g1 - base))
    return out


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_edges_match_the_raw_json(store: Any, rank: int) -> None:
    rows = store.sql("SELECT e.kind, e.host_ts_ns - b.s AS a, e.host_end_ns - b.s AS b, e.dep_end_ns - b.s AS d "
                     "FROM rank_edges e, (SELECT min(start_ns) AS s FROM steps WHERE run = $run AND rank = $rank) b "
                     "WHERE e.run = $run AND e.rank = $rank", {"run": "gloo-3ranks-late", "rank": rank}).to_pylist()
    got = {(r["kind"], r["a"], r["b"], r["d"]) for r in rows}
    expected = _raw_edges(SAMPLES / "gloo-3ranks-late" / f"rank{rank}.pt.trace.json.gz")
    assert got == expected and len(got) >= 8


def test_critical_path_of_the_late_run_runs_through_the_sleeping_rank(store: Any) -> None:
    paths = step_paths(store, "gloo-3ranks-late")
    assert [p.step for p in paths] == [2, 3, 4, 5]
    windows, starts = {}, {}
    for rank in range(3):
        doc = load_raw(SAMPLES / "gloo-3ranks-late" / f"rank{rank}.pt.trace.json.gz", exact=True)
        for e in doc["traceEvents"]:
            if e.get("name", "").startswith("ProfilerStep#"):
                windows[(rank, int(e["name"].split("#")[1]))] = _ns(e["dur"])
                starts[(rank, int(e["name"].split("#")[1]))] = int(doc.get("baseTimeNanoseconds", 0)) + _ns(e["ts"])
    for p in paths:
        pieces = [x for x, _ in p.pieces]
        first, last = pieces[0], pieces[-1]
        own = [x for x in pieces if x.what != "carried"]
        # the sleep: rank 2's host time before its issue (after what it carried from its previous step)
        assert own[0].rank == 2 and own[0].what == "host" and all(x.rank == 2 for x in pieces[:pieces.index(own[0])])
        # contiguous pieces: the length is the last end minus the first start
        assert p.length_ns == last.t1 - first.t0 == sum(x.t1 - x.t0 for x in pieces)
        assert sum(p.by_part.values()) == p.length_ns == sum(p.by_rank.values())
        assert p.by_rank[2] > 25_000_000 and p.by_part["other"] > 25_000_000
        # the measured step from the JSON: the latest end minus the earliest start over the ranks
        # (one host, one clock: no correction)
        span = (max(starts[(r, p.step)] + windows[(r, p.step)] for r in range(3))
                - min(starts[(r, p.step)] for r in range(3)))
        assert p.length_ns == p.measured_ns == span


@pytest.mark.parametrize("run", MULTI_RANK)
def test_unchanged_replay_gives_back_the_measured_steps(store: Any, run: str) -> None:
    result = what_if(store, run)
    assert result is not None and result.steps
    for s in result.steps:
        assert abs(s.unchanged_ns / s.measured_ns - 1) < 0.02
        assert s.predicted_ns == s.unchanged_ns


@pytest.mark.parametrize("relative", SHARED_WITH_STEPS)
def test_unchanged_replay_on_shared_traces(ingested: Any, relative: str) -> None:
    with open_store(ingested(relative)) as s:
        result = what_if(s, "t")
        assert result is not None and len(result.steps) >= 3
        assert all(abs(p.unchanged_ns / p.measured_ns - 1) < 0.02 for p in result.steps)
        assert all(abs(p.length_ns / p.measured_ns - 1) < 0.02 for p in step_paths(s, "t"))


def test_late_rank_on_time_removes_the_sleep(store: Any) -> None:
    result = what_if(store, "gloo-3ranks-late", ["rank 2: on time"])
    assert result is not None
    for s in result.steps:  # rank 2 slept 30 ms before each all-reduce
        assert s.measured_ns - s.predicted_ns > 20_000_000
    faster = what_if(store, "gloo-3ranks-late", ["communication_transfer*0"])
    slower = what_if(store, "gloo-3ranks-late", ["rank 0: compute_ops*3"])
    assert faster is not None and slower is not None
    assert faster.predicted_ns < faster.unchanged_ns and slower.predicted_ns >= slower.unchanged_ns


def test_whatif_replays_the_chosen_steps_alone(store: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``--step``: the chosen steps only, and ``on time`` learns from them alone: rank 2's
    excess in step 2 is then over its peers' median in that step (3.4 ms predicted), not over the
    same quantile of their four steps (2.8 ms)."""
    assert main(["whatif", "--store", str(store.root), "--run", "gloo-3ranks-late", "--step", "2",
                 "--change", "rank 2: on time", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    alone = what_if(store, "gloo-3ranks-late", ["rank 2: on time"], steps={2})
    assert [s["step"] for s in out["steps"]] == [2] and alone is not None
    assert out["predicted_ns"] == round(alone.predicted_ns)
    every = what_if(store, "gloo-3ranks-late", ["rank 2: on time"])
    assert every is not None and round(next(p for p in every.steps if p.step == 2).predicted_ns) != out["predicted_ns"]
    assert what_if(store, "gloo-3ranks-late", steps={99}) is None


@pytest.mark.parametrize("text", ["bogus*2", "compute", "on time", "rank x: on time"])
def test_bad_changes_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError):
        parse_change(text)


def test_changes_parse() -> None:
    c = parse_change("rank 3,5: comm_transfer*0.5")
    assert c.ranks == frozenset({3, 5}) and c.factor == 0.5 and "communication_transfer" in c.parts
    assert parse_change("rank 7: on time").on_time
    assert parse_change("comm_volume*2").volume and not parse_change("comm_transfer*2").volume


def test_migrate_from_version_3_writes_the_edges(store: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    query = "SELECT * FROM rank_edges WHERE run = 'gloo-3ranks-late' ORDER BY rank, host_ts_ns, kind, dep_ts_ns"
    before = store.sql(query).to_pylist()
    copy = tmp_path / "store"
    copy_run(Path(store.root), copy, "gloo-3ranks-late")  # the run whose edges are compared
    shutil.rmtree(copy / ".compact", ignore_errors=True)
    as_older_version(copy, 3, ("rank_edges",))
    with pytest.raises(StoreError, match=r"schema version 3, older .*stepscope migrate --store"):
        open_store(copy)
    assert main(["migrate", "--store", str(copy)]) == 0
    assert "traces migrated" in capsys.readouterr().out
    with open_store(copy) as migrated:
        assert migrated.sql(query).to_pylist() == before and len(before) == 24


def test_path_marks_are_the_path_in_the_timelines_time(store: Any) -> None:
    from stepscope.analysis.critical_path import path_marks
    from stepscope.analysis.timeline import step_timeline

    path = next(p for p in step_paths(store, "gloo-3ranks-late") if p.step == 3)
    marks = path_marks(store, "gloo-3ranks-late", 3).to_pylist()
    assert [(m["rank"], m["t0_ns"], m["t1_ns"]) for m in marks] == [(p.rank, p.t0, p.t1) for p, _ in path.pieces]
    lane = step_timeline(store, "gloo-3ranks-late", 3).to_pylist()
    rank2 = [r for r in lane if r["rank"] == 2]
    # the path's own pieces start where rank 2's lane starts: the same aligned clock (before it,
    # what rank 2 carried from its previous step, from the earliest lane's start)
    own = [m for m in marks if m["what"] != "carried"]
    assert own[0]["rank"] == 2 and own[0]["t0_ns"] == min(r["t0_ns"] for r in rank2)
    assert marks[0]["t0_ns"] == min(r["t0_ns"] for r in lane)


def test_overview_marks_the_critical_path(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_dashboard_apptest import assert_clean, open_page

    at = open_page(store.root, "overview", monkeypatch, run="gloo-3ranks-late")
    assert_clean(at)
    specs = [c.proto.spec for c in at.get("vega_lite_chart")]
    timeline = next(s for s in specs if "critical path on rank" in s)
    assert '"height": 3' in timeline.replace('"height":3', '"height": 3')
    assert any("critical path" in c.value for c in at.caption)


def _raw_p2p_pairs(run: str, ranks: int) -> set[frozenset[tuple[int, int]]]:
    """Each send's (rank, start ns) with its recv's, from the JSON: a ``gloo:send``/``gloo:recv``
    takes its peer from the latest ``c10d::send``/``c10d::recv_`` of the rank before it
    (``Concrete Inputs[2]``: the peer, one group here), and the k-th send of a to b pairs with the
    k-th recv of b from a."""
    lanes: dict[tuple[int, int, str], list[tuple[int, int]]] = {}
    for rank in range(ranks):
        doc = load_raw(SAMPLES / run / f"rank{rank}.pt.trace.json.gz", exact=True)
        base = int(doc.get("baseTimeNanoseconds", 0))
        peer = {}
        for e in sorted((e for e in doc["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"]):
            if e["name"] in ("c10d::send", "c10d::recv_"):
                peer[e["name"] == "c10d::send"] = int(e["args"]["Concrete Inputs"][2])
            elif e["name"] in ("gloo:send", "gloo:recv"):
                send = e["name"] == "gloo:send"
                src, dst = (rank, peer[send]) if send else (peer[send], rank)
                lanes.setdefault((src, dst, "send" if send else "recv"), []).append((rank, base + _ns(e["ts"])))
    return {frozenset((s, r)) for (a, b, kind), sends in lanes.items() if kind == "send"
            for s, r in zip(sends, lanes.get((a, b, "recv"), []))}


def test_sends_pair_with_their_recvs_per_peer(store: Any) -> None:
    from stepscope.analysis.critical_path import run_graph

    rg = run_graph(store, "pp-interleaved-2ranks")
    assert rg is not None and rg.unpaired is None and set(rg.shift.values()) == {0}
    pairs = {}
    for g in rg.graphs.values():
        for inst, members in g.instances.items():
            if {m.name for m in members} == {"send", "recv"}:
                pairs[inst] = members
    assert len(pairs) == 24
    # a recv cannot end before its send was issued (the matching's order across the group paired
    # 9 so); the send's gloo:send annotation itself starts only after its c10d::send op moved the data
    for send, recv in (sorted(m, key=lambda c: c.name != "send") for m in pairs.values()):
        assert send.arrival <= recv.end and send.arrival < send.ts
    assert {frozenset((m.rank, m.ts) for m in members) for members in pairs.values()} == \
        _raw_p2p_pairs("pp-interleaved-2ranks", 2)


def test_ranks_on_one_host_share_its_clock(store: Any) -> None:
    from stepscope.analysis.matching import clock_offsets

    hosts = {load_raw(SAMPLES / "pp-1f1b-4stages" / f"rank{r}.pt.trace.json.gz")["host_name"] for r in range(4)}
    assert len(hosts) == 1
    rows = clock_offsets(store, "pp-1f1b-4stages").to_pylist()
    # the p2p ends differ by up to 8.5 ms (a gloo send's annotation closes when it is waited for):
    # an offset, but not the clock's
    assert len(rows) == 4 and max(abs(r["clock_offset_ns"] or 0) for r in rows) > 1_000_000
    assert all(r["clock_correction_ns"] == 0 for r in rows)


def test_held_out_error_is_the_steps_own_variation(store: Any) -> None:
    result = what_if(store, "gloo-3ranks-late")
    assert result is not None and len(result.steps) == 4 and result.heldout_error_ns is not None
    # the steps' mean windows from the JSON, each against the median of the others
    windows: dict[int, list[int]] = {}
    for rank in range(3):
        doc = load_raw(SAMPLES / "gloo-3ranks-late" / f"rank{rank}.pt.trace.json.gz", exact=True)
        for e in doc["traceEvents"]:
            if e.get("name", "").startswith("ProfilerStep#"):
                windows.setdefault(int(e["name"].split("#")[1]), []).append(_ns(e["dur"]))
    means = [sum(v) / len(v) for s, v in sorted(windows.items()) if s in {p.step for p in result.steps}]
    expected = sum(abs(statistics.median(means[:i] + means[i + 1:]) - m) for i, m in enumerate(means)) / len(means)
    assert abs(result.heldout_error_ns / expected - 1) < 0.02
    assert result.error_ns < result.heldout_error_ns


def test_unpaired_transfers_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1's c10d ops lose their peer (no Concrete Inputs): no transfer of either rank pairs,
    and what-if says so."""
    files = []
    for rank in range(2):
        doc = load_raw(SAMPLES / "pp-interleaved-2ranks" / f"rank{rank}.pt.trace.json.gz")
        if rank == 1:
            for e in doc["traceEvents"]:
                if e.get("name") in ("c10d::send", "c10d::recv_"):
                    e["args"].pop("Concrete Inputs", None)
        events = doc.pop("traceEvents")
        files.append(write_trace(tmp_path / "traces" / f"rank{rank}.json.gz", events, **doc))
    assert ingest_paths(files, tmp_path / "store", "cut").ok
    with open_store(tmp_path / "store") as s:
        result = what_if(s, "cut")
    assert result is not None and result.unpaired is not None
    assert result.unpaired.count == 48 and "12 with no c10d::send/c10d::recv_" not in result.unpaired.reason
    assert "24 with no c10d::send/c10d::recv_ op naming their peer" in result.unpaired.reason
    assert "24 whose other side" in result.unpaired.reason
    assert main(["whatif", "--store", str(tmp_path / "store"), "--run", "cut"]) == 0
    assert "48 point-to-point transfers replay as measured" in capsys.readouterr().out


class _AllCompute(Segments):
    """Every host stretch is ``compute_ops`` (a hand-built graph has no ``rank_segments``)."""

    def __init__(self) -> None:
        super().__init__(None, "", [])  # type: ignore[arg-type]

    def cut(self, rank: int, breakdown: str, t0: int, t1: int, shift: int = 0) -> dict[str, int]:
        return {"compute_ops": t1 - t0}


def _p2p(g: StepGraph, inst: int, send: tuple[int, float, float],
         recv: tuple[int, float, float]) -> tuple[Collective, ...]:
    """A paired gloo send (rank, issue, end) and recv in ``g`` (times in ms), issued on their ranks."""
    pair = []
    for (rank, t, end), name in ((send, "send"), (recv, "recv")):
        c = Collective(rank, int(t * MS), int(end * MS), (0, -1), True, name, inst, int(t * MS))
        g.ranks[rank].marks.append(Mark("issue", c.ts, c.ts, c))
        g.instances[inst].append(c)
        pair.append(c)
    return tuple(pair)


def _wait(g: StepGraph, c: Collective, t0: float, t1: float) -> None:
    g.ranks[c.rank].marks.append(Mark("wait", int(t0 * MS), int(t1 * MS), c, c.end))


MS = 1_000_000


def _pinned_send_graph() -> StepGraph:
    """Two gloo ranks, 30 ms steps. Rank 0 issues send A at 1 ms (rank 1 posts its recv at 1.5 ms,
    which ends at 1.7: the data moved), computes to 20 ms, and only then waits for send A, whose
    annotation closes with that wait (20.1 ms), as a 1F1B stage waits for its forward send after
    the next microbatch. It issues send B at 25 ms, which rank 1 has waited for since 5 ms."""
    g = StepGraph(0, {r: RankStep(r, 0, 30 * MS) for r in (0, 1)}, defaultdict(list))
    send_a, recv_a = _p2p(g, -1, (0, 1, 20), (1, 1.5, 1.7))
    send_a.end = int(20.1 * MS)
    _wait(g, recv_a, 1.6, 1.7)
    _wait(g, send_a, 20, 20.1)
    send_b, recv_b = _p2p(g, -2, (0, 25, 26), (1, 5, 26))
    _wait(g, recv_b, 5.1, 26)
    _wait(g, send_b, 25.5, 26)
    for rs in g.ranks.values():
        rs.marks.sort(key=lambda m: (m.t, m.kind != "issue"))
    return g


def test_a_gloo_send_waited_for_late_does_not_hold_its_host() -> None:
    """Send A's end (20.1 ms) is rank 0's own wait, not its transfer: the data moved when rank 1's
    recv ended (1.7 ms). Halving rank 0's compute halves its host time; the wait for send A,
    which held nothing, keeps only its own 0.1 ms instead of re-imposing the 19 ms of compute
    before it (the replay took the send's end as its transfer's: rank 0 still reached send B
    at 25 ms)."""
    g = _pinned_send_graph()
    assert transfer_end(g, g.instances[-1][0]) == int(1.7 * MS)
    assert replay_step(g, _AllCompute(), {}, []) == 30 * MS
    # rank 0: send B at 0.5 + 9.5 + 0.1 + 2.45 = 12.55 ms; the transfer after the last arrival
    # (1 ms) ends both sides (rank 0's 0.25 ms of host work before its wait fits in it); then
    # rank 0 works 4 ms halved, rank 1 4 ms
    rank0, rank1 = 12.55 + 1 + 2, 12.55 + 1 + 4
    assert replay_step(g, _AllCompute(), {}, [parse_change("rank 0: compute_ops*0.5")]) == \
        pytest.approx((rank0 + rank1) / 2 * MS)


def test_on_time_takes_the_excess_busy_time_off_the_late_rank() -> None:
    """Rank 0 reached send B 20 ms after rank 1 had posted its recv. Its host time outside its
    waits is 29.4 ms (30 less its two waits' 0.1 and 0.5 ms), rank 1's 9 ms (30 less 0.1 and
    20.9): on time, rank 0 is 20.4 ms less busy, taken off the 24.9 ms of host time that led to
    send B (from the step's start: its wait for send A held nothing), every stretch of it."""
    g = _pinned_send_graph()
    assert (busy_ns(g.ranks[0]), busy_ns(g.ranks[1])) == (int(29.4 * MS), 9 * MS)
    assert on_time_excess([g], frozenset({0})) == pytest.approx({(0, 0): 20.4 * MS})
    # rank 0 reaches send B at 4.5 ms of host time plus its 0.1 ms wait for send A; rank 1 has
    # waited there since 5 ms: the 1 ms transfer from 5 ms (rank 0's 0.5 ms of host work before
    # its wait fits in it), then both ranks' last 4 ms
    predicted = replay_step(g, _AllCompute(), {}, [parse_change("rank 0: on time")])
    assert predicted == pytest.approx((5 + 1 + 4) * MS)


def _all_reduce_steps(arrivals: Sequence[tuple[float, float]]) -> RunGraph:
    """Two gloo ranks, one step per pair of arrivals (ms): each rank works until its arrival, then
    both all-reduce (1 ms after the later arrival) and work 1 ms more."""
    graphs = {}
    for step, pair in enumerate(arrivals):
        g = StepGraph(step, {}, defaultdict(list))
        last = max(pair)
        for rank, t in enumerate(pair):
            c = Collective(rank, int(t * MS), int((last + 1) * MS), (0, -1), True, "all_reduce", step)
            g.ranks[rank] = RankStep(rank, 0, int((last + 2) * MS), [Mark("issue", c.ts, c.ts, c),
                                                                   Mark("wait", c.ts, c.end, c, c.end)])
            g.instances[step].append(c)
        graphs[step] = g
    return RunGraph(graphs, {}, _AllCompute())


def test_on_time_keeps_a_spread_like_its_peers() -> None:
    """Rank 1 arrives 20 ms after rank 0, 2 ms more in step 2; rank 0 2 ms later in step 4 (each
    rank's own hiccup). On time, rank 1's steps are as busy as rank 0's in the same order (31 ms
    against 11, its busiest, 33 ms, against rank 0's busiest, 13): 20 ms off every step, and
    step 2 keeps its 2 ms as step 4 does, as in a run where both ranks are on time either one's
    hiccup delays the other. Removing each step's whole lateness predicted 12 ms for step 2."""
    arrivals = [(10, 30), (10, 30), (10, 32), (10, 30), (12, 30)]
    result = replay(_all_reduce_steps(arrivals), "t", [parse_change("rank 1: on time")])
    assert [s.predicted_ns / MS for s in result.steps] == pytest.approx([12, 12, 14, 12, 14])


def test_on_time_removes_a_rank_s_occasional_lateness() -> None:
    """Rank 1 is 30 ms late in step 2 only. Its busiest step maps to rank 0's busiest (11 ms):
    on time, step 2 takes 12 ms as the others do (one median excess over the steps would be 0,
    and keep it at 42 ms)."""
    arrivals = [(10, 10), (10, 10), (10, 40), (10, 10), (10, 10)]
    result = replay(_all_reduce_steps(arrivals), "t", [parse_change("rank 1: on time")])
    assert [s.measured_ns / MS for s in result.steps] == pytest.approx([12, 12, 42, 12, 12])
    assert [s.predicted_ns / MS for s in result.steps] == pytest.approx([12] * 5)


def test_on_time_takes_at_least_the_typical_excess() -> None:
    """Rank 1 is 20 ms late in every step, 0.5 ms more in step 3; rank 0 is descheduled for 35 ms
    in step 4. Rank 1's busiest step (3) maps to rank 0's busiest (46 ms), which alone would
    leave it all its lateness (32.5 ms predicted); at least its median excess (31 - 11 ms) comes
    off, as off every other step (in step 4, where rank 1 reached nothing last, off all its host
    time: its last 1 ms too)."""
    arrivals = [(10, 30), (10, 30), (10, 30), (10, 30.5), (45, 30)]
    result = replay(_all_reduce_steps(arrivals), "t", [parse_change("rank 1: on time")])
    assert [s.predicted_ns / MS for s in result.steps] == pytest.approx([12, 12, 12, 12.5, (47 + 46 + 11 / 31) / 2])


def test_a_balanced_pipeline_is_on_time() -> None:
    """Two stages as busy as each other (15 ms each outside their waits): stage 1 sends its
    gradient 9 ms after stage 0 posted the recv, the backward that any 1F1B's first stage waits
    for. On time changes nothing; removing that lateness (the earlier definition) took stage 1's
    backward off and predicted 16 ms instead of 25."""
    g = StepGraph(0, {r: RankStep(r, 0, 25 * MS) for r in (0, 1)}, defaultdict(list))
    _, recv_a = _p2p(g, -1, (0, 9, 10), (1, 1, 10))
    send_b, recv_b = _p2p(g, -2, (1, 19, 20), (0, 10, 20))
    _wait(g, recv_a, 1, 10)
    _wait(g, recv_b, 10, 20)
    _wait(g, send_b, 19, 20)
    for rs in g.ranks.values():
        rs.marks.sort(key=lambda m: (m.t, m.kind != "issue"))
    assert busy_ns(g.ranks[0]) == busy_ns(g.ranks[1]) == 15 * MS
    assert on_time_excess([g], frozenset({1})) == {(1, 0): 0.0}
    assert replay_step(g, _AllCompute(), {}, []) == 25 * MS
    assert replay_step(g, _AllCompute(), {}, [parse_change("rank 1: on time")]) == 25 * MS


def _all_reduces(sizes_mib: Sequence[int]) -> RunGraph:
    """Two gloo ranks, one step: both arrive at each all-reduce together, 1 ms after the previous
    one ended (host work), and it takes 1 ms plus 1 ms per MiB; the step ends 1 ms after the last."""
    g = StepGraph(0, {r: RankStep(r, 0, 0) for r in (0, 1)}, defaultdict(list))
    t = 1.0
    for inst, mib in enumerate(sizes_mib):
        end = t + 1 + mib
        for rank in (0, 1):
            c = Collective(rank, int(t * MS), int(end * MS), (0, -1), True, "all_reduce", inst, bytes=mib * 2**20)
            g.ranks[rank].marks += [Mark("issue", c.ts, c.ts, c), Mark("wait", c.ts, c.end, c, c.end)]
            g.instances[inst].append(c)
        t = end + 1
    for rs in g.ranks.values():
        rs.end = int(t * MS)
    return RunGraph({0: g}, {}, _AllCompute())


def test_a_volume_change_grows_each_transfer_by_its_bytes_not_its_latency() -> None:
    """1 MiB takes 2 ms and 4 MiB 5 ms: 1 ms of latency and 1 ms per MiB, fitted from the run.
    Twice the volume adds 1 and 4 ms (the step: 1 + 3 + 1 + 9 + 1 = 15 ms), where twice the
    transfer time doubles the latency too (1 + 4 + 1 + 10 + 1 = 17 ms)."""
    rg = _all_reduces([1, 4])
    assert volume_costs(rg.graphs.values()) == pytest.approx({"all_reduce": MS / 2**20})
    assert replay(rg, "t", [parse_change("comm_volume*2")]).predicted_ns == pytest.approx(15 * MS)
    assert replay(rg, "t", [parse_change("communication_transfer*2")]).predicted_ns == pytest.approx(17 * MS)
    assert replay(rg, "t", []).unchanged_ns == pytest.approx(10 * MS)


def test_a_volume_change_needs_two_message_sizes() -> None:
    """One size gives no time per byte: the replay says so rather than predict the step unchanged."""
    with pytest.raises(Inconclusive, match="all_reduce recorded with one message size"):
        replay(_all_reduces([4, 4]), "t", [parse_change("comm_volume*2")])
