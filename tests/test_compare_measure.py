"""What a CPU run is judged on and against what: the step timer's CPU time per step, baselines
that keep their last runs, host parts in the comparison, and comparability checks that check CPU
runs instead of saying "not checked"."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from stepscope.analysis.absent import Absent
from stepscope.analysis.compare import compare_profiles, parse_budgets, verdict
from stepscope.analysis.compare.budgets import BUDGET_METRICS, floors
from stepscope.analysis.compare.metrics import NamedStat, RunFacts, RunProfile
from stepscope.cli import main
from tests.conftest import REPO

SAMPLE = REPO / "sample_traces" / "cpu-transformer"


def test_the_step_timer_records_the_threads_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in clocks: wall time advances 10 ms a step, the thread's CPU time 4 ms then 6 ms
    (the thread waited for a core the rest of the time); each step gets its own CPU time."""
    from stepscope.collector import step_timer
    from stepscope.collector.step_timer import StepTimer

    walls, cpus = iter(range(0, 10**9, 10_000_000)), iter([0, 4_000_000, 10_000_000])
    monkeypatch.setattr(step_timer.time, "perf_counter_ns", lambda: next(walls))
    monkeypatch.setattr(step_timer.time, "thread_time_ns", lambda: next(cpus))
    timer = StepTimer(use_cuda=False)
    timer.begin()
    timer.end_step(0, profiled=False)
    timer.end_step(1, profiled=True)
    rows = timer.snapshot().table("s").to_pylist()
    assert [(r["wall_ns"], r["cpu_ns"], r["gpu_ns"]) for r in rows] == [
        (10_000_000, 4_000_000, None), (10_000_000, 6_000_000, None)]


def test_a_baseline_keeps_its_last_runs_and_an_accepted_run_alone(tmp_path: Path) -> None:
    from stepscope.store.baselines import baseline_run, baseline_runs, protected_runs, set_baseline

    for run in ("a", "b", "c", "d"):
        set_baseline(tmp_path, "main", run)
    assert baseline_runs(tmp_path, "main") == ["b", "c", "d"] and baseline_run(tmp_path, "main") == "d"
    set_baseline(tmp_path, "main", "c")  # again: moves to the newest, not twice
    assert baseline_runs(tmp_path, "main") == ["b", "d", "c"]
    set_baseline(tmp_path, "main", "e", keep=2)
    assert baseline_runs(tmp_path, "main") == ["c", "e"]
    set_baseline(tmp_path, "main", "accepted", append=False)
    assert baseline_runs(tmp_path, "main") == ["accepted"]
    set_baseline(tmp_path, "rel", "x")
    assert protected_runs(tmp_path) == {"accepted", "x"}
    history = json.loads((tmp_path / "baselines.json").read_text())["baselines"]["main"]["history"]
    assert [h["run"] for h in history] == ["a", "b", "c", "d", "c", "e"]


def test_an_old_baselines_file_reads_as_its_one_run(tmp_path: Path) -> None:
    from stepscope.store.baselines import baseline_runs, set_baseline

    (tmp_path / "baselines.json").write_text(json.dumps(
        {"version": 1, "baselines": {"main": {"run": "old", "set_at": "x", "reason": None, "history": []}}}))
    assert baseline_runs(tmp_path, "main") == ["old"]
    set_baseline(tmp_path, "main", "new")
    assert baseline_runs(tmp_path, "main") == ["old", "new"]


def _cpu_run(run: str, step_ms: float, ops: dict[str, tuple[float, float]], *, threads: int | None = 1) -> RunProfile:
    """A hand-made CPU run: steps of ``step_ms``, CPU ops name -> (ms per step, calls per step)."""
    absent = Absent("not part of this test")
    samples = {m: absent for m in BUDGET_METRICS if m != "peak_memory"}
    samples["step_time"] = [step_ms * 1e6] * 5
    facts = RunFacts(run, None, (0,), None, None, (), None, None, 5, threads)
    cpu_ops = [NamedStat(name, ms * 1e6, calls) for name, (ms, calls) in ops.items()]
    return RunProfile(facts, "step_times.cpu_ns", samples, absent, None, Absent("no GPU kernels in this run's traces"),
                      absent, absent, Absent("no communication kernels inside steps"), cpu_ops)


MLP = {"aten::addmm": (2.0, 3.0), "aten::relu": (0.2, 2.0), "aten::mm": (1.5, 4.0), "Optimizer.step#SGD.step": (0.5, 1.0)}
CONV = {"aten::conv2d": (3.0, 2.0), "aten::batch_norm": (1.0, 2.0), "aten::max_pool2d": (0.4, 1.0)}


def _checks(base: RunProfile, cand: RunProfile) -> dict[str, bool | None]:
    return {c.check: c.ok for c in compare_profiles(base, cand).checks}


def test_cpu_runs_are_checked_not_skipped() -> None:
    same = _checks(_cpu_run("a", 5, MLP), _cpu_run("b", 20, MLP))  # 4x slower, the same code
    assert same == {"gpu_model": True, "gpu_count": True, "world_size": True, "ranks": True,
                    "process_groups": None, "threads": True, "step_structure": True, "top_kernels": None,
                    "top_ops": True}
    other = compare_profiles(_cpu_run("a", 5, MLP), _cpu_run("b", 5, CONV))
    assert {c.check: c.ok for c in other.checks}["top_ops"] is False
    assert any("top CPU ops differ: only 0 of the baseline's top 4 CPU ops" in r for r in other.not_comparable_reasons)
    result = verdict(other, parse_budgets(["step_time:+10%"]), floors())
    assert result.status == "inconclusive" and result.exit_code == 4
    twice = {**MLP, "aten::mm": (3.0, 8.0)}  # two micro-batches a step: another step structure
    assert _checks(_cpu_run("a", 5, MLP), _cpu_run("b", 10, twice))["step_structure"] is False
    assert _checks(_cpu_run("a", 5, MLP), _cpu_run("b", 5, MLP, threads=2))["threads"] is False


@pytest.fixture(scope="module")
def cpu_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CPU sample run, ingested twice into one store."""
    from stepscope.store.ingest import ingest_paths

    store = tmp_path_factory.mktemp("cpu") / "store"
    for run in ("base", "cand"):
        assert ingest_paths([SAMPLE], store, run).ok
    return store


def test_a_cpu_run_is_compared_in_full(cpu_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Host parts compared, every CPU check checked; the parts' values are the host breakdown's
    medians per step (docs/COMPARE_JSON.md)."""
    from stepscope.analysis.breakdown import host_breakdown
    from stepscope.store import open_store
    from stepscope.store.rankstats.parts import HOST

    code = main(["compare", "base", "cand", "--store", str(cpu_store), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["verdict"]["status"] == "pass"
    checks = {c["check"]: c["ok"] for c in doc["comparability"]["checks"]}
    assert checks["world_size"] is True and checks["step_structure"] is True and checks["top_ops"] is True
    assert checks["threads"] is None  # an ingested trace: the collector did not record them
    metrics = {m["metric"]: m for m in doc["metrics"]}
    with open_store(cpu_store) as store:
        host = host_breakdown(store, "base")
    assert not isinstance(host, Absent)
    for metric, part in HOST.budget_metrics().items():
        expected = statistics.median(host.column(part.column).to_pylist())
        assert metrics[metric]["baseline"]["median"] == pytest.approx(expected) and metrics[metric]["delta"] == 0
    assert metrics["compute_ops"]["baseline"]["median"] > 0
    assert metrics["compute"]["baseline"] is None  # no GPU: the GPU parts abstain, with the reason
