"""The step windows, the breakdown of arbitrary windows and the step timeline, read from the
tables written at ingest (``rank_step_windows``, ``rank_segments``), equal what the analyses
computed from the events before: on every shared trace with steps, on the late-rank samples
(matched collectives: the waits split off at query time) and on generated edge cases.

The references are the old queries over the events, kept here (the step breakdowns' own
generator, ``breakdown._parts_query``, for the windows; the old timeline's sweep below)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest

from stepscope.analysis import Absent
from stepscope.analysis._sql import rank_filter, sweep_ctes
from stepscope.analysis.breakdown import _parts_query, parts_over, step_windows
from stepscope.analysis.lateness import late_arrivals
from stepscope.analysis.matching import collective_ctes, ranks_with_collectives
from stepscope.analysis.timeline import _SPLIT_BY_WAITS, lanes, step_timeline
from stepscope.cli import main
from stepscope.errors import StoreError
from stepscope.store import open_store, rankstats
from stepscope.store.ingest import ingest_paths
from stepscope.store.rankstats.breakdown import exclusive, gpu_cte, iv_ctes, window_ctes
from stepscope.store.rankstats.parts import GPU, HOST, Breakdown
from tests._store_versions import as_older_version
from tests.test_breakdown import GPU_STEP_TRACES
from tests.test_rankstats import HOST_ONLY_TRACES

LATE_SAMPLES = ("gloo-3ranks-late", "gloo-3ranks-even")
"""The late-rank samples: three gloo ranks, one sleeping (late) or none (even)."""
NEW_TABLES = ("rank_step_windows", "rank_segments")


# ---- the references: the old queries over the events --------------------------------------------

def _windows_from_events(store: Any, run: str) -> pa.Table:
    return store.sql(f"""
    WITH {gpu_cte("TRUE")}, {window_ctes("TRUE")}
    SELECT $run AS run, rank, step, cpu_start AS cpu_start_ns, cpu_end AS cpu_end_ns,
           gpu_end AS gpu_end_ns, w0 AS start_ns, w1 AS end_ns, w1 - w0 AS dur_ns
    FROM win ORDER BY rank, step""", {"run": run})


def _parts_from_events(store: Any, run: str, breakdown: Breakdown, windows: list[tuple[int, int, int, int]]) -> pa.Table:
    rf, extra = rank_filter(sorted({w[0] for w in windows}))
    values = ", ".join(f"({r}, {k}, {a}, {b})" for r, k, a, b in windows)
    win = f"win AS MATERIALIZED (SELECT * FROM (VALUES {values}) AS t(rank, step, w0, w1))"
    query = _parts_query(breakdown, rf, win, "w.rank, w.step AS key, w.w0, w.w1",
                         matched=ranks_with_collectives(store, run) >= 2)
    return store.sql(query, {"run": run, **extra})


def _timeline_from_events(store: Any, run: str, step: int) -> pa.Table | None:
    """The old step timeline: one sweep over the events with the waits as one more class (its
    elementary segments then merged into lanes as the new one's pieces are: ``lanes``)."""
    has_gpu = store.sql("SELECT count(*) AS n FROM events WHERE run = $run AND kind = 'kernel'",
                        {"run": run}).to_pylist()[0]["n"] > 0
    breakdown = GPU if has_gpu else HOST
    if breakdown is GPU:
        win = f"{window_ctes('TRUE')}, _win_step AS (SELECT rank, step, w0, w1 FROM win WHERE step = $step)"
    else:
        win = "_win_step AS (SELECT rank, step, start_ns AS w0, end_ns AS w1 FROM steps WHERE run = $run AND step = $step)"
    wait_class = len(breakdown.classes)
    split = _SPLIT_BY_WAITS[breakdown]
    whens = []
    for part in breakdown.parts:
        if part is split:
            whens.append(f"WHEN {exclusive(breakdown, part)} AND n{wait_class} > 0 THEN '{part.sub_parts[0].name}'")
            whens.append(f"WHEN {exclusive(breakdown, part)} THEN '{part.sub_parts[1].name}'")
        else:
            whens.append(f"WHEN {exclusive(breakdown, part)} THEN '{part.name}'")
    coll = collective_ctes() if ranks_with_collectives(store, run) >= 2 else (
        "coll AS (SELECT NULL::BIGINT AS rank, NULL::BIGINT AS ts_ns, NULL::BIGINT AS wait_ns, "
        "NULL::BOOLEAN AS host_side, NULL::BIGINT AS clock_correction_ns WHERE FALSE)")
    table = store.sql(f"""
    WITH {iv_ctes(breakdown, "TRUE")}, {win}, {coll},
    _iv_all AS (
        SELECT rank, t0, t1, cls FROM iv
        WHERE t1 > (SELECT min(w0) FROM _win_step) AND t0 < (SELECT max(w1) FROM _win_step)
        UNION ALL
        SELECT rank, ts_ns, ts_ns + wait_ns, {wait_class} FROM coll
        WHERE {"" if breakdown is HOST else "NOT "}host_side AND wait_ns > 0
    ),
    {sweep_ctes(wait_class + 1, iv="_iv_all", win="_win_step")},
    _parts AS (SELECT rank, s0, s1, CASE {" ".join(whens)} END AS part FROM seg),
    {lanes(breakdown)}""", {"run": run, "step": step})
    return table if table.num_rows else None


# ---- what is compared --------------------------------------------------------------------------

def _probe_windows(windows: list[dict[str, Any]], seed: int = 0) -> list[list[tuple[int, int, int, int]]]:
    """Window sets (disjoint per rank): the step windows themselves; the lateness shape (a step's
    start to a point inside it or past its end); random windows over and past the trace, empty ones too."""
    rng = random.Random(seed)
    steps = sorted((w["rank"], w["step"], w["start_ns"], w["end_ns"]) for w in windows)
    following = {(r, s): next((n[2] for n in steps if n[0] == r and n[2] >= b and n[1] != s), None)
                 for r, s, a, b in steps}
    lateness = []
    for r, s, a, b in steps:
        end = a + rng.randint(-1000, int(1.3 * (b - a)) + 1)  # past the step's end too, not into the next one
        lateness.append((r, s, a, max(a, min(end, following[(r, s)] or end))))
    wild = []
    for rank in sorted({w["rank"] for w in windows}):
        mine = [w for w in windows if w["rank"] == rank]
        lo, hi = min(w["start_ns"] for w in mine), max(w["end_ns"] for w in mine)
        cuts = sorted(rng.randint(lo - (hi - lo) // 4, hi + (hi - lo) // 4) for _ in range(10))
        wild += [(rank, k, cuts[k], cuts[k + 1]) for k in range(0, len(cuts) - 1, 2)]
        wild.append((rank, 99, cuts[-1] + 1, cuts[-1] + 1))
    return [s for s in (steps, lateness, wild) if s]


def _assert_same(store: Any, run: str) -> int:
    """Every answer of this module on ``run``, new against old; the number of compared rows."""
    windows = step_windows(store, run)
    old_windows = _windows_from_events(store, run)
    assert windows.schema == old_windows.schema and windows.to_pylist() == old_windows.to_pylist()
    rows = windows.num_rows
    for breakdown in (GPU, HOST):
        for probe in _probe_windows(windows.to_pylist()):
            new, old = parts_over(store, run, breakdown, probe), _parts_from_events(store, run, breakdown, probe)
            assert new.schema == old.schema, breakdown.name
            assert new.to_pylist() == old.to_pylist(), breakdown.name
            rows += new.num_rows
    for step in sorted({w["step"] for w in windows.to_pylist()})[:3]:
        new, old = step_timeline(store, run, step), _timeline_from_events(store, run, step)
        if old is None:
            assert isinstance(new, Absent)
            continue
        # the old query's rank was int64 when nothing was matched (the empty waits' BIGINT rank
        # joined it), int32 otherwise; it is int32 now, as in every other frame
        assert not isinstance(new, Absent) and new.column_names == old.column_names, step
        assert new.schema.field("rank").type == pa.int32()
        assert new.to_pylist() == old.to_pylist(), step
        rows += new.num_rows
    return rows


@pytest.mark.shared
@pytest.mark.parametrize("relative", GPU_STEP_TRACES + HOST_ONLY_TRACES,
                         ids=[t.split("/")[-1][:40] for t in GPU_STEP_TRACES + HOST_ONLY_TRACES])
def test_stored_windows_and_time_lines_equal_the_analysis_from_events(ingested, relative: str) -> None:
    assert _assert_same(open_store(ingested(relative)), "t") > 0


@pytest.fixture(scope="module")
def matched(tmp_path_factory: pytest.TempPathFactory, sample_run: Callable[[str], Path]) -> Any:
    """Runs whose collectives are matched across ranks: the late-rank samples (gloo, host side;
    copied from the session's stores of them), and the two ranks of HTA's trace_filter (NCCL,
    GPU side) when ../shared is there."""
    from tests.conftest import SHARED_TRACES, copy_run

    root = tmp_path_factory.mktemp("matched") / "store"
    for name in LATE_SAMPLES:
        copy_run(sample_run(name), root, name)
    pair = [SHARED_TRACES / f"hta/trace_filter/sampled_rank-{r}.json.gz" for r in (0, 1)]
    if all(p.is_file() for p in pair):
        assert ingest_paths(pair, root, "pair").ok
    return open_store(root)


def test_the_late_rank_samples_split_the_same_with_their_waits(matched: Any) -> None:
    for run in LATE_SAMPLES:
        assert _assert_same(matched, run) > 0
    late = late_arrivals(matched, LATE_SAMPLES[0])
    assert not isinstance(late, Absent) and late.num_rows > 0  # parts_over's windows were really read


@pytest.mark.shared
def test_a_matched_gpu_pair_splits_the_same_with_its_waits(matched: Any) -> None:
    if "pair" not in {r["run"] for r in matched.sql("SELECT DISTINCT run FROM sources").to_pylist()}:
        pytest.skip("../shared has no trace_filter pair")
    assert _assert_same(matched, "pair") > 0
    waits = matched.sql("SELECT count(*) AS n FROM rank_collectives WHERE run = 'pair'").to_pylist()[0]["n"]
    assert waits > 0


# ---- generated edges ---------------------------------------------------------------------------

def _step(n: int, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def _kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": stream, "device": 0}}


def _launch(ts: float, corr: int) -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts, "dur": 2,
            "args": {"correlation": corr}}


def test_edges_a_rank_without_gpu_work_windows_past_the_trace_and_idle_causes(make_trace, tmp_path: Path) -> None:
    """Rank 0 has kernels (a short gap: kernel wait; a gap after a late launch: host wait; one
    queued long: other; a kernel running past its step's CPU end); rank 1 only CPU ops. Windows past both ends of the
    trace and empty ones are split as over the events."""
    gpu_rank = [
        _step(0, 0, 100), _step(1, 150, 100),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 5, "dur": 40},
        _launch(10, 1), _kernel("gemm", 20, 30, 1),
        _launch(12, 2), _kernel("gemm", 50.02, 10, 2),           # 20 ns gap: kernel wait
        _launch(120, 3), _kernel("ncclKernel_AllReduce", 121, 60, 3),  # launched after the gap began: host wait
        _launch(160, 4), _kernel("gemm", 220, 90, 4),           # queued 39 us: other
    ]
    cpu_rank = [_step(0, 0, 100), _step(1, 150, 100),
                {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 160, "dur": 40}]
    paths = [make_trace("rank0.json", gpu_rank, distributedInfo={"rank": 0, "world_size": 2}),
             make_trace("rank1.json", cpu_rank, distributedInfo={"rank": 1, "world_size": 2})]
    assert ingest_paths(paths, tmp_path / "store", "e").ok
    store = open_store(tmp_path / "store")
    assert _assert_same(store, "e") > 0
    causes = parts_over(store, "e", GPU, [(0, 0, -5000, 400_000), (1, 0, 0, 400_000)]).to_pylist()
    assert (causes[0]["idle_kernel_wait_ns"], causes[0]["idle_other_ns"]) == (20, 39_000)
    assert causes[0]["idle_host_wait_ns"] == 25_000 + 60_980 + 90_000  # before, the late launch, after
    assert causes[1]["idle_ns"] == 400_000 and causes[1]["idle_host_wait_ns"] == 0  # no GPU work: no cause
    lanes = step_timeline(store, "e", 1)
    assert not isinstance(lanes, Absent) and {r["rank"] for r in lanes.to_pylist()} == {0, 1}


def test_a_run_with_copies_and_no_kernel_is_a_gpu_run_now(make_trace, tmp_path: Path) -> None:
    """The one change: the timeline picks the GPU breakdown when the run has GPU work of positive
    duration (``rank_gpu_totals``), not only when it has a kernel event; a run of memcpys alone
    used to fall back to the host lanes although its step breakdown is the GPU's."""
    events = [_step(0, 0, 100), {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)",
                                 "pid": 0, "tid": 7, "ts": 10, "dur": 20,
                                 "args": {"correlation": 1, "stream": 7, "device": 0, "bytes": 64}}]
    assert ingest_paths([make_trace("rank0.json", events)], tmp_path / "store", "c").ok
    lanes = step_timeline(open_store(tmp_path / "store"), "c", 0)
    assert not isinstance(lanes, Absent)
    assert {r["breakdown"] for r in lanes.to_pylist()} == {"gpu"}
    assert "memcpy_h2d_exposed" in {r["part"] for r in lanes.to_pylist()}


# ---- a version-2 store gets the tables from stepscope migrate ----------------------------------

def test_a_version_2_store_is_refused_until_migrated_then_answers_the_same(tmp_path: Path, capsys,
                                                                           sample_run: Callable[[str], Path]) -> None:
    from tests.conftest import copy_store

    late = LATE_SAMPLES[0]
    store = copy_store(sample_run(late), tmp_path / "store")
    fresh = open_store(store)
    before = (step_windows(fresh, late).to_pylist(), step_timeline(fresh, late, 3).to_pylist(),
              parts_over(fresh, late, HOST, [(2, 0, 0, 2**62)]).to_pylist())
    shutil.rmtree(store / "cache", ignore_errors=True)
    as_older_version(store, 2, NEW_TABLES)
    with pytest.raises(StoreError, match=r"schema version 2, older .*stepscope migrate --store"):
        open_store(store)
    assert main(["migrate", "--store", str(store)]) == 0
    assert "3 traces migrated" in capsys.readouterr().out
    migrated = open_store(store)
    assert all((store / name).is_dir() for name in NEW_TABLES)
    after = (step_windows(migrated, late).to_pylist(), step_timeline(migrated, late, 3).to_pylist(),
             parts_over(migrated, late, HOST, [(2, 0, 0, 2**62)]).to_pylist())
    assert after == before and before[0] and before[1]


def test_the_new_tables_are_in_the_registry() -> None:
    assert [t.name for t in rankstats.TABLES][-len(NEW_TABLES):] == list(NEW_TABLES)
