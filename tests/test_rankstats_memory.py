"""Launch overhead and the memory answers read from the tables each trace's ingest wrote
(``rank_launches``, ``rank_memory_live``, ``rank_memory_steps``, ``rank_memory_allocations``,
``rank_memory_curve``) equal what the analyses computed from the events before those tables.

The reference is the event query each function ran before (kept here only, as the independent
side), on every shared trace with ``[memory]`` events (and, for the launches, every shared trace
with GPU steps); generated traces cover what the shared ones lack: a rank with two traces (an
allocation never freed in the first is live at the second's peak; the launch medians), memory
roles, and a ``top`` beyond what is stored. A store of schema version 2 is refused until
``stepscope migrate`` writes these tables, and then answers as a fresh ingest.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pytest

from stepscope.analysis.kernels import launch_overhead
from stepscope.analysis.memory import (
    largest_allocations,
    live_at_peak,
    memory_timeline,
    role_allocations,
    roles_at_peak,
)
from stepscope.analysis.quantiles import median_sql
from stepscope.cli import main
from stepscope.errors import StoreError, UsageError
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from stepscope.store.rankstats.breakdown import GPU_KINDS_SQL
from stepscope.store.rankstats.memory import memory_cte, stack_cte, threads_cte
from stepscope.store.schema import MEMORY_ROLES
from stepscope.store.writer import write_partition
from tests._store_versions import as_older_version
from tests.conftest import write_trace
from tests.test_breakdown import GPU_STEP_TRACES

MEMORY_TRACES = [
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "tracelens/inference/sglang_decode/capture_traces/bs_32_rank0.json.gz",
    "tracelens/inference/vllm_decode_full/capture_traces/graph_capture_rank_0.1773709742341309550.pt.trace.json.gz",
    "tracelens/inference/vllm_prefilldecode_piecewise/capture_traces/graph_capture_rank_0.1773709679453551615.pt.trace.json.gz",
    "tracelens/mi300/ddp_resnet18_no_pool_train_resnet18.json.gz",
    "tracelens/perf_model/normalization/normalization_layer_test.json.gz",
]
"""Every shared trace with ``[memory]`` events (../shared/traces/MANIFEST.md)."""

# ---- the event queries the analyses ran before the tables (the reference) ----------------------

_ALLOCS = """
{memory},
mem AS MATERIALIZED (SELECT * FROM mem_events),
allocs AS MATERIALIZED (
  SELECT * FROM (
    SELECT mid, run, rank, source, device_type, device, step, addr, bytes, ts_ns AS alloc_ts_ns,
           CASE WHEN lead(bytes) OVER w < 0 THEN lead(ts_ns) OVER w END AS free_ts_ns
    FROM mem
    WINDOW w AS (PARTITION BY source, device_type, device, addr ORDER BY ts_ns, mid)
  ) WHERE bytes > 0
)""".format(memory=memory_cte("TRUE"))

_ROLES = """
role_ranges AS (
  SELECT r.source, r.role::VARCHAR AS role, r.name AS role_name, r.addr, r.addr + r.bytes AS addr_end,
         r.device_type, r.device,
         coalesce(s.end_ns, (SELECT max(ts_ns) FROM memory m WHERE m.source = r.source)) AS seen_ns
  FROM memory_roles r LEFT JOIN steps s ON s.source = r.source AND s.step = r.step
  WHERE r.run = $run
),
alloc_role AS (
  SELECT a.mid, min(r.role) AS role, min(r.role_name) AS role_name
  FROM allocs a JOIN role_ranges r
    ON r.source = a.source AND r.device_type IS NOT DISTINCT FROM a.device_type
   AND (r.device IS NULL OR r.device = a.device)
   AND a.addr >= r.addr AND a.addr < r.addr_end
   AND a.alloc_ts_ns <= r.seen_ns AND (a.free_ts_ns IS NULL OR a.free_ts_ns > r.seen_ns)
  GROUP BY a.mid
),
peak AS (
  SELECT rank, device_type, device, ts_ns AS peak_ts_ns, total_allocated AS peak_allocated_bytes
  FROM (SELECT *, row_number() OVER (PARTITION BY rank, device_type, device
                                     ORDER BY total_allocated DESC, ts_ns, mid) AS rn FROM mem)
  WHERE rn = 1
)"""

_LIVE_BEFORE = f"""
WITH {_ALLOCS}, {_ROLES},
live AS (
  SELECT a.*, p.peak_ts_ns, p.peak_allocated_bytes,
         row_number() OVER (PARTITION BY a.rank, a.device_type, a.device ORDER BY a.bytes DESC, a.alloc_ts_ns)
           AS size_rank
  FROM allocs a JOIN peak p
    ON p.rank = a.rank AND p.device_type = a.device_type AND p.device IS NOT DISTINCT FROM a.device
  WHERE a.alloc_ts_ns <= p.peak_ts_ns AND (a.free_ts_ns IS NULL OR a.free_ts_ns > p.peak_ts_ns)
),
picked AS (SELECT mid AS point_id, source, alloc_ts_ns AS ts_ns, bytes, device FROM live WHERE size_rank <= $top),
{threads_cte('picked', 'picked_threads')},
{stack_cte('picked_threads', 'picked_stack')}
SELECT l.run, l.rank, l.device_type, l.device, l.peak_ts_ns, l.peak_allocated_bytes, l.size_rank,
       l.bytes, l.addr, l.step, l.alloc_ts_ns, l.free_ts_ns, coalesce(r.role, 'other') AS role,
       r.role_name, s.ops AS allocated_by
