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
from stepscope.analysis.compare.gate import evaluate
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


def _loaded_run(run: str, cpu_ms: float, wall_ms: float) -> RunProfile:
    """A hand-made CPU run whose steps used ``cpu_ms`` of the thread's CPU time and took
    ``wall_ms`` (the rest it waited for a core)."""
    profile = _cpu_run(run, cpu_ms, MLP)
    profile.samples["wall_time"] = [wall_ms * 1e6] * 5
    return profile


BASE = [_loaded_run("b1", 10.0, 10.0), _loaded_run("b2", 10.2, 10.2), _loaded_run("b3", 10.4, 10.4)]
"""Three baseline runs whose thread never waited for a core (wall = CPU time): step time 10.2 ms,
noise 0.4 ms."""


def _judge(cands: list[RunProfile], base: list[RunProfile] = BASE) -> tuple[str, list[str], dict[str, object]]:
    comparison = compare_profiles(base, cands)
    result = verdict(comparison, parse_budgets(["step_time:+10%"]), floors())
    noise = comparison.metric("step_time").noise
    assert noise is not None
    return result.status, result.reasons, noise.to_json()


def test_a_loaded_run_is_judged_within_what_load_can_do_to_cpu_time() -> None:
    """Unloaded runs: the change lies within +-0.4 ms of the measured one. +22.5 % (12.5 ms
    against 10.2 ms) is at least 12.1 - 10.2 = 1.9 ms, over +10 % (1.02 ms): a regression;
    +1 % is at most 10.7 - 10.2 = 0.5 ms: a pass. A candidate whose steps took 2x their CPU time
    in wall time may carry up to 90 % more CPU time, never less: 12.5 ms lies between 12.1 / 1.9
    and 12.9, which allows both a pass and a regression: inconclusive. 4x (40.8 ms) is at least
    40.4 / 1.9 = 21.3 ms: still a regression. Unchanged code inflated 1.86x by load is never one;
    a loaded candidate that measures no more than the baseline (10.3 ms, at most 10.7) passes:
    load cannot have hidden a slowdown."""
    status, reasons, noise = _judge([_loaded_run(f"c{i}", 12.5, 12.5) for i in range(3)])
    assert status == "regression" and noise["margin"] == pytest.approx(0.4e6)
    unrecorded = [None, None, None]  # hand-made runs without step_times.preemptions: judged on their load
    assert noise["load"] == {"baseline": [1.0, 1.0, 1.0], "candidate": [1.0, 1.0, 1.0], "worst": 1.0,
                             "inflation": 0.0, "baseline_inflation": 0.0, "candidate_inflation": 0.0,
                             "baseline_busy": False, "by_preemption": False, "baseline_preemption": unrecorded,
                             "candidate_preemption": unrecorded, "ceiling": 6.0, "baseline_too_loaded": False,
                             "candidate_too_loaded": False}
    assert "the change lies between +18.6% and +26.5%" in reasons[0]
    assert _judge([_loaded_run(f"c{i}", 10.3, 10.3) for i in range(3)])[0] == "pass"

    status, reasons, noise = _judge([_loaded_run(f"c{i}", 12.5, 25.0) for i in range(3)])
    assert status == "inconclusive", reasons
    assert noise["load"]["candidate_inflation"] == pytest.approx(0.9) and noise["load"]["baseline_inflation"] == 0
    assert "the change lies between -37.6% and +26.5%" in reasons[0]  # 12.1 / 1.9 = 6.37; 12.9
    assert "the runs were loaded (the most loaded one's steps took 2.00x their CPU time in wall time, the " \
           "baseline's 1.00-1.00x), which inflates CPU time: the candidate's up to 90% too high" in reasons[0]
    assert _judge([_loaded_run(f"c{i}", 10.3, 20.6) for i in range(3)])[0] == "pass"

    assert _judge([_loaded_run(f"c{i}", 40.8, 81.6) for i in range(3)])[0] == "regression"  # 4x, loaded
    assert _judge([_loaded_run(f"c{i}", 10.2 * 1.86, 40.0) for i in range(3)])[0] == "inconclusive"


