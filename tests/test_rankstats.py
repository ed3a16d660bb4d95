"""Each rank's answers stored at ingest equal what the analysis computed from the events before.

The step breakdowns (``rank_step_gpu``, ``rank_step_host``, ``rank_comm_spans``), the
collectives (``rank_collectives``, ``rank_hiding_spans``), the kernels and CPU ops by name (``rank_kernels``,
``rank_cpu_ops``), the memory peaks (``rank_memory_peaks``) and the whole-trace GPU totals
(``rank_gpu_totals``): on every shared trace with steps, and on two ranks of one job
(collectives matched, waits split off), what the analyses now read from the tables equals what
they computed from the events before.

``rank_copies`` is written by the converter from the trace's own parts; here the same figures
are computed the way the analysis did before this table existed (over the store's ``events``
view, every rank at once), on every shared trace with steps and copies; and independently in
plain Python (interval union of the compute kernels) on one. A store of the older schema
version is refused with a line that names ``stepscope migrate``, which brings it up to date.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from stepscope.analysis.absent import Absent
from stepscope.analysis.breakdown import _parts_query, host_breakdown, rank_totals, step_breakdown
from stepscope.analysis.kernels import top_cpu_ops, top_kernels
from stepscope.analysis.comm import _kernels_table
from stepscope.analysis.memory import step_peaks
from stepscope.analysis.matching import collective_ctes, collective_rows, ranks_with_collectives
from stepscope.cli import main
from stepscope.errors import StoreError
from stepscope.store.rankstats.copies import copies_ctes
from stepscope.store import open_store, rankstats
from stepscope.store.rankstats.breakdown import active, gpu_cte, step_window_ctes, window_ctes
from stepscope.store.rankstats.collectives import HIDING_SQL, collective_point_ctes
from stepscope.store.rankstats.phase import gpu_phase_ctes
from stepscope.store.rankstats.sweep import hidden_ctes, sweep_ctes
from stepscope.store.rankstats.parts import COMM_EXPOSED, COMPUTE, GPU, HOST, Breakdown
from tests._store_versions import as_older_version
from tests._intervals import clip, length, load_trace, to_ns, union

from tests.test_breakdown import GPU_STEP_TRACES  # noqa: E402 - every shared trace with steps and GPU work

COPY_TRACES = [
    "hta/trace_diff/control/control.json.gz",
    "hta/trace_diff/test/test.json.gz",
    "hta/negative_queue_length_values_check/rank0.json.gz",
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/trace_filter/sampled_rank-0.json.gz",
    "kineto_tb_plugin/old_2021-02/resnet50_profiler_api_num_workers_0.worker0.pt.trace.json.gz",
    "tracelens/mi300/resnet_act_checkpoint.json.gz",
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
]
"""Shared traces with ProfilerSteps and memcpy events."""

COLUMNS = "rank, source, step, ts_ns, dur_ns, stream, name, bytes, direction, host_memory, hidden_ns, exposed_ns"


def _from_events(store) -> list[dict]:
    """The copies as the analysis computed them before ``rank_copies``: one query over the
    store's events, all ranks at once."""
    return store.sql(f"WITH {copies_ctes()} SELECT {COLUMNS} FROM copies ORDER BY rank, ts_ns, name, stream",
                     {"run": "t"}).to_pylist()


@pytest.mark.shared
@pytest.mark.parametrize("relative", COPY_TRACES, ids=[t.split("/")[-2] for t in COPY_TRACES])
def test_stored_copies_equal_the_analysis_from_events(ingested, relative: str) -> None:
    store = open_store(ingested(relative))
    stored = store.sql(f"SELECT {COLUMNS} FROM rank_copies WHERE run = 't' ORDER BY rank, ts_ns, name, stream")
    assert stored.num_rows > 0
    assert stored.to_pylist() == _from_events(store)


@pytest.mark.shared
def test_stored_hidden_time_against_the_raw_json(ingested, shared_traces: Path) -> None:
    relative = "hta/trace_diff/control/control.json.gz"
    doc = load_trace(shared_traces / relative)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
    compute = union([(to_ns(doc, k["ts"]), to_ns(doc, k["ts"]) + round(k["dur"] * 1000)) for k in kernels
                     if not k["name"].startswith("nccl") and k["dur"] > 0])
    copies = [e for e in doc["traceEvents"] if e.get("cat") == "gpu_memcpy"]
    expected = sorted(length(clip(compute, to_ns(doc, c["ts"]), to_ns(doc, c["ts"]) + round(c["dur"] * 1000)))
                      for c in copies)
    rows = open_store(ingested(relative)).sql("SELECT hidden_ns FROM rank_copies").to_pylist()
    assert sorted(r["hidden_ns"] for r in rows) == expected


