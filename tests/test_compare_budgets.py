"""Budgets that do not flake and budgets as advertised: absolute floors, the run-to-run noise
margin and its grey zone, peak memory judged against the spread between runs, bus- and copy-bandwidth budgets (a drop beyond threshold and
spread fails), and the "no baseline yet" outcome of the CI life-cycle."""

from __future__ import annotations

import json
import statistics
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

from stepscope.analysis.absent import Absent
from stepscope.analysis.compare import compare_profiles, merge_budgets, parse_budgets, verdict
from stepscope.analysis.compare.budgets import BUDGET_METRICS, floors, parse_floor
from stepscope.analysis.compare.metrics import RunFacts, RunProfile
from stepscope.cli import main
from stepscope.errors import UsageError
from tests import rawcalc, trace_edits
from tests.conftest import REPO, load_raw

MIB = 2**20
NCCL = "hta/nccl_parser_config/nccl_data.json.gz"
CONTROL = "hta/trace_diff/control/control.json.gz"
SAMPLE = REPO / "sample_traces" / "cpu-transformer"


def _profile(step_ms: list[float], peaks: list[float] | None = None) -> RunProfile:
    """A hand-made run: step times (ms) and per-step memory peaks; every other metric absent."""
    absent = Absent("not part of this test")
    samples = {m: absent for m in BUDGET_METRICS if m != "peak_memory"}
    samples["step_time"] = [v * 1e6 for v in step_ms]
    facts = RunFacts("r", None, (0,), 1, None, (), None, None, len(step_ms))
    return RunProfile(facts, "step_times.cpu_ns", samples, peaks if peaks is not None else absent, "cpu", absent,
                      absent, absent, absent)


def _result(base: RunProfile | list[RunProfile], cand: RunProfile | list[RunProfile], budget: str,
            floor_texts: tuple[str, ...] = ()):
    [result] = verdict(compare_profiles(base, cand), parse_budgets([budget]), floors(floor_texts)).results
    return result


BASE_MS = [1.00, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.00]


def test_a_change_below_the_floor_never_fails() -> None:
    base = _profile(BASE_MS)
    slower = _profile([v + 0.2 for v in BASE_MS])  # +20%, every step: far beyond the spread
    result = _result(base, slower, "step_time:+10%")
    assert (result.status, result.decided_by, result.floor) == ("pass", "floor", 500_000)
    assert "within the 500 us floor" in result.message
    # one run a side: the noise is assumed (5 %), so +20 % is over +10 % by more than it
    strict = _result(base, slower, "step_time:+10%", ("step_time:0.1ms",))
    assert (strict.status, strict.decided_by) == ("fail", "noise")
    assert "noise not measured (1 baseline run, 1 candidate run): assumed +-50.0 us" in strict.message
    much_slower = _result(base, _profile([v + 0.6 for v in BASE_MS]), "step_time:+10%")
    assert (much_slower.status, much_slower.decided_by) == ("fail", "noise")


def _runs(*medians_ms: float) -> list[RunProfile]:
    """One run per median: the steps of BASE_MS scaled to it."""
    return [_profile([v * m for v in BASE_MS]) for m in medians_ms]


def test_the_noise_between_runs_sets_the_grey_zone() -> None:
    """Baseline runs 10, 11, 12 ms: +-2 ms of noise around 11 ms, budget +10 % (1.1 ms)."""
    base = _runs(10.0, 11.0, 12.0)
    ok = _result(base, _runs(8.5), "step_time:+10%")  # -2.5 ms <= 1.1 - 2 ms
    assert (ok.status, ok.decided_by) == ("pass", "threshold")
    grey = _result(base, _runs(13.0), "step_time:+10%")  # +2 ms: inside 1.1 +- 2 ms
    assert (grey.status, grey.decided_by) == ("inconclusive", "grey_zone")
    assert "run-to-run noise +-2.00 ms (3 baseline runs, 1 candidate run)" in grey.message
    assert "the lowest 3 vs 1 runs can give is 0.25" in grey.message  # no confidence claimed
    slow = _result(base, _runs(14.5), "step_time:+10%")  # +3.5 ms > 1.1 + 2 ms
    assert (slow.status, slow.decided_by) == ("fail", "noise")
    result = verdict(compare_profiles(base, _runs(13.0)), parse_budgets(["step_time:+10%"]), floors())
    assert result.status == "inconclusive" and result.exit_code == 4
    # the candidate's own reruns count as noise too: 3 quiet baseline runs, a candidate that moves
    quiet = _runs(11.0, 11.0, 11.0)
    assert _result(quiet, _runs(12.5), "step_time:+10%").decided_by == "noise"  # +1.4 ms > 1.1 + 0.22
    assert _result(quiet, _runs(12.5, 11.0, 13.0), "step_time:+10%").decided_by == "grey_zone"  # +-2 ms