FROM live l LEFT JOIN alloc_role r USING (mid) LEFT JOIN picked_stack s ON s.point_id = l.mid
WHERE l.size_rank <= $top
ORDER BY l.rank, l.device_type, l.device, l.size_rank"""

_LARGEST_BEFORE = f"""
WITH {_ALLOCS},
ranked AS (
  SELECT *, row_number() OVER (PARTITION BY rank, device_type, device ORDER BY bytes DESC, alloc_ts_ns) AS size_rank
  FROM allocs
),
picked AS (SELECT mid AS point_id, source, alloc_ts_ns AS ts_ns, bytes, device FROM ranked WHERE size_rank <= $top),
{threads_cte('picked', 'picked_threads')},
{stack_cte('picked_threads', 'picked_stack')}
SELECT r.run, r.rank, r.device_type, r.device, r.size_rank, r.bytes, r.addr, r.step, r.alloc_ts_ns,
       r.free_ts_ns, r.free_ts_ns - r.alloc_ts_ns AS lifetime_ns, s.ops AS allocated_by
FROM ranked r LEFT JOIN picked_stack s ON s.point_id = r.mid
WHERE r.size_rank <= $top
ORDER BY r.rank, r.device_type, r.device, r.size_rank"""

_ROLES_AT_PEAK_BEFORE = f"""
WITH {_ALLOCS}, {_ROLES},
live AS (
  SELECT a.rank, a.device_type, a.device, coalesce(r.role, 'other') AS role, a.bytes
  FROM allocs a JOIN peak p
    ON p.rank = a.rank AND p.device_type = a.device_type AND p.device IS NOT DISTINCT FROM a.device
  LEFT JOIN alloc_role r USING (mid)
  WHERE a.alloc_ts_ns <= p.peak_ts_ns AND (a.free_ts_ns IS NULL OR a.free_ts_ns > p.peak_ts_ns)
)
SELECT p.rank, p.device_type, p.device, p.peak_ts_ns, l.role, sum(l.bytes)::BIGINT AS live_bytes,
       count(*) AS allocations, any_value(p.peak_allocated_bytes) AS peak_allocated_bytes
FROM live l JOIN peak p USING (rank, device_type, device) GROUP BY ALL"""

_ROLE_ALLOCATIONS_BEFORE = f"""
WITH {_ALLOCS}, {_ROLES}
SELECT $run AS run, a.rank, a.device_type, a.device, a.step, coalesce(r.role, 'other') AS role,
       count(*) AS allocations, sum(a.bytes)::BIGINT AS bytes