def _preempted_run(run: str, cpu_ms: list[float], wall_ms: list[float], switches: list[int]) -> RunProfile:
    """A hand-made CPU run that recorded each step's preemptions: step i used ``cpu_ms[i]`` of
    CPU time, took ``wall_ms[i]`` and lost its core ``switches[i]`` times."""
    profile = _cpu_run(run, 0.0, MLP)
    profile.samples.update({"step_time": [v * 1e6 for v in cpu_ms], "wall_time": [v * 1e6 for v in wall_ms],
                            "preemptions": [float(n) for n in switches]})
    return profile


def test_a_runs_inflation_is_allowed_on_its_preempted_steps_only() -> None:
    """Five steps of 10 ms CPU time in 20 ms wall time: if no step lost its core, the thread
    waited of its own accord (the GIL, a lock) and its CPU time is its code's: no inflation.
    Every step preempted that long: the run-level 90 %. Two of five (the two largest values):
    the deflated values 10, 10, 10, 11/1.9, 12/1.9 have the median 10: none either. The last three
    (the median's among them): 10, 10, 10/1.9, 11/1.9, 12/1.9 have the median 12/1.9: 10 / (12/1.9)
    - 1 = 58 %. Preempted briefly (10.5 ms wall, load
    1.05): 9 % (inflation_at(1.05) = 0.9 * 0.05 / 0.5)."""
    from stepscope.analysis.compare.stats import LOAD_INFLATION, preemption

    cpu, wall = [10.0] * 5, [20.0] * 5
    assert preemption(cpu, wall, [0] * 5).inflation == 0.0
    assert preemption(cpu, wall, [1, 3, 1, 2, 1]).inflation == pytest.approx(LOAD_INFLATION)
    assert preemption(cpu, wall, [1, 3, 1, 2, 1]).preempted == 5
    tail = [10.0, 10.0, 10.0, 11.0, 12.0]
    assert preemption(tail, [20.0] * 5, [0, 0, 0, 1, 1]).inflation == 0.0
    assert preemption(tail, [20.0] * 5, [0, 0, 1, 1, 1]).inflation == pytest.approx(10 / (12 / 1.9) - 1)
    assert preemption(cpu, [10.5] * 5, [1] * 5).inflation == pytest.approx(0.09)


def test_a_candidate_that_waited_without_being_preempted_is_judged_unloaded() -> None:
    """The candidate of test_a_loaded_run_is_judged_within_what_load_can_do_to_cpu_time (12.5 ms
    of CPU time in 25 ms of wall time, +22.5 %): on its load alone, inconclusive; with steps that
    no other process preempted (its waits were its own), the regression its CPU time shows. With
    every step preempted, inconclusive as before: the preempted steps keep the load's allowance.
    A 4x candidate preempted on every step is still a regression."""
    waited = [_preempted_run(f"c{i}", [12.5] * 5, [25.0] * 5, [0] * 5) for i in range(3)]
    status, reasons, noise = _judge(waited)
    assert status == "regression", reasons
    assert noise["load"]["candidate_inflation"] == 0 and noise["load"]["by_preemption"] is False  # BASE: no counts
    assert noise["load"]["candidate_preemption"] == [{"steps": 5, "preempted": 0, "inflation": 0.0, "load": 1.0,
                                                          "others": None}] * 3

    preempted = [_preempted_run(f"c{i}", [12.5] * 5, [25.0] * 5, [2] * 5) for i in range(3)]
    status, reasons, noise = _judge(preempted)
    assert status == "inconclusive" and noise["load"]["candidate_inflation"] == pytest.approx(0.9), reasons
    assert "allowed on the preempted steps only (15 of the candidate's 15 steps were preempted)" in reasons[0]
    assert _judge([_preempted_run(f"c{i}", [40.8] * 5, [81.6] * 5, [4] * 5) for i in range(3)])[0] == "regression"


def test_a_loaded_baseline_that_counted_no_preemption_allows_no_inflation() -> None:
    """:data:`BUSY_BASE`'s values (13.26 ms, steps 3x their CPU time in wall time) against a quiet
    13.4 ms: with every step preempted, the baseline's code may be as fast as 13.26 / 1.9 ms, so
    the change may be +92 %: inconclusive, as for BUSY_BASE itself. With no step preempted (its
    waits were its own) its CPU time is its code's: +1 %, at most (13.4 + 0.52) / 13.26 = +5 %: a
    pass."""
    cand = [_loaded_run(f"c{i}", 13.4, 13.4) for i in range(3)]

    def base(switches: int) -> list[RunProfile]:
        return [_preempted_run(f"b{i}", [v] * 5, [3 * v] * 5, [switches] * 5)
                for i, v in enumerate((13.0, 13.26, 13.52))]

    status, reasons, noise = _judge(cand, base(1))
    assert status == "inconclusive" and noise["load"]["baseline_inflation"] == pytest.approx(0.9), reasons
    status, reasons, noise = _judge(cand, base(0))
    assert status == "pass" and noise["load"]["baseline_inflation"] == 0, reasons