def test_floors_parse_and_default_per_dimension() -> None:
    assert parse_floor("peak_memory:64MiB") == ("peak_memory", 64 * MIB)
    table = floors(["busbw:2GB/s"])
    assert (table["step_time"], table["comm_exposed"], table["peak_memory"], table["busbw"]) == (
        500_000, 500_000, 16 * MIB, 2.0)
    with pytest.raises(UsageError, match="unit 'MiB' does not fit step_time"):
        parse_floor("step_time:3MiB")
    with pytest.raises(UsageError, match="unknown metric"):
        parse_floor("speed:1ms")


def test_peak_memory_is_judged_over_per_step_peaks() -> None:
    steps = [1.0] * 8
    base_peaks = [100 * MIB + i * 1024 for i in range(8)]
    base = _profile(steps, base_peaks)
    # One step peaks twice as high: the run's peak is +100%; a peak the baseline's runs reach too
    # (their highest peaks spread 100-200 MiB) is within their noise.
    spiky = _profile(steps, [*base_peaks[:-1], 200 * MIB])
    assert _result(base, spiky, "peak_memory:+10%").status == "fail"
    within = _result([base, spiky, base], spiky, "peak_memory:+10%")
    assert within.exceeded and (within.status, within.decided_by) == ("inconclusive", "grey_zone")
    # Every step holds 64 MiB more: beyond threshold and floor; memory has no assumed noise.
    grown = _result(base, _profile(steps, [p + 64 * MIB for p in base_peaks]), "peak_memory:+10%")
    assert (grown.status, grown.decided_by) == ("fail", "noise")
    assert "peak memory (cpu): 100 MiB -> 164 MiB" in grown.message
    # The CPU case: 662 KiB against 1.17 MiB, as allocator caching moves it between runs.
    small = _result(_profile(steps, [662 * 1024] * 8), _profile(steps, [1.17 * MIB] * 8), "peak_memory:+10%")
    assert (small.status, small.decided_by) == ("pass", "floor")


def test_a_markers_budget_replaces_the_defaults() -> None:
    assert [b.text for b in merge_budgets([], ["step_time:+5%"], defaults=False)] == ["step_time:+5%"]
    assert [b.text for b in merge_budgets(["comm_exposed:+2ms"], ["step_time:+5%"])] == [
        "step_time:+5%", "peak_memory:+10%", "comm_exposed:+2ms"]


def _per_step_busbw(doc: dict) -> dict[int, float]:
    """Independent count from the raw JSON: per step, sum over the nccl kernels of bytes x bus
    factor over their summed time. Every collective of this trace runs in a group of 2, where
    nccl-tests' factor is 1 for all-reduce (2(n-1)/n) and broadcast alike."""
    step_of = rawcalc.gpu_steps(doc)
    moved: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for k in rawcalc.comm_kernels(doc):
        args = k["args"]
        if args["correlation"] not in step_of:
            continue
        assert args["Group size"] == 2
        step = step_of[args["correlation"]]
        moved[step][0] += {"Float": 4, "Long": 8}[args["dtype"]] * max(args["In msg nelems"], args["Out msg nelems"])
        moved[step][1] += round(k["dur"] * 1000)
    return {step: b / ns for step, (b, ns) in sorted(moved.items())}


