"""The step's graph across ranks, its critical path and its replay (issue 21), on the project's
3-rank gloo recordings (rank 2 sleeps 30 ms before its all-reduce in gloo-3ranks-late) and on
shared traces with steps. The edges are checked against a plain-Python pass over the raw JSON."""

from __future__ import annotations

import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.critical_path import step_paths
from stepscope.analysis.replay import parse_change, what_if
from stepscope.cli import main
from stepscope.errors import StoreError, UsageError
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests._store_versions import as_older_version
from tests.conftest import REPO, built_once, load_raw

SAMPLES = REPO / "sample_traces"
MULTI_RANK = ("gloo-3ranks-late", "gloo-3ranks-even", "pp-1f1b-3stages-slow", "ddp-gloo-2ranks", "pp-gpipe-3stages",
              "pp-1f1b-4stages")
SHARED_WITH_STEPS = ("hta/trace_diff/control/control.json.gz", "hta/nccl_parser_config/nccl_data.json.gz")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    def build(folder: Path) -> None:
        for name in MULTI_RANK:
            assert ingest_paths(sorted((SAMPLES / name).glob("rank*.pt.trace.json.gz")), folder, name).ok

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
    windows = {}
    for rank in range(3):
        doc = load_raw(SAMPLES / "gloo-3ranks-late" / f"rank{rank}.pt.trace.json.gz", exact=True)
        for e in doc["traceEvents"]:
            if e.get("name", "").startswith("ProfilerStep#"):
                windows[(rank, int(e["name"].split("#")[1]))] = _ns(e["dur"])
    for p in paths:
        first, last = p.pieces[0][0], p.pieces[-1][0]
        assert first.rank == 2 and first.what == "host"  # the sleep: rank 2's host time before its issue
        # contiguous pieces: the length is the last end minus the first start
        assert p.length_ns == last.t1 - first.t0 == sum(x.t1 - x.t0 for x, _ in p.pieces)
        assert sum(p.by_part.values()) == p.length_ns == sum(p.by_rank.values())
        assert p.by_rank[2] > 25_000_000 and p.by_part["other"] > 25_000_000
        if last.rank == 2:  # starts and ends on rank 2: its own measured window
            assert p.length_ns == windows[(2, p.step)]
    mean_windows = sum(sum(windows[(r, p.step)] for r in range(3)) / 3 for p in paths)
    assert abs(sum(p.length_ns for p in paths) / mean_windows - 1) < 0.02


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


@pytest.mark.parametrize("text", ["bogus*2", "compute", "on time", "rank x: on time"])
def test_bad_changes_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError):
        parse_change(text)


def test_changes_parse() -> None:
    c = parse_change("rank 3,5: comm_transfer*0.5")
    assert c.ranks == frozenset({3, 5}) and c.factor == 0.5 and "communication_transfer" in c.parts
    assert parse_change("rank 7: on time").on_time


def test_migrate_from_version_3_writes_the_edges(store: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    query = "SELECT * FROM rank_edges WHERE run = 'gloo-3ranks-late' ORDER BY rank, host_ts_ns, kind, dep_ts_ns"
    before = store.sql(query).to_pylist()
    copy = tmp_path / "store"
    shutil.copytree(store.root, copy)
    shutil.rmtree(copy / ".compact", ignore_errors=True)
    shutil.rmtree(copy / "cache", ignore_errors=True)
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
    # the path starts where rank 2's lane starts: the same aligned clock
    assert marks[0]["t0_ns"] == min(r["t0_ns"] for r in rank2)


def test_overview_marks_the_critical_path(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_dashboard_apptest import assert_clean, open_page

    at = open_page(store.root, "overview", monkeypatch, run="gloo-3ranks-late")
    assert_clean(at)
    specs = [c.proto.spec for c in at.get("vega_lite_chart")]
    timeline = next(s for s in specs if "critical path on rank" in s)
    assert '"height": 3' in timeline.replace('"height":3', '"height": 3')
    assert any("critical path" in c.value for c in at.caption)