BUSY_BASE = [_loaded_run("b1", 13.0, 39.0), _loaded_run("b2", 13.26, 39.78), _loaded_run("b3", 13.52, 40.56)]
"""A baseline recorded at load 3 (step time 13.26 ms, spread 0.52 ms, all of it within what load
can do to each run, so the margin is the 2 % floor, 0.265 ms): its true CPU time may be as low as
13.26 / 1.9 = 6.98 ms."""


def test_a_loaded_baseline_widens_only_the_upper_bound() -> None:
    """Against :data:`BUSY_BASE`, quiet candidates: 13.4 ms (a 1.3x slowdown of 10.3 ms, measured
    in a quieter spell) allows -3.9 % to +92 %: never a pass; 7.13 ms (the baseline's own code,
    quiet) is at most (7.13 + 0.265) * 1.9 = 14.05 ms, +6 %: a pass; 21.4 ms (3x the quiet code)
    is at least 21.4 - 0.265 = 21.1 ms, +59 %: a regression (with the load widening both bounds,
    (21.4 - 0.265) / 1.9 = 11.1 ms allowed a pass: inconclusive)."""
    status, reasons, noise = _judge([_loaded_run(f"c{i}", 13.4, 13.4) for i in range(3)], BUSY_BASE)
    assert status == "inconclusive" and noise["load"]["worst"] == pytest.approx(3.0), reasons
    assert noise["load"]["baseline_inflation"] == pytest.approx(0.9) and noise["load"]["candidate_inflation"] == 0
    assert noise["spread"] == pytest.approx(0.52e6) and noise["unexplained_spread"] == 0
    assert noise["margin"] == pytest.approx(0.02 * 13.26e6)
    assert _judge([_loaded_run(f"c{i}", 7.13, 7.13) for i in range(3)], BUSY_BASE)[0] == "pass"
    status, reasons, _ = _judge([_loaded_run(f"c{i}", 21.4, 21.4) for i in range(3)], BUSY_BASE)
    assert status == "regression" and "the change lies between +59.4%" in reasons[0], reasons


SPREAD_BY_LOAD = [_loaded_run("b1", 5.5, 11.0), _loaded_run("b2", 7.11, 28.4), _loaded_run("b3", 9.9, 59.4)]
"""A baseline saved in a busy spell, as the pytest plugin's was on this project's 2-core machine:
every run loaded past 1.5 (each may be up to 90 % too high), the runs 4.4 ms apart (62 % of their
median 7.11 ms), each one's interval [value / 1.9, value] overlapping the others'."""


def test_a_spread_that_the_load_explains_does_not_hide_a_slowdown() -> None:
    """Load only inflates, and each loaded run is already allowed its whole inflation: runs that a
    busy spell inflated by different amounts agree once that is allowed for (5.5 >= 9.9 / 1.9), so
    their 4.4 ms range is not noise on top of the allowance: the margin is the 2 % floor. A 4x
    slowdown that the load compressed to 2.3x (16.4 ms, itself loaded: at least (16.4 - 0.14) /
    1.9 = 8.56 ms, +20 %) is then a regression; with the plain range as the margin it was (16.4 -
    4.4) / 1.9 = 6.3 ms at least, -11 %: inconclusive (bench_gate's two missed 4x slowdowns).
    Unchanged code measured as loaded (7.0 ms) stays inconclusive, never a regression."""
    loaded_4x = [_preempted_run(f"c{i}", [16.4] * 5, [65.6] * 5, [5] * 5) for i in range(3)]
    status, reasons, noise = _judge(loaded_4x, SPREAD_BY_LOAD)
    assert status == "regression", reasons
    assert noise["spread"] == pytest.approx(4.4e6) and noise["unexplained_spread"] == 0
    unchanged = [_preempted_run(f"c{i}", [v] * 5, [4 * v] * 5, [2] * 5) for i, v in enumerate((5.0, 7.0, 12.0))]
    assert _judge(unchanged, SPREAD_BY_LOAD)[0] == "inconclusive"