@pytest.mark.shared
def test_a_bus_bandwidth_drop_fails(tmp_path: Path, shared_traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stepscope.store.ingest import ingest_paths

    doc = trace_edits.load(shared_traces / NCCL)
    trace_edits.slow_kernel(doc, "ncclKernel_", 2)  # every collective twice as long: half the bandwidth
    slowed = trace_edits.save(doc, tmp_path / "slow" / "rank0.json.gz")
    store = tmp_path / "store"
    assert ingest_paths([shared_traces / NCCL], store, "base").ok and ingest_paths([slowed], store, "slow").ok
    # Three steps a side: the smallest one-sided p-value is 1/20, so the noise test needs alpha 0.1.
    code = main(["compare", "base", "slow", "--store", str(store), "--fail-on", "busbw:-10%", "--alpha", "0.1",
                 "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["verdict"]["status"] == "regression"
    budget = next(b for b in out["budgets"] if b["metric"] == "busbw")
    assert (budget["status"], budget["decided_by"]) == ("fail", "noise")
    assert budget["message"].startswith("bus bandwidth:") and "-50.0%" in budget["message"]
    expected = list(_per_step_busbw(load_raw(shared_traces / NCCL)).values())
    metric = next(m for m in out["metrics"] if m["metric"] == "busbw")
    assert metric["baseline"]["median"] == pytest.approx(statistics.median(expected), rel=1e-12)
    assert metric["candidate"]["median"] == pytest.approx(statistics.median(expected) / 2, rel=1e-12)
    # The same run against itself passes the same budget.
    assert main(["compare", "base", "base", "--store", str(store), "--fail-on", "busbw:-10%", "--alpha", "0.1"]) == 0


@pytest.mark.shared
def test_a_copy_bandwidth_drop_fails(tmp_path: Path, shared_traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stepscope.store.ingest import ingest_paths

    doc = trace_edits.load(shared_traces / CONTROL)
    trace_edits.slow_kernel(doc, "Memcpy HtoD", 2, cat="gpu_memcpy")
    slowed = trace_edits.save(doc, tmp_path / "slow" / "rank3.json.gz")
    store = tmp_path / "store"
    assert ingest_paths([shared_traces / CONTROL], store, "base").ok and ingest_paths([slowed], store, "slow").ok
    code = main(["compare", "base", "slow", "--store", str(store), "--fail-on", "copy_bandwidth_h2d:-10%",
                 "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    budget = next(b for b in out["budgets"] if b["metric"] == "copy_bandwidth_h2d")
    assert code == 1 and (budget["status"], budget["decided_by"]) == ("fail", "noise")
    # Independent count: per step, the H2D copies' bytes over their time, from the raw JSON.
    raw = load_raw(shared_traces / CONTROL)
    step_of = rawcalc.gpu_steps(raw)
    per_step: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in raw["traceEvents"]:
        if e.get("cat") == "gpu_memcpy" and "HtoD" in e["name"] and e["args"]["correlation"] in step_of:
            total = per_step[step_of[e["args"]["correlation"]]]
            total[0] += e["args"]["bytes"]
            total[1] += round(e["dur"] * 1000)
    expected = statistics.median(b / ns for b, ns in per_step.values())
    metric = next(m for m in out["metrics"] if m["metric"] == "copy_bandwidth_h2d")
    assert metric["baseline"]["median"] == pytest.approx(expected, rel=1e-9)
    assert metric["candidate"]["median"] == pytest.approx(expected / 2, rel=1e-9)


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stepscope.store.ingest import ingest_paths

    store = tmp_path_factory.mktemp("nobase") / "store"
    assert ingest_paths([SAMPLE], store, "run-1").ok
    return store


@pytest.mark.parametrize(("choice", "code"), [("pass", 0), ("fail", 1), ("inconclusive", 4)])
def test_no_baseline_yet_is_its_own_outcome_with_every_report(
        sample_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], choice: str, code: int) -> None:
    md, js, junit = tmp_path / "summary.md", tmp_path / "compare.json", tmp_path / "compare.xml"
    args = ["compare", "main", "run-1", "--store", str(sample_store), "--markdown", str(md), "--json", str(js),
            "--junit", str(junit)]
    assert main([*args, "--missing-baseline", choice]) == code
    assert capsys.readouterr().out.startswith("NO_BASELINE: baseline none yet -> candidate run-1")
    doc = json.loads(js.read_text())
    assert doc["verdict"] == {"status": "no_baseline", "exit_code": code, "missing_baseline": choice,
                              "reasons": [doc["absent_reasons"]["baseline"]]}
    assert doc["baseline"] is None and "no baseline yet: main" in doc["absent_reasons"]["baseline"]
    assert doc["candidate"]["run"] == "run-1"
    step = next(m for m in doc["metrics"] if m["metric"] == "step_time")
    assert step["candidate"]["n"] == 2 and step["baseline"] is None  # the candidate's own figures
    assert {b["status"] for b in doc["budgets"]} == {"not_available"}
    text = md.read_text()
    assert text.startswith("## stepscope compare: NO_BASELINE") and "No baseline yet" in text
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    assert len(cases) == 2
    outcome = "failure" if choice == "fail" else "skipped"
    assert all(c.find(outcome) is not None and "no baseline yet" in c.find(outcome).get("message") for c in cases)


def test_a_mistyped_candidate_is_still_a_usage_error(sample_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "run-1", "run-2", "--store", str(sample_store)]) == 2
    assert "run-2: not a baseline name or run" in capsys.readouterr().err


def test_report_renders_the_run_alone_without_its_baseline(sample_store: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("vl_convert")
    out = tmp_path / "report.html"
    assert main(["report", "run-1", "--store", str(sample_store), "--baseline", "main", "--out", str(out)]) == 0
    page = out.read_text()
    assert "not compared: no baseline yet: main" in page
    # the run's own breakdown (a CPU run's host parts), and no baseline-against-candidate chart
    assert page.count("vegaEmbed('#chart") == 1 and "Where each step" in page and "Baseline and candidate" not in page
    assert "stepscope report: run-1" in page
    [bundle] = (sample_store / "cache" / "report-js").glob("*.js")  # kept for the next report
    assert bundle.read_text(encoding="utf-8") in page