@pytest.mark.shared
def test_an_older_store_is_refused_until_migrated(ingested, tmp_path: Path, capsys) -> None:
    import shutil

    store = tmp_path / "store"
    shutil.copytree(ingested("hta/trace_diff/control/control.json.gz"), store)
    before = open_store(store).sql(f"SELECT {COLUMNS} FROM rank_copies ORDER BY ts_ns, name").to_pylist()
    breakdown_before = _stored(open_store(store), GPU)
    pid = open_store(store).sql("SELECT process_id FROM sources").to_pylist()
    as_older_version(store, 1, [t.name for t in rankstats.TABLES], columns=["process_id"])
    with pytest.raises(StoreError, match=r"schema version 1, older .*stepscope migrate --store"):
        open_store(store)
    assert main(["summary", "--store", str(store)]) == 3
    assert "stepscope migrate" in capsys.readouterr().err
    assert main(["migrate", "--store", str(store)]) == 0
    assert "1 traces migrated" in capsys.readouterr().out
    migrated = open_store(store)
    assert migrated.sql(f"SELECT {COLUMNS} FROM rank_copies ORDER BY ts_ns, name").to_pylist() == before
    assert migrated.sql("SELECT process_id FROM sources").to_pylist() == pid
    assert _stored(migrated, GPU) == breakdown_before and breakdown_before
    assert main(["migrate", "--store", str(store)]) == 0
    assert "0 traces migrated, 1 already" in capsys.readouterr().out


# ---- the step breakdowns: stored at ingest == computed from the events as before ----------------

HOST_ONLY_TRACES = [
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "hta/rank_non_gpu/rank_non_gpu.json.gz",
]
"""Shared traces with ProfilerSteps and no GPU work (the host breakdown alone)."""


def _breakdown_from_events(store, breakdown: Breakdown, run: str = "t") -> list[dict]:
    """A step breakdown as the analysis computed it before ``rank_step_*``: the sweep over the
    store's events, all ranks at once, the waits matched over them."""
    if breakdown is GPU:
        win, select = window_ctes("TRUE"), ("$run AS run, w.rank, w.step, w.w0 AS start_ns, w.w1 AS end_ns, "
                                             "w.w1 - w.w0 AS dur_ns, w.cpu_start AS cpu_start_ns, "
                                             "w.cpu_end - w.cpu_start AS cpu_dur_ns")
        where = "w.rank IN (SELECT DISTINCT rank FROM gpu)"
    else:
        win = step_window_ctes(HOST, "TRUE")
        select, where = "$run AS run, w.rank, w.step, w.w0 AS start_ns, w.w1 AS end_ns, w.w1 - w.w0 AS dur_ns", "TRUE"
    matched = ranks_with_collectives(store, run) >= 2
    return store.sql(_parts_query(breakdown, "TRUE", win, select, where, matched), {"run": run}).to_pylist()


def _stored(store, breakdown: Breakdown) -> list[dict]:
    table = (step_breakdown if breakdown is GPU else host_breakdown)(store, "t")
    return [] if isinstance(table, Absent) else table.to_pylist()


@pytest.mark.shared
@pytest.mark.parametrize("relative", GPU_STEP_TRACES + HOST_ONLY_TRACES,
                         ids=[t.split("/")[-1][:40] for t in GPU_STEP_TRACES + HOST_ONLY_TRACES])