FROM allocs a LEFT JOIN alloc_role r USING (mid)
GROUP BY ALL
ORDER BY a.rank, a.device_type, a.device, a.step NULLS LAST, role"""

_TIMELINE_BEFORE = f"""
WITH {memory_cte("TRUE")},
m AS (
  SELECT *, min(ts_ns) OVER s AS t_first, max(ts_ns) OVER s AS t_last
  FROM mem_events WINDOW s AS (PARTITION BY rank, device_type, device)
),
b AS (
  SELECT *, CASE WHEN t_last = t_first THEN 0
                 ELSE least($n - 1, ((ts_ns - t_first) * $n) // (t_last - t_first + 1)) END AS bucket
  FROM m
)
SELECT rank, device_type, device, max(total_allocated) AS total_allocated, max(total_reserved) AS total_reserved,
       bool_or(rebuilt) AS rebuilt,
       min(ts_ns) FILTER (WHERE total_allocated = peak) AS ts_ns  -- the earliest point at the bucket's peak
FROM (SELECT *, max(total_allocated) OVER (PARTITION BY rank, device_type, device, bucket) AS peak FROM b)
GROUP BY rank, device_type, device, bucket
ORDER BY rank, device_type, device, ts_ns"""

_LAUNCH_BEFORE = f"""
WITH _gpu AS (
    SELECT rank, source, correlation, min(ts_ns) AS gpu_start, sum(dur_ns) AS gpu_ns
    FROM events
    WHERE run = $run AND kind IN {GPU_KINDS_SQL} AND dur_ns IS NOT NULL AND correlation IS NOT NULL
    GROUP BY rank, source, correlation
),
_launch AS (
    SELECT r.rank, r.ts_ns, r.dur_ns, g.gpu_start, g.gpu_ns
    FROM events r JOIN _gpu g ON r.rank = g.rank AND r.source = g.source AND r.correlation = g.correlation
    WHERE r.run = $run AND r.kind IN ('cuda_runtime', 'cuda_driver') AND r.dur_ns IS NOT NULL
)
SELECT $run AS run, rank, count(*) AS launches, sum(dur_ns)::BIGINT AS launch_ns,
       sum(gpu_ns)::BIGINT AS launched_gpu_ns,
       CASE WHEN sum(gpu_ns) > 0 THEN sum(dur_ns) / sum(gpu_ns) END AS launch_to_gpu_ratio,
       count(*) FILTER (WHERE gpu_ns < dur_ns) AS short_launches,
       {median_sql("gpu_start - ts_ns")} AS median_launch_delay_ns
FROM _launch GROUP BY rank ORDER BY rank"""


def _before(store, query: str, run: str = "t", **params) -> list[dict]:
    return store.sql(query, {"run": run, **params}).to_pylist()


def _timeline_before(store, n: int, run: str = "t") -> list[tuple]:
    return [(r["rank"], r["device_type"], r["device"], r["ts_ns"], r["total_allocated"], r["total_reserved"],
             r["rebuilt"]) for r in _before(store, _TIMELINE_BEFORE, run, n=n)]


def _timeline(store, n: int, run: str = "t") -> list[tuple]:
    return [(r["rank"], r["device_type"], r["device"], r["ts_ns"], r["total_allocated"], r["total_reserved"],
             r["rebuilt"]) for r in memory_timeline(store, run, max_points=n).to_pylist()]


def _peak_of_each_series(rows: list[tuple]) -> dict[tuple, tuple]:
    """Per (rank, device type, device): the largest allocated and reserved memory of the curve."""
    series: dict[tuple, list[tuple]] = defaultdict(list)
    for rank, dtype, dev, _, allocated, reserved, _ in rows:
        series[(rank, dtype, dev)].append((allocated, reserved))
    return {key: tuple(max((v for v in column if v is not None), default=None) for column in zip(*values))
            for key, values in series.items()}


# ---- every shared trace with [memory] events ----------------------------------------------------

@pytest.mark.shared
@pytest.mark.parametrize("relative", MEMORY_TRACES, ids=[t.split("/")[-1][:24] for t in MEMORY_TRACES])
def test_memory_answers_from_the_tables_equal_the_event_queries(ingested, relative: str) -> None:
    store = open_store(ingested(relative))
    assert store.sql("SELECT count(*) AS n FROM memory").to_pylist()[0]["n"] > 0
    for top in (10, 20):
        assert live_at_peak(store, "t", top=top).to_pylist() == _before(store, _LIVE_BEFORE, top=top)
        assert largest_allocations(store, "t", top=top).to_pylist() == _before(store, _LARGEST_BEFORE, top=top)
    # the dashboard's 2000 points, and any count dividing it: bucket for bucket; the others keep every peak
    for n in (2000, 50, 8):
        assert _timeline(store, n) == _timeline_before(store, n)
    for n in (333, 7000):
        got, before = _timeline(store, n), _timeline_before(store, n)
        per_series = defaultdict(int)
        for rank, dtype, dev, *_ in got:
            per_series[(rank, dtype, dev)] += 1
        assert got and max(per_series.values()) <= n
        assert _peak_of_each_series(got) == _peak_of_each_series(before)


@pytest.mark.shared
@pytest.mark.parametrize("relative", GPU_STEP_TRACES + MEMORY_TRACES[1:],
                         ids=[t.split("/")[-1][:24] for t in GPU_STEP_TRACES + MEMORY_TRACES[1:]])
def test_launch_overhead_from_the_table_equals_the_event_query(ingested, relative: str) -> None:
    store = open_store(ingested(relative))
    assert launch_overhead(store, "t").to_pylist() == _before(store, _LAUNCH_BEFORE)


# ---- generated: two traces of one rank, roles, a top beyond what is stored ---------------------

def _memory_event(ts: float, addr: int, nbytes: int, total: int, tid: int = 1) -> dict:
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": tid, "ts": ts,
            "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": total, "Total Reserved": 4096,
                     "Device Type": 1, "Device Id": 0}}


def _window(t0: float, step: int, allocations: list[tuple[float, int, int]], frees: list[tuple[float, int, int]],
            base: int) -> list[dict]:
    """One profiled window: a ProfilerStep, an op around the allocations, a launch and its kernel,
    and the allocations/frees given as (ts offset, addr, bytes) with totals counted from ``base``."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1, "ts": t0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": t0 + 1, "dur": 90},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t0 + 2,
         "dur": 4 + step, "args": {"correlation": step}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": t0 + 10 + step, "dur": 3,
         "args": {"correlation": step, "stream": 7, "device": 0}},
    ]
    total = base
    for ts, addr, nbytes in sorted(allocations + [(t, a, -b) for t, a, b in frees]):
        total += nbytes
        events.append(_memory_event(t0 + ts, addr, nbytes, total))
    return events


