"""The pipeline analysis reads each rank's tables stored at ingest (``rank_p2p``,
``rank_pipeline_actions``, ``rank_pipeline_work``), and they hold what the events say.

- the transfers and the schedule actions against a plain loop over each rank's raw JSON, on the
  project's pipeline recordings (sample_traces/pp-*), on a generated GPU pipeline whose stages
  sit in a pipeline process group (peers mapped through its ranks), and on shared traces (none
  of them has a transfer or an action: the tables are empty there, and no work is stored);
- the work items against the query that computed them from the store's events before the table
  (kept here as the reference), on the same recordings and the generated GPU pipeline;
- a trace with schedule actions and no transfer still gets its work items;
- a store of schema version 2 (before these tables) is refused until ``stepscope migrate``,
  which gives the same pipeline as a fresh ingest.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

import pytest

from stepscope.analysis.pipeline import PipelineResult, pipeline_analysis, work_items
from stepscope.analysis.pipeline_stages import p2p_transfers, schedule_actions
from stepscope.cli import main
from stepscope.errors import StoreError
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from stepscope.store.rankstats.phase import phase_cte
from tests._store_versions import as_older_version
from tests._intervals import load_trace, to_ns
from tests.conftest import copy_store, load_raw
from tests.test_pipeline import RUNS, SAMPLES, _gpu_rank, pp_store  # noqa: F401 - pp_store: the module fixture

NEW_TABLES = ("rank_p2p", "rank_pipeline_actions", "rank_pipeline_work")

SHARED = [
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/trace_diff/control/control.json.gz",
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
]
"""Shared traces (GPU with collectives, GPU, CPU-only): none records a transfer or an action."""


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEPSCOPE_NO_CACHE", "1")


# ---- the independent side: the raw JSON ----


def _global_peers(doc: dict[str, Any]) -> Callable[[int], int]:
    """Group rank -> global rank: through the one pipeline group holding the rank, if any."""
    info = doc.get("distributedInfo") or {}
    groups = [g for g in info.get("pg_config") or []
              if re.search(r"(^|[^a-z])(pp|pipe|pipeline)([^a-z]|$)", g["pg_desc"], re.I) and info["rank"] in g["ranks"]]
    return (lambda i: groups[0]["ranks"][i]) if len(groups) == 1 else (lambda i: i)


def raw_transfers(paths: Sequence[Path]) -> list[tuple[int, int, int, bool, int | None]]:
    """(rank, ts_ns, dur_ns, send, peer) of every c10d::send / c10d::recv_ in the files."""
    out = []
    for path in paths:
        doc = load_trace(path)
        rank, peer_of = doc["distributedInfo"]["rank"], _global_peers(doc)
        for e in doc["traceEvents"]:
            if e.get("cat") == "cpu_op" and e.get("name") in ("c10d::send", "c10d::recv_") and e.get("ph") == "X":
                inputs = (e.get("args") or {}).get("Concrete Inputs")
                peer = peer_of(int(inputs[2])) if inputs else None
                out.append((rank, to_ns(doc, e["ts"]), round(e["dur"] * 1000), e["name"] == "c10d::send", peer))
    return sorted(out)


def raw_actions(paths: Sequence[Path]) -> list[tuple[int, int, int, int, str, int]]:
    """(rank, ts_ns, end_ns, stage, action, microbatch) of every PP:<s><F|B|I|W><mb> annotation."""
    out = []
    for path in paths:
        doc = load_trace(path)
        for e in doc["traceEvents"]:
            m = re.match(r"^PP:(\d+)([FBIW])(\d+)$", e.get("name", ""))
            if m and e.get("cat") == "user_annotation" and e.get("ph") == "X":
                ts = to_ns(doc, e["ts"])
                out.append((doc["distributedInfo"]["rank"], ts, ts + round(e["dur"] * 1000), int(m[1]), m[2], int(m[3])))
    return sorted(out)


def _rows(table: Any, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in columns) for r in table.to_pylist())


# ---- the reference for the work items: the query over the events, as before the table ----


def items_from_events(store: Any, run: str) -> list[dict[str, Any]]:
    """``work_items`` as computed before ``rank_pipeline_work``: one query over the store's events."""
    return store.sql(f"""
        WITH gpu_ranks AS (SELECT DISTINCT rank FROM events WHERE run = $run AND kind = 'kernel'),
        items AS MATERIALIZED (
          SELECT e.rank, e.source, e.pid, e.tid, e.ts_ns AS issue_ns, e.ts_ns AS start_ns, e.ts_ns + e.dur_ns AS end_ns
          FROM events e
          WHERE e.run = $run AND e.kind = 'cpu_op' AND e.category IS DISTINCT FROM 'communication'
            AND e.name NOT LIKE 'ProfilerStep#%' AND e.dur_ns IS NOT NULL
            AND e.rank NOT IN (SELECT rank FROM gpu_ranks)
          UNION ALL
          SELECT e.rank, l.source, l.pid, l.tid, l.ts_ns, e.ts_ns, e.ts_ns + e.dur_ns
          FROM events e JOIN events l
            ON l.run = $run AND l.rank = e.rank AND l.source = e.source AND l.correlation = e.correlation
           AND l.kind IN ('cuda_runtime', 'cuda_driver')
          WHERE e.run = $run AND e.kind = 'kernel' AND e.category = 'compute' AND e.dur_ns > 0
        ),
        points AS (
          SELECT row_number() OVER (ORDER BY rank, issue_ns, start_ns, end_ns) AS point_id, rank, source, pid, tid,
                 issue_ns AS ts_ns, start_ns, end_ns
          FROM items
        ),
        {phase_cte("points", "ph")}
        SELECT p.rank, p.ts_ns AS issue_ns, p.start_ns, p.end_ns, ph.phase
        FROM points p JOIN ph USING (point_id)
        ORDER BY p.rank, p.ts_ns, p.start_ns, p.end_ns
    """, {"run": run}).to_pylist()


