"""Every dashboard page in Streamlit's AppTest, on real shared traces and on the sample traces.

Each page must render without an exception or an error message, and the figures it shows must
be the analysis layer's own (the dashboard only renders). Where a count can be taken straight
from the raw JSON (events, collectives, copies), the page is checked against that too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from stepscope.analysis.summary import build_summary  # noqa: E402
from stepscope.units import duration  # noqa: E402
from stepscope.store import open_store  # noqa: E402
from stepscope.store.ingest import ingest_paths  # noqa: E402
from tests._dashboard_stores import SHARED_RUNS, build_sample_store, build_shared_store  # noqa: E402
from tests.conftest import REPO, load_raw  # noqa: E402

APP = REPO / "stepscope" / "dashboard" / "app.py"
PAGES = ("runs", "overview", "communication", "copies", "memory", "kernels", "pipeline", "compare", "sql")


@pytest.fixture(scope="session")
def shared_store(tmp_path_factory: pytest.TempPathFactory, shared_traces: Path) -> Path:
    """The runs of ``SHARED_RUNS`` in one store (skipped without ../shared/traces)."""
    return build_shared_store(tmp_path_factory)


@pytest.fixture(scope="session")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sample_store(tmp_path_factory)


def app_for(root: Path | str, monkeypatch: pytest.MonkeyPatch, **query: str) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", "--store", str(root)])
    at = AppTest.from_file(str(APP), default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    return at


def open_page(root: Path | str, page: str, monkeypatch: pytest.MonkeyPatch, *, opened: tuple[str, ...] = (),
              **query: str) -> AppTest:
    """``page`` after its first render, with the lazy expanders keyed ``opened`` open (their
    content is drawn only then: ``_view.on_demand``)."""
    at = app_for(root, monkeypatch, **query)
    at.run()
    at.switch_page(f"views/{page}.py")
    at.run()
    if opened:
        for key in opened:
            at.session_state[key] = True
        at.run()
    return at


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def table_with(at: AppTest, *columns: str) -> Any:
    """The first dataframe shown that has all ``columns``."""
    for element in at.dataframe:
        df = element.value
        if all(c in df.columns for c in columns):
            return df
    raise AssertionError(f"no table with columns {columns}; shown: {[list(e.value.columns) for e in at.dataframe]}")


# ---- every page renders cleanly on both stores ---------------------------------------------


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_on_sample_traces(sample_store: Path, page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(sample_store, page, monkeypatch)
    assert_clean(at)
    assert at.title, "page has no title"


@pytest.mark.shared
@pytest.mark.parametrize("page,run", [(p, "dfir") for p in PAGES])  # sampled: the browser test
def test_page_renders_on_shared_traces(shared_store: Path, page: str, run: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(shared_store, page, monkeypatch, run=run, baseline="control")
    assert_clean(at)
    assert run in at.title[0].value or page in ("runs", "compare", "sql")


# ---- the figures shown are the analysis layer's ------------------------------------------------


MANIFEST_EVENTS = {"control": 109123, "test": 105167, "sampled": 4855 + 4720, "dfir": 216092}
"""``traceEvents`` lengths counted from the raw JSON in ../shared/traces/MANIFEST.md."""


@pytest.mark.shared
def test_runs_page_counts_events_of_each_trace(shared_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(shared_store, "runs", monkeypatch, run="dfir")
    assert_clean(at)
    runs = table_with(at, "run", "events").set_index("run")
    for run, events in MANIFEST_EVENTS.items():
        assert runs.loc[run, "events"] == events
    assert len(at.get("download_button")) == 1  # the chosen run, dfir, has one rank


@pytest.mark.shared
def test_overview_shows_the_step_breakdown(shared_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.analysis.breakdown import rank_totals, step_breakdown

    at = open_page(shared_store, "overview", monkeypatch, run="dfir")
    assert_clean(at)
    assert not at.dataframe and not at.json  # the first render: no table or evidence until opened
    assert not at.get("iframe")  # nor the rank's whole trace, which the Perfetto button carries
    assert len(at.get("vega_lite_chart")) == 1  # and the first chart only: the step timeline
    at = open_page(shared_store, "overview", monkeypatch, run="dfir",
                   opened=("gpu_breakdown", "gpu_table", "gpu_totals_table", "finding:0", "perfetto"))
    assert_clean(at)
    assert len(at.get("iframe")) == 1  # opened: the rank's trace, handed to Perfetto in one click
    with open_store(shared_store) as store:
        expected = step_breakdown(store, "dfir").to_pandas()
        totals = rank_totals(store, "dfir").to_pandas().iloc[0]
    shown = table_with(at, "compute_ms", "idle_ms")
    assert list(shown["step"]) == list(expected["step"])
    for part in ("compute", "comm_exposed", "memcpy_d2d_exposed", "idle", "dur"):
        assert list(shown[f"{part}_ms"]) == list(expected[f"{part}_ns"] / 1e6)
    assert table_with(at, "gpu_busy_ms")["gpu_busy_ms"].iloc[0] == totals["gpu_busy_ns"] / 1e6
    assert len(at.get("vega_lite_chart")) >= 3  # the step timeline and the two breakdown charts
    # the verdict first: what bounds the step, as the summary's verdict says
    with open_store(shared_store) as store:
        verdict = build_summary(store, "dfir")["verdict"]
    assert [m.label for m in at.metric] == [b["label"] for b in verdict["bound_by"]]  # labels whole, never clipped
    assert [m.value for m in at.metric] == [duration(b["ns"]) for b in verdict["bound_by"]]
    assert [m.delta for m in at.metric] == [f"{100 * b['share']:.1f}%" for b in verdict["bound_by"]]
    assert f"Step time {duration(verdict['basis']['step_ns'])}**: the mean step" in at.markdown[0].value
    messages = [e.label for e in at.expander]
    assert any("communication transfers exposed" in m and "mostly all_reduce in backward" in m for m in messages)
    first = next(m for m in messages if "·" in m)
    assert first.startswith(f"**{duration(verdict['findings'][0]['time_at_stake_ns'])}/step")
    assert [json.loads(j.value) for j in at.json] == [verdict["findings"][0]["evidence"]]  # the one opened


@pytest.mark.shared
def test_overview_step_filter_selects_rows(shared_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(shared_store, "overview", monkeypatch, run="dfir", steps="3-4",
                   opened=("gpu_breakdown", "gpu_table"))
    assert_clean(at)
    assert list(table_with(at, "comm_exposed_ms")["step"]) == [3, 4]
    assert at.query_params["steps"] in ("3-4", ["3-4"])


def test_communication_warns_of_the_late_rank(sample_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The late sample's ``comm.late_rank`` finding, as the summary words it, is on the page."""
    at = open_page(sample_store, "communication", monkeypatch, run="gloo-3ranks-late")
    assert_clean(at)
    with open_store(sample_store) as store:
        late = [f["message"] for f in build_summary(store, "gloo-3ranks-late")["findings"]
                if f["rule"] == "comm.late_rank"]
    assert late and [w.value for w in at.warning] == late