def test_a_spread_beyond_what_the_load_explains_is_the_noise() -> None:
    """Unloaded runs: nothing explains their spread, which is the margin as before (the range,
    0.4 ms for :data:`BASE`). Loaded runs whose intervals do not overlap (12 ms at a load that
    allows 90 %: 6.3 ms at least, above the 5 ms run) are apart by more than load does: the
    gap, 6.3 - 5.0 = 1.3 ms, is noise the margin keeps. More runs that the load explains (the
    pytest plugin's re-runs of a grey result) leave the margin as it was."""
    assert _judge([_loaded_run(f"c{i}", 10.3, 10.3) for i in range(3)])[2]["margin"] == pytest.approx(0.4e6)
    apart = [_loaded_run("c1", 5.0, 5.0), _loaded_run("c2", 8.0, 16.0), _loaded_run("c3", 12.0, 24.0)]
    noise = _judge(apart)[2]
    assert noise["unexplained_spread"] == pytest.approx(12.0e6 / 1.9 - 5.0e6)
    assert noise["margin"] == pytest.approx(12.0e6 / 1.9 - 5.0e6)
    more = [*apart, _loaded_run("c4", 7.0, 14.0), _loaded_run("c5", 9.0, 18.0)]
    assert _judge(more)[2]["margin"] == pytest.approx(noise["margin"])


def test_one_candidate_run_inflated_beyond_its_allowance_does_not_hide_a_slowdown() -> None:
    """A run that waited for no core, yet took twice the CPU time of its twins (a busy neighbour
    that preempted nothing), is unexplained spread: 80 - 40 = 40 ms of margin on a 41 ms median
    put the lower bound below the baseline, so a 4x slowdown was "cannot tell", and so would any
    slowdown be, whatever its size. Load only inflates: the lowest run, less the baseline's
    relative noise (0.4 / 10.2 ms), still shows at least 40 * (1 - 0.039) = 38.4 ms. Unchanged
    code with the same one inflated run stays inconclusive, never a regression."""
    slower = [_loaded_run("c1", 40.0, 40.0), _loaded_run("c2", 41.0, 41.0), _loaded_run("c3", 80.0, 80.0)]
    status, reasons, noise = _judge(slower)
    assert noise["margin"] == pytest.approx(40.0e6)
    assert status == "regression", reasons
    comparison = compare_profiles(BASE, slower)
    [result] = evaluate(comparison, parse_budgets(["step_time:+10%"]), floors())
    assert result.bounds is not None
    assert result.bounds[0] == pytest.approx(40.0e6 * (1 - 0.4 / 10.2) - 10.2e6)
    unchanged = [_loaded_run("c1", 10.0, 10.0), _loaded_run("c2", 10.3, 10.3), _loaded_run("c3", 20.6, 20.6)]
    assert _judge(unchanged)[0] == "inconclusive"


def _recorded(runs: list[tuple[list[int], list[int], list[int]]], name: str) -> list[RunProfile]:
    """Recorded runs (each step's CPU and wall time in microseconds, and its preemptions) as
    profiles, through :func:`_preempted_run`."""
    return [_preempted_run(f"{name}{i}", [c / 1000 for c in cpu], [w / 1000 for w in wall], switches)
            for i, (cpu, wall, switches) in enumerate(runs)]