def _assert_tables_hold_the_trace(store: Any, run: str, paths: Sequence[Path]) -> None:
    transfers = p2p_transfers(store, run)
    assert _rows(transfers, ("rank", "ts_ns", "dur_ns", "send", "peer")) == raw_transfers(paths)
    actions = schedule_actions(store, run)
    assert _rows(actions, ("rank", "ts_ns", "end_ns", "stage", "action", "microbatch")) == raw_actions(paths)
    items = work_items(store, run).to_pylist()
    assert items and items == items_from_events(store, run)


@pytest.mark.parametrize("folder", list(RUNS))
def test_pipeline_tables_hold_what_the_events_say(pp_store: Any, folder: str) -> None:
    paths = sorted((SAMPLES / folder).glob("rank*.pt.trace.json.gz"))
    _assert_tables_hold_the_trace(pp_store, folder, paths)


def _pp_group_pipeline(make_trace: Callable[..., Path]) -> list[Path]:
    """The 2-stage GPU GPipe of test_pipeline on global ranks 2 and 3 of 4, whose transfers name
    their peer in the pipeline group ``mesh_pp`` (ranks 2, 3): 0 and 1, not the global ranks."""
    rank0 = _gpu_rank(0, [("F", 10), ("S", 40), ("F", 50), ("S", 80), ("R", 200), ("B", 300), ("R", 400), ("B", 500)], 20)
    rank1 = _gpu_rank(1, [("R", 45), ("F", 100), ("R", 130), ("F", 140), ("B", 170), ("S", 260), ("B", 270),
                          ("S", 350)], 50)
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
              {"pg_name": "1", "pg_desc": "mesh_pp", "ranks": [2, 3]}]
    return [make_trace(f"rank{2 + i}.json", events, distributedInfo={"rank": 2 + i, "world_size": 4, "pg_config": groups})
            for i, events in enumerate((rank0, rank1))]


