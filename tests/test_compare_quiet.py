"""A run on which the rest of the machine was measured quiet (``step_times.others_cpu_ns``) is
allowed only what its preempted steps allow: the blanket inflation of a baseline "recorded busy"
(stats.BUSY_LOAD) is for runs that were busy, or that did not measure it (recorded before the
column: judged exactly as before)."""

from __future__ import annotations

import json

import pytest

from stepscope.analysis.absent import Absent
from stepscope.analysis.compare import compare_profiles, parse_budgets, verdict
from stepscope.analysis.compare.budgets import BUDGET_METRICS, floors
from stepscope.analysis.compare.metrics import RunFacts, RunProfile
from stepscope.analysis.compare.stats import BUSY_LOAD, LOAD_INFLATION, QUIET_OTHERS, preemption

STEPS = 20
PREEMPTED = (3, 11, 17)
"""The steps another process took the core from, each for 7 % of its CPU time (1.07x, over
BUSY_LOAD): a quiet machine's runs look like this by themselves (the interpreter, the kernel)."""


def _run(name: str, cpu_ms: float, others_cpus: float | None) -> RunProfile:
    """A CPU run of ``STEPS`` steps of ``cpu_ms`` (+-1 % by step, so the median is not a tie), the
    steps in :data:`PREEMPTED` at 1.07x wall over CPU time, the others at 1.0x; the rest of the
    machine used ``others_cpus`` CPUs' worth while it ran (None: not recorded, as a run from
    before ``step_times.others_cpu_ns``)."""
    cpu = [cpu_ms * 1e6 * (1 + 0.01 * ((i % 3) - 1)) for i in range(STEPS)]
    wall = [c * (1.07 if i in PREEMPTED else 1.0) for i, c in enumerate(cpu)]
    absent = Absent("not part of this test")
    samples: dict[str, object] = {m: absent for m in BUDGET_METRICS if m != "peak_memory"}
    samples.update({"step_time": cpu, "wall_time": wall,
                    "preemptions": [1.0 if i in PREEMPTED else 0.0 for i in range(STEPS)]})
    if others_cpus is not None:
        samples["others_cpu_ns"] = [others_cpus * w for w in wall]
    facts = RunFacts(name, None, (0,), None, None, (), None, None, STEPS, 1)
    return RunProfile(facts, "step_times.cpu_ns", samples, absent, None, absent,  # type: ignore[arg-type]
                      absent, absent, absent, [])


def _side(prefix: str, cpu_ms: list[float], others_cpus: float | None) -> list[RunProfile]:
    return [_run(f"{prefix}{i}", ms, others_cpus) for i, ms in enumerate(cpu_ms)]


BASE_MS = [3.00, 3.05, 2.98]
SAME_MS = [3.02, 2.99, 3.04]
"""Unchanged code: the baseline's and a candidate's three runs, within 2 % of each other."""


def _judged(base_others: float | None, cand_ms: list[float] = SAME_MS) -> tuple[str, dict[str, object], str]:
    comparison = compare_profiles(_side("b", BASE_MS, base_others), _side("c", cand_ms, 0.0))
    result = verdict(comparison, parse_budgets(["step_time:+10%"]), floors())
    [step] = [r for r in result.results if r.budget.metric == "step_time"]
    noise = step.metric.noise
    assert noise is not None and noise.load is not None
    return result.status, noise.load.to_json(), step.message


def test_the_runs_others_cpus_are_their_sum_over_their_wall_time() -> None:
    """Each step's value is counted in 10 ms ticks, so a 3 ms step reads -3 ms or +7 ms; over the
    run they add up to the CPUs' worth the rest of the machine used: here 2 ms of 60 ms."""
    wall = [3e6] * STEPS
    others = [7e6 if i in (0, 10) else -12e6 / 18 for i in range(STEPS)]
    found = preemption([3e6] * STEPS, wall, [0] * STEPS, others)
    assert found.others == pytest.approx((14e6 - 12e6) / 60e6)
    assert found.quiet and found.to_json()["others"] == found.others
    assert preemption([3e6] * STEPS, wall, [0] * STEPS).others is None  # not recorded
    assert not preemption([3e6] * STEPS, wall, [0] * STEPS).quiet
    assert not preemption([3e6] * STEPS, wall, [0] * STEPS, [QUIET_OTHERS * 3e6] * STEPS).quiet


def test_a_baseline_measured_quiet_is_not_blanket_inflated() -> None:
    """Its preempted steps took 1.07x their CPU time (over BUSY_LOAD = 1.05): unmeasured, it is
    "recorded busy" and allowed 90 % on every step, so unchanged code (+0.4 %) cannot be told from
    a regression. Measured quiet (0.05 CPUs of other work), it is allowed what its three preempted
    steps allow: nothing for its median (17 of 20 steps were never preempted), and the same code
    passes. Measured busy (1.0 CPUs: a neighbour spinning), it is allowed 90 % as before."""
    assert 1.07 >= BUSY_LOAD
    status, load, message = _judged(None)
    assert status == "inconclusive" and load["baseline_busy"] is True, message
    assert load["baseline_inflation"] == LOAD_INFLATION and "recorded busy" in message
    assert [p["others"] for p in load["baseline_preemption"]] == [None] * 3  # type: ignore[index]

    status, load, message = _judged(0.05)
    assert status == "pass" and load["baseline_busy"] is False, message
    assert load["baseline_inflation"] == 0.0 and "recorded busy" not in message
    assert [p["others"] for p in load["baseline_preemption"]] == [pytest.approx(0.05)] * 3  # type: ignore[index]

    status, load, message = _judged(1.0)
    assert status == "inconclusive" and load["baseline_busy"] is True, message
    assert load["baseline_inflation"] == LOAD_INFLATION
    assert "and the rest of the machine was not measured quiet" in message


def test_a_quiet_baseline_still_catches_a_slowdown_and_lets_no_13x_pass() -> None:
    """The quiet baseline's narrower bounds move the pass line only: 1.3x and 4x are regressions
    against it (the candidate measured quiet too), and a candidate inflated by load is not a pass
    (its own allowance is untouched by the baseline's measure)."""
    assert _judged(0.0, [m * 1.3 for m in SAME_MS])[0] == "regression"
    assert _judged(0.0, [m * 4.0 for m in SAME_MS])[0] == "regression"
    assert _judged(None, [m * 4.0 for m in SAME_MS])[0] == "regression"


def test_the_quiet_measure_is_in_the_json() -> None:
    """``baseline_busy`` and each run's ``others`` are keys of ``noise.load`` (docs/COMPARE_JSON.md)."""
    from stepscope.render.compare_json import render_json

    comparison = compare_profiles(_side("b", BASE_MS, 0.05), _side("c", SAME_MS, None))
    doc = json.loads(render_json(comparison, verdict(comparison, parse_budgets(["step_time:+10%"]), floors())))
    load = doc["metrics"][0]["noise"]["load"]
    assert load["baseline_busy"] is False
    assert [p["others"] for p in load["baseline_preemption"]] == [pytest.approx(0.05)] * 3
    assert [p["others"] for p in load["candidate_preemption"]] == [None] * 3