@pytest.fixture(scope="module")
def two_traces(tmp_path_factory) -> Path:
    """Rank 0 profiled twice: the first window leaves 512 + 64 bytes unfreed (the 512 a parameter by
    the roles), the second peaks higher, with them counted as live, at a gradient's allocation."""
    root = tmp_path_factory.mktemp("two")
    first = _window(0.0, 1, [(5, 7000, 512), (6, 8000, 256), (7, 9000, 64)], [(50, 8000, 256)], 0)
    second = _window(10_000.0, 2, [(5, 10_000, 1024), (6, 11_000, 2048), (8, 12_000, 32)],
                     [(60, 11_000, 2048), (70, 10_000, 1024)], 576)
    paths = [write_trace(root / "traces" / f"w{i}.json", events, distributedInfo={"rank": 0})
             for i, events in enumerate((first, second))]
    report = ingest_paths(paths, root / "store", "two")
    assert report.ok and len(report.stored) == 2
    by_step = {}
    for stored in report.stored:
        step = open_store(root / "store").sql(f"SELECT min(step) AS s FROM steps WHERE source = '{stored.source}'")
        by_step[step.to_pylist()[0]["s"]] = stored.source
    roles = [(by_step[1], "parameter", "w", 7000, 512, 1, 0, None), (by_step[2], "gradient", "b.grad", 12_000, 32, 1, 0, 2)]
    for source in by_step.values():
        rows = [dict(zip(MEMORY_ROLES.names, r)) for r in roles if r[0] == source]
        write_partition(root / "store", "memory_roles", "two", 0, source, pa.Table.from_pylist(rows, MEMORY_ROLES))
    return root / "store"