@pytest.mark.shared
def test_communication_counts_collectives(shared_store: Path, shared_traces: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.analysis.comm import arrival_skew, collective_summary, rank_arrivals

    at = open_page(shared_store, "communication", monkeypatch, run="sampled")
    assert_clean(at)
    shown = table_with(at, "collective", "count", "exposed_ms")
    with open_store(shared_store) as store:
        expected = collective_summary(store, "sampled").to_pandas()
    assert list(shown["count"]) == list(expected["count"])
    assert list(shown["exposed_ms"]) == list(expected["exposed_ns"] / 1e6)
    # Independent count: NCCL kernels in each raw trace (MANIFEST: 10 per rank).
    for rank, f in enumerate(SHARED_RUNS["sampled"]):
        raw = load_raw(shared_traces / f)["traceEvents"]
        nccl = sum(1 for e in raw if e.get("cat") == "kernel" and e.get("name", "").startswith("nccl"))
        assert shown.loc[shown["rank"] == rank, "count"].sum() == nccl == 10
    with open_store(shared_store) as store:
        arrivals = rank_arrivals(store, "sampled").to_pandas()
    if arrivals.empty:  # nothing matched across ranks: the page says so instead of an empty chart
        assert any("was matched on two or more" in i.value for i in at.info)
    else:
        assert list(table_with(at, "last_pct", "instances")["last_pct"]) == list(arrivals["last_pct"])
    with open_store(shared_store) as store:
        skew = arrival_skew(store, "sampled").to_pandas()
    heatmap = next(c for c in at.get("vega_lite_chart") if '"mark":{"type":"rect"' in c.proto.spec.replace(" ", ""))
    # one cell per rank x collective: the all-gathers and all-reduces matched on both ranks
    assert heatmap is not None and len(skew) == 4 and set(skew["collective"]) == {"all_gather", "all_reduce"}
    shown_skew = table_with(at, "mean_late_ms", "max_late_ms")
    assert list(shown_skew["mean_late_ms"]) == list(skew["mean_late_ns"] / 1e6)


@pytest.mark.shared
def test_copies_page_counts_h2d_copies(shared_store: Path, shared_traces: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.analysis.copies import copy_summary

    at = open_page(shared_store, "copies", monkeypatch, run="control")
    assert_clean(at)
    shown = table_with(at, "direction", "host_memory", "count", "bandwidth_gbps", "gib")
    with open_store(shared_store) as store:
        expected = copy_summary(store, "control", per_step=False).to_pandas()
    assert list(shown["bytes"]) == list(expected["bytes"])
    assert list(shown["bandwidth_gbps"]) == list(expected["bandwidth_gbps"])
    raw = load_raw(shared_traces / SHARED_RUNS["control"][0])["traceEvents"]
    h2d = [e for e in raw if e.get("cat") == "gpu_memcpy" and "HtoD" in e.get("name", "")]
    assert shown.loc[shown["direction"] == "h2d", "count"].sum() == len(h2d) == 150
    assert shown.loc[shown["direction"] == "h2d", "bytes"].sum() == sum(e["args"]["bytes"] for e in h2d)
    assert len(at.get("vega_lite_chart")) == 4  # bytes, bandwidth, hidden per step; bandwidth vs peak


@pytest.mark.shared
def test_memory_page_shows_step_peaks(shared_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.analysis.memory import step_peaks

    at = open_page(shared_store, "memory", monkeypatch, run="dfir")
    assert_clean(at)
    shown = table_with(at, "peak_allocated_bytes", "peak_allocated_gib")
    with open_store(shared_store) as store:
        expected = step_peaks(store, "dfir").to_pandas()
    expected = expected[expected["step"].notna()]
    shown = shown[shown["step"].notna()]
    assert list(shown["peak_allocated_bytes"]) == list(expected["peak_allocated_bytes"])
    assert len(at.get("vega_lite_chart")) == 1


@pytest.mark.shared
def test_kernels_page_shows_top_kernels(shared_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.analysis.kernels import top_kernels

    at = open_page(shared_store, "kernels", monkeypatch, run="dfir")
    assert_clean(at)
    shown = table_with(at, "rank_in_rank", "kind", "total_ms")
    with open_store(shared_store) as store:
        expected = top_kernels(store, "dfir", n=20).to_pandas()
    assert list(shown["name"]) == list(expected["name"])
    assert list(shown["total_ms"]) == list(expected["total_ns"] / 1e6)


@pytest.mark.shared
def test_compare_page_shows_the_comparison(shared_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.analysis.compare.comparison import compare_runs

    at = open_page(shared_store, "compare", monkeypatch, run="test", baseline="control")
    assert_clean(at)
    with open_store(shared_store) as store:
        comparison = compare_runs(store, "control", store, "test")
    shown = table_with(at, "metric", "baseline", "candidate", "delta_pct").set_index("metric")
    step = comparison.metric("step_time")
    assert shown.loc["step time", "baseline"] == step.base_value / 1e6
    assert shown.loc["step time", "candidate"] == step.cand_value / 1e6
    assert shown.loc["step time", "delta_pct"] == step.delta_pct
    assert any("world size differs" in w.value for w in at.warning)


def test_compare_without_baseline_says_so(sample_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(sample_store, "compare", monkeypatch)
    assert_clean(at)
    assert any("no baseline chosen" in i.value for i in at.info)


# ---- SQL console -------------------------------------------------------------------------------


def run_sql(at: AppTest, query: str) -> AppTest:
    at.text_area(key="sql_query").set_value(query)
    at.button[0].click()
    at.run()
    return at


def test_sql_console_counts_and_refuses_writes(sample_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(sample_store, "sql", monkeypatch)
    run = at.session_state["run"]
    assert_clean(run_sql(at, "SELECT count(*) AS n FROM events WHERE run = $run"))
    with open_store(sample_store) as store:
        expected = store.sql("SELECT sum(event_count) AS n FROM sources WHERE run = ?", [run]).to_pylist()[0]["n"]
    assert at.dataframe[-1].value["n"].tolist() == [expected]
    for query, message in [
        ("COPY (SELECT 1) TO 'x.csv'", "only SELECT"),
        ("ATTACH 'x.db'", "only SELECT"),
        ("INSTALL httpfs", "only SELECT"),
        ("SELECT * FROM read_csv('/etc/passwd')", "SQL error"),
        ("SELECT 1; SELECT 2", "exactly one"),
    ]:
        run_sql(at, query)
        assert not at.exception
        assert at.error and message in at.error[0].value, (query, [e.value for e in at.error])


def test_sql_console_caps_rows_and_time(sample_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(sample_store, "sql", monkeypatch)
    run_sql(at, "SELECT * FROM range(20000)")
    assert len(at.dataframe[-1].value) == 10_000
    assert any("cut at 10,000 rows" in c.value for c in at.caption)
    at.session_state["sql_time_limit_s"] = 0.5
    run_sql(at, "SELECT count(*) FROM range(1000000) a, range(1000000) b, range(1000) c")
    assert at.error and "limit" in at.error[0].value


# ---- bad stores and bad URLs -------------------------------------------------------------------


def _only_error(at: AppTest) -> str:
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.error) == 1
    return at.error[0].value


def test_missing_store_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "no such store" in _only_error(app_for(tmp_path / "nope", monkeypatch))


def test_empty_store_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "holds no runs" in _only_error(app_for(tmp_path, monkeypatch))


def test_newer_store_says_so(sample_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from stepscope.store.schema import SCHEMA_VERSION, SCHEMA_VERSION_KEY

    copy = tmp_path / "newer"
    shutil.copytree(sample_store, copy)
    part = next((copy / "sources").rglob("*.parquet"))
    table = pq.read_table(part)
    meta = {**table.schema.metadata, SCHEMA_VERSION_KEY: str(SCHEMA_VERSION + 1).encode()}
    pq.write_table(table.replace_schema_metadata(meta), part)
    assert "newer than this stepscope understands" in _only_error(app_for(copy, monkeypatch))


def test_query_params_cannot_leave_the_store(sample_store: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    with open_store(sample_store) as store:
        runs = store.sql("SELECT run FROM runs ORDER BY created_at, run").column("run").to_pylist()
    at = open_page(sample_store, "overview", monkeypatch, run="../../etc", baseline="/etc/passwd",
                   ranks="0,999", steps="x-y", store=str(tmp_path))
    assert_clean(at)
    assert at.session_state["run"] == runs[-1]  # unknown run ignored: the latest run is shown
    assert at.session_state["baseline"] == "(none)"
    assert at.query_params["run"] in (runs[-1], [runs[-1]])
    assert "store" not in at.query_params
    for steps in ("100-200", "5-2", "-3--1", "1,2,3"):
        assert_clean(open_page(sample_store, "overview", monkeypatch, steps=steps))


def test_overview_plots_every_timed_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the collector's step_times, the step-time chart's table holds every timed step."""
    import pyarrow as pa

    from stepscope.store.schema import STEP_TIMES
    from stepscope.store.writer import write_partition

    root = tmp_path / "s"
    report = ingest_paths([REPO / "sample_traces" / "cpu-transformer"], root, "cpu")
    source = report.stored[0].source
    rows = [{"source": source, "step": s, "start_ns": s * 10**8, "wall_ns": (50 + s) * 10**6, "gpu_ns": None,
             "profiled": s in (7, 8), "tokens": 1024, "samples": 4} for s in range(12)]
    write_partition(root, "step_times", "cpu", 0, source, pa.Table.from_pylist(rows, schema=STEP_TIMES))
    at = open_page(root, "overview", monkeypatch, opened=("step_time_over_run", "step_times_table"))
    assert_clean(at)
    shown = table_with(at, "step", "wall_ms", "profiled")
    assert sorted(shown["step"]) == list(range(12))
    assert sorted(shown["wall_ms"]) == [50.0 + s for s in range(12)]


def test_runs_page_lists_captures_next_to_the_schedule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with a scheduled window (steps 3-4) and a capture (steps 51-53) on both ranks: the
    Runs page lists both, the capture with the trigger its ``captures`` rows hold."""
    import pyarrow as pa

    from stepscope.store.schema import CAPTURES
    from stepscope.store.writer import write_partition
    from tests.conftest import write_trace

    def trace(path: Path, rank: int, steps: range) -> Path:
        events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "ts": 1000 * s,
                   "dur": 900, "pid": 1, "tid": 1} for s in steps]
        events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1000 * s + 10, "dur": 500,
                    "pid": 1, "tid": 1} for s in steps]
        return write_trace(path, events, distributedInfo={"rank": rank, "world_size": 2, "backend": "gloo"})

    root = tmp_path / "store"
    for folder, steps in (("schedule", range(3, 5)), ("capture", range(51, 54))):
        files = [trace(tmp_path / folder / f"rank{r}.json", r, steps) for r in (0, 1)]
        report = ingest_paths(files, root, "watched")
        assert report.ok, report.errors
        if folder == "capture":
            for stored in report.stored:
                row = {"source": stored.source, "first_step": 51, "last_step": 53, "trigger_kind": "slow_step",
                       "trigger_rank": 1, "trigger_step": 40, "observed_ns": 187_500_000,
                       "reference_ns": 37_500_000, "agreed_step": 49}
                write_partition(root, "captures", "watched", stored.rank, stored.source,
                                pa.Table.from_pylist([row], schema=CAPTURES))
    at = open_page(root, "runs", monkeypatch)
    assert_clean(at)
    shown = table_with(at, "kind", "first_step", "trigger_rank").to_dict("records")
    assert [(r["kind"], r["first_step"], r["last_step"], r["ranks"]) for r in shown] == [
        ("schedule", 3, 4, 2), ("capture", 51, 53, 2)]
    capture = shown[1]
    assert (capture["trigger_kind"], capture["trigger_rank"], capture["trigger_step"]) == ("slow_step", 1, 40)
    assert (capture["observed_ms"], capture["reference_ms"], capture["slow_ratio"]) == (187.5, 37.5, 5.0)
    assert capture["latency_steps"] == 11


@pytest.mark.shared
def test_overview_of_a_run_without_steps_states_the_whole_trace(ingested, monkeypatch: pytest.MonkeyPatch) -> None:
    """param/resnet_kineto has no ProfilerStep: no green "No finding", but the summary's
    whole-trace verdict (its parts over the trace, idle included) and how to mark steps."""
    store_root = ingested("param/resnet_kineto.json.gz")
    at = open_page(store_root, "overview", monkeypatch)
    assert_clean(at)
    with open_store(store_root) as store:
        whole = build_summary(store, "t")["verdict"]["whole_trace"]
    assert any(m.value.startswith(f"**Whole trace**: {whole['statement']}") for m in at.markdown)
    assert [(m.label, m.value) for m in at.metric] == [(b["label"], duration(b["ns"])) for b in whole["bound_by"]]
    assert any(c.value == whole["how_to_mark_steps"] for c in at.caption)
    assert not at.success  # never "No finding" on a trace whose steps were not marked