def test_gpu_pipeline_in_a_pipeline_group(make_trace: Callable[..., Path], tmp_path: Path) -> None:
    paths = _pp_group_pipeline(make_trace)
    assert ingest_paths(paths, tmp_path / "s", "gpu").ok
    store = open_store(tmp_path / "s")
    _assert_tables_hold_the_trace(store, "gpu", paths)
    assert {r["peer"] for r in p2p_transfers(store, "gpu").to_pylist()} == {2, 3}
    assert store.sql("SELECT DISTINCT on_gpu FROM rank_pipeline_work").to_pylist() == [{"on_gpu": True}]
    result = pipeline_analysis(store, "gpu")
    assert isinstance(result, PipelineResult) and [p.ranks for p in result.pipelines] == [(2, 3)]
    assert [(s["kind"], s["start_ns"] // 1000) for s in result.stages[0].spans] == [
        ("forward", 15), ("forward", 55), ("backward", 305), ("backward", 505)]


def test_actions_without_transfers_still_store_the_work(make_trace: Callable[..., Path], tmp_path: Path) -> None:
    """A rank whose schedule annotates its actions is a stage even before its transfers are seen:
    its work items are stored; a trace with neither stores none."""
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100}
    mm = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 20, "dur": 10}
    action = {"ph": "X", "cat": "user_annotation", "name": "PP:0F0", "pid": 1, "tid": 1, "ts": 10, "dur": 50}
    with_action = make_trace("rank0.json", [step, action, mm], distributedInfo={"rank": 0, "world_size": 2})
    without = make_trace("rank1.json", [step, mm], distributedInfo={"rank": 1, "world_size": 2})
    assert ingest_paths([with_action, without], tmp_path / "s", "r").ok
    store = open_store(tmp_path / "s")
    assert store.sql("SELECT rank, start_ns - (SELECT min(ts_ns) FROM events WHERE rank = 0) AS at, phase "
                     "FROM rank_pipeline_work").to_pylist() == [{"rank": 0, "at": 20_000, "phase": "other"}]
    assert _rows(schedule_actions(store, "r"), ("rank", "stage", "action", "microbatch")) == [(0, 0, "F", 0)]
    assert p2p_transfers(store, "r").num_rows == 0


@pytest.mark.shared
@pytest.mark.parametrize("relative", SHARED, ids=[t.split("/")[-2] for t in SHARED])
def test_shared_traces_have_no_pipeline_rows(ingested: Callable[[str], Path], shared_traces: Path, relative: str) -> None:
    doc = load_raw(shared_traces / relative)
    names = {e.get("name") for e in doc["traceEvents"]}
    assert not names & {"c10d::send", "c10d::recv_"} and not any(re.match(r"^PP:\d+[FBIW]\d+$", n or "") for n in names)
    store = open_store(ingested(relative))
    assert [store.sql(f"SELECT count(*) AS n FROM {t}").to_pylist()[0]["n"] for t in NEW_TABLES] == [0, 0, 0]
    assert store.sql("SELECT count(*) AS n FROM rank_kernels").to_pylist()[0]["n"] > 0 or "cpu_only" in relative


# ---- a store written before these tables ----


def _answers(root: Path) -> dict[str, Any]:
    result = pipeline_analysis(open_store(root), "pp-1f1b-3stages-slow")
    assert isinstance(result, PipelineResult)
    return {"stages": result.stage_table().to_pylist(), "spans": result.span_table().to_pylist(),
            "schedule": result.schedule}


def test_a_version_2_store_is_refused_until_migrated(sample_run: Callable[[str], Path], tmp_path: Path,
                                                     capsys: Any) -> None:
    """The pipeline run the answers are read from, alone (the session's store of it, copied):
    migrating every sample run would cost seven times as much for the same check."""
    root = copy_store(sample_run("pp-1f1b-3stages-slow"), tmp_path / "store")
    before = _answers(root)
    as_older_version(root, 2, NEW_TABLES)
    with pytest.raises(StoreError, match=r"schema version 2, older .*stepscope migrate --store"):
        open_store(root)
    assert main(["migrate", "--store", str(root)]) == 0
    assert "traces migrated" in capsys.readouterr().out
    assert _answers(root) == before
    assert before["schedule"] == "1f1b" and len(before["spans"]) == 3 * 8