def test_stored_step_breakdowns_equal_the_analysis_from_events(ingested, relative: str) -> None:
    store = open_store(ingested(relative))
    for breakdown in (GPU, HOST):
        stored = _stored(store, breakdown)
        assert stored == _breakdown_from_events(store, breakdown), breakdown.name
        assert stored or breakdown is GPU and relative in HOST_ONLY_TRACES
    assert store.sql("SELECT count(*) AS n FROM rank_step_host").to_pylist()[0]["n"] == \
        store.sql("SELECT count(*) AS n FROM steps").to_pylist()[0]["n"]
    assert _collectives(store) == _collectives_from_events(store)
    assert _by_name(top_kernels(store, "t", 10_000)) == _by_name_from_events(store, "kind IN ('kernel', 'memcpy', 'memset') AND dur_ns > 0")
    assert _by_name(top_cpu_ops(store, "t", 10_000)) == _by_name_from_events(
        store, "kind = 'cpu_op' AND dur_ns IS NOT NULL AND name NOT LIKE 'ProfilerStep#%'")
    assert _peaks(store) == _peaks_from_memory(store)
    assert _comm(store) == _comm_from_events(store)
    for hta_scope in (False, True):
        assert rank_totals(store, "t", hta_scope=hta_scope).to_pylist() == _totals_from_events(store, hta_scope)


def _totals_from_events(store, hta_scope: bool) -> list[dict]:
    """HTA's whole-trace totals per rank as the analysis computed them before ``rank_gpu_totals``:
    the sweep over every rank's GPU events at once."""
    compute, comm = active(GPU, [COMPUTE]), active(GPU, [COMM_EXPOSED])
    query = f"""
    WITH {gpu_cte("TRUE", hta_scope=hta_scope)},
    win AS (SELECT rank, 0 AS step, min(t0) AS w0, max(t1) AS w1 FROM gpu GROUP BY rank),
    iv AS (SELECT rank, t0, t1, cls FROM gpu),
    {sweep_ctes(len(GPU.classes))},
    _tot AS (SELECT rank, coalesce(sum(len) FILTER (busy), 0)::BIGINT AS gpu_busy_ns,
                    coalesce(sum(len) FILTER ({compute}), 0)::BIGINT AS compute_ns,
                    coalesce(sum(len) FILTER ({comm}), 0)::BIGINT AS comm_ns,
                    coalesce(sum(len) FILTER ({compute} AND {comm}), 0)::BIGINT AS comm_comp_overlap_ns
             FROM seg GROUP BY rank)
    SELECT $run AS run, r.rank, w.w1 - w.w0 AS gpu_span_ns, t.gpu_busy_ns, w.w1 - w.w0 - t.gpu_busy_ns AS gpu_idle_ns,
           t.compute_ns, t.gpu_busy_ns - t.compute_ns AS non_compute_ns, t.comm_ns, t.comm_comp_overlap_ns,
           CASE WHEN t.comm_ns > 0 THEN 100.0 * t.comm_comp_overlap_ns / t.comm_ns END AS comm_comp_overlap_pct
    FROM (SELECT DISTINCT rank FROM sources WHERE run = $run) r LEFT JOIN win w USING (rank)
    LEFT JOIN _tot t USING (rank) ORDER BY r.rank"""
    rows = store.sql(query, {"run": "t"}).to_pylist()
    stored = rank_totals(store, "t", hta_scope=hta_scope).to_pylist()
    return [{**row, **{k: s[k] for k in ("absent_reason", "overlap_absent_reason")}} for row, s in zip(rows, stored)]


def _comm(store) -> list[tuple]:
    rows = _kernels_table(store, "t").to_pylist()
    return sorted((r["point_id"], r["phase"], r["hidden_ns"], r["exposed_wait_ns"]) for r in rows)


def _comm_from_events(store) -> list[tuple]:
    """Each collective's phase and hidden time (and its wait's exposed part) as the analysis
    computed them before ``rank_hiding_spans``: the sweep of the hiding work and the phase of
    the launch, over the events."""
    query = f"""
    WITH {collective_ctes(collective_point_ctes())},
    comm AS (SELECT * FROM coll),
    comm_iv AS (SELECT 2 * point_id AS point_id, run, rank, ts_ns AS t0, end_ns AS t1 FROM comm
                UNION ALL SELECT 2 * point_id + 1, run, rank, ts_ns, ts_ns + wait_ns FROM comm WHERE wait_ns > 0),
    {hidden_ctes('comm_iv', 'hidden', HIDING_SQL)},
    {gpu_phase_ctes('comm', 'ph')}
    SELECT c.point_id, ph.phase, coalesce(h.hidden_ns, 0) AS hidden_ns, c.wait_ns - coalesce(hw.hidden_ns, 0) AS w
    FROM comm c LEFT JOIN hidden h ON h.point_id = 2 * c.point_id LEFT JOIN hidden hw ON hw.point_id = 2 * c.point_id + 1
    LEFT JOIN ph ON ph.point_id = c.point_id"""
    return sorted((r["point_id"], r["phase"], r["hidden_ns"], r["w"]) for r in store.sql(query, {"run": "t"}).to_pylist())


