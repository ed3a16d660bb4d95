"""Ingest real traces from ../shared and check every count against the raw JSON or MANIFEST.md."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from stepscope.store import open_store
from tests.conftest import load_raw

# (trace, events, ProfilerSteps, comm kernels, H2D, D2H, D2D copies, [memory] events): MANIFEST.md
MANIFEST_COUNTS = [
    ("hta/df_index_resolver/df_index_resolver.json.gz", 216092, 5, 2020, 0, 0, 2040, 28010),
    ("hta/nccl_parser_config/nccl_data.json.gz", 40573, 3, 21, 0, 0, 960, 0),
    ("hta/trace_diff/control/control.json.gz", 109123, 6, 60, 150, 60, 18, 0),
    ("hta/negative_queue_length_values_check/rank0.json.gz", 108936, 5, 80, 80, 30, 1280, 0),
    ("hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz", 220, 2, 0, 2, 0, 0, 0),
    ("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", 30, 1, 0, 0, 0, 0, 0),
    ("hta/mtia_trace_single_rank/mtia_rank_0.json.gz", 455739, 1, 0, 0, 0, 0, 0),
    ("kineto_tb_plugin/old_2021-02/resnet50_profiler_api_num_workers_0.worker0.pt.trace.json.gz",
     73639, 6, 0, 12, 0, 0, 0),
    ("tracelens/mi300/resnet_act_checkpoint.json.gz", 56451, 3, 17, 0, 0, 550, 0),
    ("tracelens/b200/eager_trace.json.gz", 24656, 0, 74, 15, 0, 146, 0),
]

RAW_KIND = {
    "kernel": {"kernel"},
    "memcpy": {"gpu_memcpy", "memcpy"},
    "memset": {"gpu_memset", "memset"},
    "cuda_runtime": {"cuda_runtime", "runtime", "mtia_runtime"},
    "cpu_op": {"cpu_op", "operator"},
    "python_function": {"python_function"},
    "user_annotation": {"user_annotation"},
    "gpu_annotation": {"gpu_user_annotation"},
}
"""Raw Kineto categories (lower-cased) counted straight from the JSON for each kind."""


def _store(ingested, relative: str):
    return open_store(ingested(relative))


@pytest.mark.parametrize("case", MANIFEST_COUNTS, ids=[c[0].split("/")[-2] for c in MANIFEST_COUNTS])
def test_counts_match_manifest(ingested, case) -> None:
    relative, events, steps, comm, h2d, d2h, d2d, memory = case
    store = _store(ingested, relative)
    got = store.sql(
        """SELECT count(*) AS events,
                  count(*) FILTER (kind = 'kernel' AND category = 'communication') AS comm,
                  count(*) FILTER (category = 'memcpy_h2d') AS h2d,
                  count(*) FILTER (category = 'memcpy_d2h') AS d2h,
                  count(*) FILTER (category = 'memcpy_d2d') AS d2d,
                  count(*) FILTER (kind = 'memory') AS memory
           FROM events"""
    ).to_pylist()[0]
    assert got == {"events": events, "comm": comm, "h2d": h2d, "d2h": d2h, "d2d": d2d, "memory": memory}
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == steps
    assert store.sql("SELECT count(*) AS n FROM memory")["n"][0].as_py() == memory


@pytest.mark.parametrize("case", MANIFEST_COUNTS, ids=[c[0].split("/")[-2] for c in MANIFEST_COUNTS])
def test_kind_counts_match_raw_json(ingested, shared_traces: Path, case) -> None:
    relative = case[0]
    raw = load_raw(shared_traces / relative)["traceEvents"]
    expected = Counter()
    for event in raw:
        cat = (event.get("cat") or "").lower()
        if event.get("name") == "[memory]":
            expected["memory"] += 1
            continue
        for kind, cats in RAW_KIND.items():
            if cat in cats:
                expected[kind] += 1
    rows = _store(ingested, relative).sql("SELECT kind, count(*) AS n FROM events GROUP BY kind").to_pylist()
    got = {r["kind"]: r["n"] for r in rows}
    for kind, count in expected.items():
        assert got.get(kind, 0) == count, kind


def test_steps_boundaries_match_raw_json(ingested, shared_traces: Path) -> None:
    relative = "hta/trace_diff/control/control.json.gz"
    raw = load_raw(shared_traces / relative)["traceEvents"]
    expected = sorted(
        (int(e["name"].split("#")[1]), e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000)
        for e in raw if re.fullmatch(r"ProfilerStep#\d+", e.get("name", "")) and e.get("cat") == "user_annotation"
    )
    got = _store(ingested, relative).sql("SELECT step, start_ns, end_ns FROM steps ORDER BY step").to_pylist()
    assert [(r["step"], r["start_ns"], r["end_ns"]) for r in got] == expected


def test_gpu_work_takes_the_step_of_its_launch(ingested, shared_traces: Path) -> None:
    """A kernel that runs after its CPU step ended still counts for the step that launched it."""
    relative = "hta/negative_queue_length_values_check/rank0.json.gz"
    raw = load_raw(shared_traces / relative)["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in raw
                   if re.fullmatch(r"ProfilerStep#\d+", e.get("name", "")) and e.get("ph") == "X")

    def step_at(ts: float) -> int | None:
        return next((s for start, end, s in steps if start <= ts < end), None)

    launch_step = {e["args"]["correlation"]: step_at(e["ts"]) for e in raw
                   if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    no_launch = object()
    expected = Counter()
    for e in raw:
        if e.get("cat") == "kernel":
            step = launch_step.get(e["args"].get("correlation"), no_launch)
            expected[step_at(e["ts"]) if step is no_launch else step] += 1
    rows = _store(ingested, relative).sql("SELECT step, count(*) AS n FROM events WHERE kind = 'kernel' GROUP BY step")
    assert {r["step"]: r["n"] for r in rows.to_pylist()} == dict(expected)
    late = _store(ingested, relative).sql(
        """SELECT count(*) AS n FROM events e JOIN steps s ON e.step = s.step
           WHERE e.kind = 'kernel' AND e.ts_ns >= s.end_ns"""
    )["n"][0].as_py()
    assert late > 0, "this trace has kernels that run after their step's CPU window"


def test_nccl_collective_args(ingested, shared_traces: Path) -> None:
    relative = "hta/nccl_parser_config/nccl_data.json.gz"
    doc = load_raw(shared_traces / relative, exact=True)
    raw = doc["traceEvents"]
    expected = sorted(
        (int(e["ts"] * 1000) + doc["baseTimeNanoseconds"],
         e["args"].get("In msg nelems"), e["args"].get("Out msg nelems"), e["args"].get("dtype"),
         e["args"].get("Group size"))
        for e in raw if e.get("cat") == "kernel" and e["name"].startswith("nccl")
    )
    rows = _store(ingested, relative).sql(
        """SELECT ts_ns, in_nelems, out_nelems, dtype, group_size, collective, bytes FROM events
           WHERE kind = 'kernel' AND category = 'communication' ORDER BY ts_ns"""
    ).to_pylist()
    assert [(r["ts_ns"], r["in_nelems"], r["out_nelems"], r["dtype"], r["group_size"]) for r in rows] == expected
    assert {r["collective"] for r in rows} <= {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                                "send", "recv", "send_recv", "all_to_all"}
    for r in rows:
        if r["in_nelems"] is not None and r["dtype"] == "Float":
            assert r["bytes"] == max(r["in_nelems"], r["out_nelems"]) * 4


def test_memory_rows(ingested, shared_traces: Path) -> None:
    relative = "hta/df_index_resolver/df_index_resolver.json.gz"
    raw = [e for e in load_raw(shared_traces / relative)["traceEvents"] if e.get("name") == "[memory]"]
    rows = _store(ingested, relative).sql(
        "SELECT sum(bytes) AS b, max(total_allocated) AS a, max(total_reserved) AS r, "
        "count(DISTINCT addr) AS addrs FROM memory").to_pylist()[0]
    assert rows["b"] == sum(e["args"]["Bytes"] for e in raw)
    assert rows["a"] == max(e["args"]["Total Allocated"] for e in raw)
    assert rows["r"] == max(e["args"]["Total Reserved"] for e in raw)
    assert rows["addrs"] == len({e["args"]["Addr"] for e in raw})


@pytest.mark.parametrize(
    "relative",
    [
        "hta/df_index_resolver/df_index_resolver.json.gz",        # absolute epoch microseconds
        "hta/nccl_parser_config/nccl_data.json.gz",               # baseTimeNanoseconds + relative ts
        "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",  # displayTimeUnit ns
    ],
)
def test_timestamp_conventions_give_absolute_ns(ingested, shared_traces: Path, relative: str) -> None:
    doc = load_raw(shared_traces / relative, exact=True)
    base = doc.get("baseTimeNanoseconds", 0)
    expected = sorted(base + int(e["ts"] * 1000) for e in doc["traceEvents"] if e.get("ph") == "X")
    got = _store(ingested, relative).sql("SELECT ts_ns FROM events WHERE ph = 'X' ORDER BY ts_ns")["ts_ns"]
    assert got.to_pylist() == expected
    got = got[0].as_py()
    assert 1.5e18 < got < 2.0e18, "an epoch time in ns (2017..2033)"


def test_sub_microsecond_digits_are_kept(ingested, shared_traces: Path) -> None:
    relative = "hta/nccl_parser_config/nccl_data.json.gz"
    rows = _store(ingested, relative).sql(
        "SELECT count(*) FILTER (ts_ns % 1000 <> 0) AS frac, count(*) AS n FROM events WHERE ph = 'X'"
    ).to_pylist()[0]
    assert rows["frac"] > rows["n"] / 2


def test_runs_metadata(ingested) -> None:
    store = _store(ingested, "tracelens/b200/eager_trace.json.gz")
    row = store.sql("SELECT * FROM sources").to_pylist()[0]
    assert (row["gpu_name"], row["gpu_memory_bytes"], row["gpu_sm_count"]) == ("NVIDIA B200", 191503138816, 148)
    assert (row["backend"], row["world_size"], row["rank"], row["rank_from"]) == ("nccl", 8, 0, "distributedInfo")
    assert '"pg_config"' in row["distributed_info"]
    runs = store.sql("SELECT * FROM runs").to_pylist()
    assert len(runs) == 1 and runs[0]["ranks"] == 1 and runs[0]["sources"][0]["sha256"] == row["sha256"]


def test_rccl_and_nvls_kernels_are_communication(ingested) -> None:
    names = {r["name"] for r in _store(ingested, "tracelens/b200/eager_trace.json.gz").sql(
        "SELECT DISTINCT name FROM events WHERE category = 'communication' AND kind = 'kernel'").to_pylist()}
    assert any("multimem_all_reduce" in n for n in names)
    amd = _store(ingested, "tracelens/mi300/resnet_act_checkpoint.json.gz").sql(
        "SELECT DISTINCT name FROM events WHERE category = 'communication' AND kind = 'kernel'").to_pylist()
    assert {r["name"] for r in amd} == {"ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"}


def test_cpu_only_gloo_trace(ingested) -> None:
    store = _store(ingested, "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    row = store.sql("SELECT rank, backend, world_size, gpu_name FROM sources").to_pylist()[0]
    assert row == {"rank": 34, "backend": "gloo", "world_size": 300, "gpu_name": None}
    assert store.sql("SELECT count(*) AS n FROM events WHERE kind = 'kernel'")["n"][0].as_py() == 0


def test_pre_2021_names_map_onto_kinds(ingested) -> None:
    store = _store(ingested, "kineto_tb_plugin/old_2021-02/resnet50_profiler_api_num_workers_0.worker0.pt.trace.json.gz")
    kinds = {r["kind"] for r in store.sql("SELECT DISTINCT kind FROM events").to_pylist()}
    assert {"cpu_op", "cuda_runtime", "kernel", "memcpy", "memset"} <= kinds