def test_a_rank_with_two_traces_answers_as_the_event_queries(two_traces: Path) -> None:
    store = open_store(two_traces)
    live = live_at_peak(store, "two").to_pylist()
    assert live == _before(store, _LIVE_BEFORE, "two", top=20)
    # the first window's unfreed 512 + 64 bytes are live at the second window's peak
    assert [(r["bytes"], r["role"]) for r in live] == [(2048, "other"), (1024, "other"), (512, "parameter"),
                                                       (64, "other"), (32, "gradient")]
    assert live[0]["peak_allocated_bytes"] == 576 + 1024 + 2048 + 32
    assert largest_allocations(store, "two").to_pylist() == _before(store, _LARGEST_BEFORE, "two", top=20)
    by_role = role_allocations(store, "two").to_pylist()
    assert by_role == _before(store, _ROLE_ALLOCATIONS_BEFORE, "two")
    assert [(r["step"], r["role"], r["allocations"], r["bytes"]) for r in by_role] == [
        (1, "other", 2, 256 + 64), (1, "parameter", 1, 512), (2, "gradient", 1, 32), (2, "other", 2, 1024 + 2048)]
    roles = {r["role"]: r for r in roles_at_peak(store, "two").to_pylist()}
    before = {r["role"]: r for r in _before(store, _ROLES_AT_PEAK_BEFORE, "two")}
    for role in ("parameter", "gradient", "other"):
        assert (roles[role]["live_bytes"], roles[role]["allocations"]) == (
            before[role]["live_bytes"], before[role]["allocations"]), role
    assert roles["optimizer_state"]["live_bytes"] == 0 and roles["optimizer_state"]["allocations"] == 0
    assert roles["untracked"]["live_bytes"] == before["other"]["peak_allocated_bytes"] - sum(
        r["live_bytes"] for r in before.values())
    # two traces: the same peaks, bucket by bucket where each trace's points fall apart
    got, old = _timeline(store, 2000, "two"), _timeline_before(store, 2000, "two")
    assert _peak_of_each_series(got) == _peak_of_each_series(old)


def test_launch_median_over_two_traces_is_the_weighted_mean_of_theirs(two_traces: Path) -> None:
    """Each window launches one kernel: delays (10 + step) - 2 = 9 and 10 us; one launch each, so
    the launch-weighted mean of the medians is their mean, which is also the exact median here."""
    store = open_store(two_traces)
    [row] = launch_overhead(store, "two").to_pylist()
    [before] = _before(store, _LAUNCH_BEFORE, "two")
    assert row == before
    assert row["launches"] == 2 and row["median_launch_delay_ns"] == 9_500.0
    assert row["launch_ns"] == 5_000 + 6_000 and row["launched_gpu_ns"] == 6_000 and row["short_launches"] == 2


def test_a_top_beyond_what_is_stored_is_refused(two_traces: Path) -> None:
    store = open_store(two_traces)
    for function in (live_at_peak, largest_allocations):
        with pytest.raises(UsageError, match="keeps the 20 largest"):
            function(store, "two", top=21)


# ---- a store of schema version 2 ---------------------------------------------------------------

MINE = ("rank_launches", "rank_memory_live", "rank_memory_steps", "rank_memory_allocations", "rank_memory_curve")


def _answers(store) -> list:
    return [live_at_peak(store, "t").to_pylist(), largest_allocations(store, "t").to_pylist(),
            memory_timeline(store, "t").to_pylist(), launch_overhead(store, "t").to_pylist()]


@pytest.mark.shared
def test_a_version_2_store_is_refused_until_migrated(ingested, tmp_path: Path, capsys) -> None:
    store = tmp_path / "store"
    shutil.copytree(ingested(MEMORY_TRACES[0]), store)
    shutil.rmtree(store / "cache", ignore_errors=True)
    fresh = _answers(open_store(store))
    assert all(fresh)
    as_older_version(store, 2, MINE)
    with pytest.raises(StoreError, match=r"schema version 2, older .*stepscope migrate --store"):
        open_store(store)
    assert main(["migrate", "--store", str(store)]) == 0
    assert "1 traces migrated" in capsys.readouterr().out
    assert _answers(open_store(store)) == fresh