# Runs recorded by bench_gate.py on this project's 2-core machine on 2026-12-04 (kept in its --keep
# folder): each step's CPU time and wall time (us) and preemptions. The plugin's runs (11 steps) are
# of its "quiet" condition, beside another session's test suite (load average 1.7-9.6); the compare
# part's (20 steps) are of its quiet condition's end, where the load had dropped.
PLUGIN_BUSY_BASE = [  # perf/other, test_train_param[16]'s three baseline runs
    # test_perf.py-test_train_param-16
    ([5096, 3623, 4281, 3805, 3439, 3038, 3786, 3123, 2241, 1977, 2216],
     [5236, 3651, 5495, 3806, 3438, 6723, 4963, 3123, 2241, 1977, 2217],
     [3, 0, 2, 0, 1, 18, 2, 0, 0, 0, 0]),
    # test_perf.py-test_train_param-16..run2
    ([3999, 3357, 4293, 2925, 2690, 2979, 2685, 3002, 2407, 3281, 2210],
     [3998, 4006, 5479, 5055, 3204, 3325, 3816, 3337, 2406, 4073, 2512],
     [0, 7, 6, 4, 5, 5, 8, 4, 0, 4, 1]),
    # test_perf.py-test_train_param-16..run3
    ([4094, 3780, 2994, 3579, 3235, 2705, 2795, 2767, 2371, 2865, 2180],
     [4092, 4117, 5148, 4669, 4818, 2704, 2796, 2773, 2372, 2894, 2222],
     [0, 3, 27, 13, 20, 0, 0, 1, 0, 1, 1]),
]
PLUGIN_13X = [  # the same test made 1.3x slower, its first run
    # candidates-4-1.3x
    ([6538, 4061, 3885, 3186, 2365, 2376, 2255, 2433, 2338, 2339, 3489],
     [6537, 4061, 3885, 3186, 2365, 2376, 2256, 2432, 2340, 2338, 3489],
     [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
]
CLI_QUIET_BASE = [  # three unchanged runs, none kept waiting (preempted steps <= 1.02x)
    # unchanged-14.0
    ([4165, 3745, 3841, 2927, 2084, 1911, 1516, 1540, 1446, 1413, 1687, 1509, 1808, 1563, 3139, 1634, 1630,
      1666, 1471, 1436],
     [4164, 3746, 3840, 3269, 2084, 1910, 1552, 1540, 1446, 1413, 1767, 1509, 1892, 1563, 3354, 1633, 1630,
      1666, 1473, 1434],
     [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]),
    # unchanged-14.1
    ([4169, 3283, 4914, 3395, 1738, 1575, 1754, 1774, 1705, 1658, 1712, 1458, 1874, 1502, 1926, 1566, 1549,
      1875, 1681, 1643],
     [4176, 3284, 4934, 4863, 2419, 1575, 1787, 1774, 2181, 1655, 1792, 1458, 1883, 1501, 1927, 1566, 1549,
      1882, 1751, 1673],
     [1, 0, 1, 2, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 1]),
    # unchanged-14.2
    ([4006, 3779, 4638, 2745, 1769, 1689, 1777, 1937, 1493, 1445, 1600, 1571, 1641, 1659, 1638, 1466, 1593,
      1552, 1464, 1538],
     [4017, 3798, 4664, 2949, 1767, 1690, 1923, 1973, 1493, 1446, 1600, 1572, 2099, 1657, 1640, 1464, 1593,
      1596, 1463, 1538],
     [1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0]),
]
CLI_QUIET_CAND = [  # three more of the same code, a few pairs later
    # unchanged-19.0
    ([3784, 3614, 3930, 1725, 1707, 1352, 1595, 1725, 1377, 2317, 1501, 1576, 1610, 1552, 1737, 1380, 1630,
      1554, 1356, 1640],
     [3783, 3615, 3930, 1783, 1707, 1351, 1731, 1725, 1378, 2317, 1603, 1576, 1608, 1552, 2239, 1380, 1631,
      1553, 1357, 1639],
     [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]),
    # unchanged-19.1
    ([4223, 4703, 4989, 2163, 2156, 2227, 1665, 1460, 2342, 1586, 2092, 1732, 1651, 1702, 1471, 1633, 1542,
      1797, 1472, 2000],
     [4231, 4702, 5252, 2163, 2322, 2227, 1696, 1460, 2343, 1585, 2502, 1733, 1652, 1701, 1471, 1679, 1543,
      1798, 1471, 2002],
     [1, 0, 1, 0, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0]),
    # unchanged-19.2
    ([3956, 3297, 5447, 1688, 2659, 2489, 1770, 1703, 1665, 1623, 1676, 1648, 1609, 1520, 1703, 1464, 2068,
      1595, 2240, 1596],
     [3962, 3318, 5628, 1690, 2773, 2526, 1816, 1759, 1666, 2123, 1673, 1692, 1608, 1520, 1704, 1464, 2114,
      1594, 2241, 1724],
     [1, 1, 2, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0]),
]
PLUGIN_QUIET_BASE = [  # perf/baseline, test_train's three baseline runs
    # test_perf.py-test_train
    ([6134, 3327, 2981, 2849, 2022, 2398, 2172, 2146, 2242, 1862, 2208],
     [6223, 3327, 2981, 2849, 2022, 2398, 2173, 2243, 2298, 1862, 2220],
     [0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1]),
    # test_perf.py-test_train..run2
    ([3893, 3553, 2352, 2877, 2010, 2983, 2135, 2783, 1954, 2815, 1950],
     [4124, 4158, 2350, 3063, 2435, 3392, 2638, 3307, 2373, 3272, 2351],
     [3, 8, 0, 4, 7, 8, 8, 8, 7, 8, 5]),
    # test_perf.py-test_train..run3
    ([3917, 2630, 3228, 2492, 2818, 2800, 2764, 3157, 2811, 2551, 3202],
     [4081, 3167, 4021, 2969, 3328, 3401, 3310, 3707, 3584, 2823, 3302],
     [4, 8, 10, 7, 8, 9, 10, 8, 12, 4, 2]),
]
PLUGIN_4X = [  # test_train made 4x slower, its three runs
    # candidates-0-4x test_perf.py-test_train
    ([13824, 10114, 11421, 10791, 10692, 10889, 10672, 10967, 10767, 10900, 10870],
     [13824, 10114, 11422, 10983, 10693, 11346, 10672, 10996, 10768, 10990, 10871],
     [0, 0, 0, 0, 0, 1, 0, 2, 0, 1, 0]),
    # candidates-0-4x test_perf.py-test_train..run2
    ([11436, 9501, 7591, 7269, 6382, 6090, 6338, 6028, 6317, 5967, 6224],
     [13489, 13534, 7591, 7269, 6382, 6091, 6338, 6028, 6317, 5968, 6239],
     [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    # candidates-0-4x test_perf.py-test_train..run3
    ([13655, 13676, 8893, 10801, 10187, 7159, 7367, 6997, 7264, 6848, 7222],
     [48530, 66390, 16525, 24870, 20804, 12760, 15553, 12143, 15926, 15223, 16474],
     [13, 22, 3, 3, 5, 2, 4, 2, 2, 3, 3]),
]


def test_a_baseline_recorded_busy_passes_nothing_its_inflation_could_hide() -> None:
    """A baseline saved in a busy spell measured 2.98 ms for code whose unchanged first runs took
    2.05-2.28 ms in the same condition's five sessions; its runs' preempted steps took 1.09-1.28x
    their CPU time, which the per-step rule turned into 24 % at most. A 1.3x slowdown's first run
    measured 2.43 ms: at most (2.43 + 0.06) * 1.24 = 3.09 ms, +3.6 %: passed ("ok", one of the
    plugin part's three).
    Kept waiting at all (BUSY_LOAD), the baseline's CPU time may be up to 90 % too high on its
    unpreempted steps too: up to +59 %, "cannot tell". Three unchanged runs recorded quiet (no run
    kept waiting 1.05x) against three more of the same code still pass."""
    from stepscope.analysis.compare.stats import LOAD_INFLATION

    busy, slower = _recorded(PLUGIN_BUSY_BASE, "b"), _recorded(PLUGIN_13X, "c")
    status, reasons, noise = _judge(slower, busy)
    assert status == "inconclusive", reasons
    assert noise["load"]["baseline_inflation"] == LOAD_INFLATION
    assert "cannot tell whether it is over +10% and the 500 us floor" in reasons[0]
    assert "the baseline was recorded busy (a run's preempted steps took 1.28x their CPU time in wall time, " \
           "1.05x or more, and the rest of the machine was not measured quiet), so its every step is allowed " \
           "90%" in reasons[0]

    status, reasons, noise = _judge(_recorded(CLI_QUIET_CAND, "c"), _recorded(CLI_QUIET_BASE, "b"))
    assert status == "pass", reasons
    assert noise["load"]["baseline_inflation"] < 0.05
    [result] = evaluate(compare_profiles(_recorded(CLI_QUIET_BASE, "b"), _recorded(CLI_QUIET_CAND, "c")),
                        parse_budgets(["step_time:+10%"]), floors())
    assert "recorded busy" not in result.message


def test_each_candidate_run_is_deflated_by_its_own_allowance() -> None:
    """A 4x slowdown's runs: 10.87 ms (never kept waiting), 6.34 ms (never preempted) and 7.37 ms
    (preempted on every step: 90 %), against 2.78 ms. 10.87 ms against the others is 4.4 ms of
    unexplained spread, so the median's bounds allow any change; the lowest run taken down by the
    side's 90 % (6.34 / 1.9 * 0.98 = 3.27 ms) is +0.49 ms, under the 0.5 ms floor: "cannot tell",
    live in bench_gate's plugin part. Each run by its own allowance, the lowest is 7.37 / 1.9 *
    0.98 = 3.80 ms: +1.02 ms at least, a regression."""
    base, slower = _recorded(PLUGIN_QUIET_BASE, "b"), _recorded(PLUGIN_4X, "c")
    status, reasons, noise = _judge(slower, base)
    assert noise["margin"] > 4.0e6 and noise["load"]["candidate_inflation"] == pytest.approx(0.9, abs=0.01)
    assert status == "regression", reasons
    comparison = compare_profiles(base, slower)
    [result] = evaluate(comparison, parse_budgets(["step_time:+10%"]), floors())
    assert result.bounds is not None and result.bounds[0] > 1.0e6


def test_past_the_load_ceiling_the_gate_is_too_loaded_to_judge() -> None:
    """Runs whose preempted steps took 8x their CPU time in wall time are past the 6x ceiling
    (stats.LOAD_CEILING), where load was measured to inflate CPU time by more than the 1.9x
    allowed; such a side is allowed 2.2x instead. Unchanged code inflated 2.3x there (23.5 ms
    against :data:`BASE`'s quiet 10.2 ms: at least 23.1 / 1.9 = 12.2 ms, +19 %, by the usual
    allowance) would be a false alarm; it is inconclusive, "too loaded to judge", in the verdict,
    the JSON and the Markdown (23.1 / 2.2 = 10.5 ms: +3 % to +134 %). A 4x slowdown is still a
    regression there (40.4 / 2.2 = 18.4 ms, +80 %), and a loaded candidate that measured no more
    than the baseline still passes (load cannot hide a slowdown). A baseline past the ceiling
    passes no quiet candidate at half its value ((6.6 + 0.27) * 2.2 = 15.1 ms against 13.26,
    +14 %: the usual 1.9x gave 13.05, a pass), and still fails 3x. Steps that took 8x their CPU
    time in wall time without ever being preempted (waits of the thread's own: I/O, a lock) are
    no load: judged as usual."""
    from stepscope.render.compare_json import render_json
    from stepscope.render.compare_markdown import render_markdown

    def runs(cpu_ms: float, load: float, switches: int, name: str = "c") -> list[RunProfile]:
        return [_preempted_run(f"{name}{i}", [cpu_ms] * 5, [cpu_ms * load] * 5, [switches] * 5) for i in range(3)]

    comparison = compare_profiles(BASE, runs(23.5, 8.0, 3))
    result = verdict(comparison, parse_budgets(["step_time:+10%"]), floors())
    assert result.status == "inconclusive" and "too loaded to judge" in result.reasons[0], result.reasons
    assert "a candidate run's preempted steps took 8.0x their CPU time in wall time, past the 6x" in result.reasons[0]
    doc = json.loads(render_json(comparison, result))
    assert doc["budgets"][0]["decided_by"] == "too_loaded" and doc["budgets"][0]["status"] == "inconclusive"
    load = doc["budgets"][0]["noise"]["load"]
    assert load["candidate_too_loaded"] is True and load["baseline_too_loaded"] is False and load["ceiling"] == 6.0
    assert load["candidate_inflation"] == pytest.approx(1.2) and load["candidate_preemption"][0]["load"] == 8.0
    markdown = render_markdown(comparison, result)
    assert "too loaded to judge" in markdown and "too_loaded" in markdown

    assert _judge(runs(23.5, 5.0, 3))[0] == "regression"  # under the ceiling: the usual allowance
    assert _judge(runs(40.8, 8.0, 3))[0] == "regression"
    assert _judge(runs(10.3, 8.0, 3))[0] == "pass"
    assert _judge(runs(23.5, 8.0, 0))[0] == "regression"  # never preempted: its waits were its own

    busy_base = runs(13.26, 8.0, 2, "b")
    status, reasons, noise = _judge([_loaded_run(f"c{i}", 6.6, 6.6) for i in range(3)], busy_base)
    assert status == "inconclusive" and "a baseline run's preempted steps took 8.0x" in reasons[0], reasons
    assert noise["load"]["baseline_too_loaded"] is True
    assert _judge([_loaded_run(f"c{i}", 6.6, 6.6) for i in range(3)], runs(13.26, 5.0, 2, "b"))[0] == "pass"
    assert _judge([_loaded_run(f"c{i}", 39.8, 39.8) for i in range(3)], busy_base)[0] == "regression"


def test_the_load_inflation_grows_with_the_most_loaded_run() -> None:
    from stepscope.analysis.compare.stats import LOAD_INFLATION, Load

    assert Load((1.0, 1.0), (1.0,)).inflation == 0.0
    assert Load((0.98,), (0.99,)).inflation == 0.0  # wall below CPU (timer granularity): unloaded
    assert Load((1.0,), (1.25,)).inflation == pytest.approx(LOAD_INFLATION / 2)  # halfway to 1.5
    assert Load((1.0, 1.0), (1.25, 1.0)).inflation == pytest.approx(LOAD_INFLATION / 2)  # either side's
    # a baseline run under BUSY_LOAD follows the same line; from it on the baseline was recorded
    # busy, and its side is allowed the full inflation (test_a_baseline_recorded_busy_...)
    assert Load((1.04, 1.0), (1.0, 1.0)).inflation == pytest.approx(LOAD_INFLATION * 0.04 / 0.5)
    assert Load((1.25, 1.0), (1.0, 1.0)).inflation == LOAD_INFLATION
    assert Load((1.0,), (1.0, 1.0, 3.0)).worst == 3.0 and Load((1.0,), (3.0,)).inflation == LOAD_INFLATION
    busy_base = Load((1.0, 3.0), (1.25,))  # each side is bounded by its own most loaded run
    assert busy_base.baseline_inflation == LOAD_INFLATION
    assert busy_base.candidate_inflation == pytest.approx(LOAD_INFLATION / 2)


def test_a_runs_preemptions_are_read_beside_its_cpu_time_and_older_parts_lack_them(tmp_path: Path) -> None:
    """A run whose ``step_times`` hold ``preemptions`` gives them with its CPU step times, in the
    same order; a part written before the column existed gives none (the gate judges that run on
    its load), and both still compare."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stepscope.analysis.compare.comparison import compare_sides
    from stepscope.analysis.compare.metrics import step_samples
    from stepscope.store import open_store
    from stepscope.store.constants import file_metadata
    from stepscope.store.ingest import ingest_paths
    from stepscope.store.schema import STEP_TIMES
    from stepscope.store.writer import part_path, write_partition

    root, ms = tmp_path / "store", 1_000_000
    for run in ("new", "old"):
        assert ingest_paths([SAMPLE], root, run).ok
    sources = {r["run"]: r["source"] for r in open_store(root).sql("SELECT run, source FROM sources").to_pylist()}
    columns = {"step": [0, 1, 2], "start_ns": [0, 10 * ms, 20 * ms], "wall_ns": [10 * ms, 12 * ms, 30 * ms],
               "cpu_ns": [4 * ms, 5 * ms, 6 * ms], "gpu_ns": [None] * 3, "profiled": [False] * 3,
               "tokens": [None] * 3, "samples": [None] * 3}
    new = pa.table({**columns, "source": [sources["new"]] * 3, "preemptions": [0, 2, 1], "disturbed_by": [None] * 3,
                     "others_cpu_ns": [None] * 3})
    write_partition(root, "step_times", "new", 0, sources["new"],
                    new.select([f.name for f in STEP_TIMES]).cast(STEP_TIMES))
    old = part_path(root, "step_times", "old", 0, sources["old"])
    old.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({**columns, "source": [sources["old"]] * 3})
                   .replace_schema_metadata(file_metadata("step_times")), old)

    store = open_store(root)
    fresh, older = (step_samples(store, run, "step_times.cpu_ns") for run in ("new", "old"))
    assert fresh["step_time"] == [4 * ms, 5 * ms, 6 * ms] and fresh["preemptions"] == [0, 2, 1]
    assert isinstance(older["preemptions"], Absent) and older["step_time"] == fresh["step_time"]
    step = compare_sides([(store, "old")], [(store, "new")]).metric("step_time")
    assert step.load is not None and step.load.baseline_preemption == (None,)
    assert [p.preempted for p in step.load.candidate_preemption if p is not None] == [2]