def _peaks(store) -> dict[tuple, tuple]:
    return {(r["device_type"], r["device"], r["step"]): (r["events"], r["peak_allocated_bytes"], r["peak_reserved_bytes"])
            for r in step_peaks(store, "t").to_pylist() if not r["rebuilt"]}


def _peaks_from_memory(store) -> dict[tuple, tuple]:
    """Each device's and step's event count, largest allocated and reserved totals, straight from
    the ``memory`` table (devices whose events carry the totals)."""
    rows = store.sql("""SELECT device_type, device, step, count(*) AS n, max(total_allocated) AS a,
                               max(total_reserved) AS r
                        FROM memory GROUP BY device_type, device, step HAVING count(total_allocated) > 0""")
    return {(r["device_type"], r["device"], r["step"]): (r["n"], r["a"], r["r"]) for r in rows.to_pylist()}


def _by_name(table) -> dict[str, tuple]:
    return {r["name"]: (r["count"], r["total_ns"], r["max_ns"]) for r in table.to_pylist()}


def _by_name_from_events(store, where: str) -> dict[str, tuple]:
    """Count, total and longest per name, straight from the events: what a profiled step ran when
    the trace has steps, everything otherwise (self and sync time: tests/test_summary.py and
    tests/test_traces_as_they_are.py count them by hand)."""
    rows = store.sql(f"""SELECT name, count(*) AS count, sum(dur_ns) AS total_ns, max(dur_ns) AS max_ns FROM events
                         WHERE {where} AND ((SELECT count(*) FROM steps) = 0 OR step IS NOT NULL) GROUP BY name""")
    return {r["name"]: (r["count"], r["total_ns"], r["max_ns"]) for r in rows.to_pylist()}


def _collectives(store) -> list[dict]:
    return sorted(collective_rows(store, "t").to_pylist(), key=lambda r: r["point_id"])


def _collectives_from_events(store) -> list[dict]:
    """Every collective event matched across ranks as the analysis did before
    ``rank_collectives``: what each is read from the events in the same query."""
    return store.sql(f"WITH {collective_ctes(collective_point_ctes())} SELECT * FROM coll ORDER BY point_id",
                     {"run": "t"}).to_pylist()


@pytest.fixture(scope="module")
def two_ranks(shared_traces: Path, tmp_path_factory) -> Path:
    """Two ranks of one NCCL job in one run: collectives matched, waits split off."""
    from stepscope.store.ingest import ingest_paths

    root = tmp_path_factory.mktemp("two-ranks") / "store"
    files = [shared_traces / f"hta/trace_filter/sampled_rank-{r}.json.gz" for r in (0, 1)]
    assert ingest_paths(files, root, "t").ok
    return root


@pytest.mark.shared
def test_stored_breakdowns_with_waits_matched_across_ranks(two_ranks: Path) -> None:
    store = open_store(two_ranks)
    assert ranks_with_collectives(store, "t") == 2
    stored = _stored(store, GPU)
    assert stored == _breakdown_from_events(store, GPU)
    assert {r["rank"] for r in stored} == {0, 1}
    assert sum(r["comm_wait_ns"] for r in stored) > 0  # the split is exercised, not trivially zero
    collectives = _collectives(store)
    assert collectives == _collectives_from_events(store)
    comm = _comm(store)
    assert comm == _comm_from_events(store)
    assert sum(1 for _, _, _, exposed_wait in comm if exposed_wait) > 0
    assert sum(r["valid"] for r in collectives) > 0
    assert _stored(store, HOST) == _breakdown_from_events(store, HOST)
    spans = store.sql("SELECT rank, step, sum(s1 - s0) AS ns FROM rank_comm_spans WHERE part = 'comm_exposed' "
                      "GROUP BY rank, step ORDER BY rank, step").to_pylist()
    assert {(r["rank"], r["step"]): r["ns"] for r in spans} == {
        (r["rank"], r["step"]): r["comm_exposed_ns"] for r in stored if r["comm_exposed_ns"]}
