"""The gate: a comparison and budgets in, one result per budget and a verdict out.

A gate is data first, then a decision (pytest-memray's ``limit_memory``): :func:`evaluate`
returns a :class:`BudgetResult` for every budget, :func:`check` only the violations, and
:func:`verdict` the exit status. Nothing is printed here.

The rule for one budget (``decided_by`` names the step that settled it) makes every verdict a
statement the data support. A side's value is the median of its runs' values; the noise margin
``M`` is the run-to-run spread of those values (:class:`~stepscope.analysis.compare.stats.Noise`:
measured when a side has two runs or more, else assumed, and said so); for a step time in CPU
time each side's load may have inflated its value by a factor up to ``1 + f_c`` (the candidate)
or ``1 + f_b`` (the baseline) (:class:`~stepscope.analysis.compare.stats.Load`: CPU time grows,
never shrinks, when other processes take the core; where a run counted its steps' preemptions,
only its preempted steps are allowed that growth,
:func:`~stepscope.analysis.compare.stats.preemption`). So the candidate's value, in the baseline's
terms, is known only to lie between ``(c - M) / (1 + f_c)`` and ``(c + M) * (1 + f_b)`` (for a
step time in CPU time, never below the candidate's lowest run so deflated, less the baseline's
relative noise: :func:`_lowest_true_value`): its change from the baseline lies between a
**lower** and an **upper bound**. The size the gate guards against is
``G``: the budget's threshold, at least the metric's absolute floor
(:func:`stepscope.analysis.compare.budgets.floors`: 0.5 ms, 16 MiB, 1 GB/s by default).

1. ``not_available``: the metric is missing on either side; the budget abstains (never fails).
2. ``threshold``: no change at all (identical runs), or the upper bound is within the budget's
   threshold: the data rule out a change over budget; pass.
3. ``floor``: the upper bound is within the floor (larger than the threshold); pass.
4. ``noise``: the lower bound exceeds ``G``: over budget whatever the noise and the load did; fail.
5. ``grey_zone``: anything else: the data allow a change over ``G`` and one under it;
   inconclusive (the pytest plugin re-runs the test first).

So "pass" never hides a regression the noise or the load could have masked, and "regression"
never reports one that they could have made up. The Mann-Whitney U test over the per-run values
is reported (``p_value``), never decisive: with three runs against one it cannot go below 0.25,
which is the truth about so few runs. A test over the steps of one run would give p=1e-9 for a
run that a busy machine slowed down as a whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

from stepscope.analysis.absent import Absent
from stepscope.analysis.compare.budgets import Budget
from stepscope.analysis.compare.budgets import floors as default_floors
from stepscope.analysis.compare.comparison import Comparison, MetricDelta
from stepscope.analysis.compare.stats import (
    BUSY_LOAD,
    LOAD_INFLATION,
    LOAD_INFLATION_PAST_CEILING,
    Load,
    MIN_NOISE,
    UNSEEN_NOISE,
    MannWhitney,
    Noise,
    busy_loads,
    busy_runs,
    ceiling_loads,
    run_inflations,
    unexplained_range,
)
from stepscope.errors import Inconclusive, StepscopeError
from stepscope.units import format_value, p_value, signed_percent

DECIDED_BY = ("not_available", "threshold", "floor", "noise", "grey_zone", "too_loaded")

PASS, REGRESSION, INCONCLUSIVE, NO_BASELINE = "pass", "regression", "inconclusive", "no_baseline"
EXIT_CODES = {PASS: 0, REGRESSION: StepscopeError.exit_code, INCONCLUSIVE: Inconclusive.exit_code}
"""Exit code per judged outcome. ``no_baseline`` exits as the outcome its caller chose for it
(``--missing-baseline pass|fail|inconclusive``, :data:`MISSING_BASELINE`)."""

MISSING_BASELINE = {"pass": PASS, "fail": REGRESSION, "inconclusive": INCONCLUSIVE}
"""``--missing-baseline`` choice -> the outcome whose exit code a ``no_baseline`` verdict takes."""


@dataclass(frozen=True)
class BudgetResult:
    """How one budget fared. ``status`` is ``pass``, ``fail``, ``inconclusive`` (the grey zone)
    or ``not_available``."""

    budget: Budget
    metric: MetricDelta
    floor: float
    """The metric's absolute floor (its unit) that this budget was judged with."""
    status: str
    exceeded: bool | None
    p_value: float | None
    decided_by: str
    message: str
    bounds: tuple[float, float] | None = None
    """The lowest and highest change the data allow (:func:`change_bounds`); None when not
    available."""

    @property
    def violated(self) -> bool:
        return self.status == "fail"

    @property
    def grey(self) -> bool:
        return self.status == "inconclusive"

    def to_json(self) -> dict[str, Any]:
        m = self.metric
        return {**self.budget.to_json(), "floor": self.floor, "status": self.status, "unit": m.unit,
                "statistic": m.statistic,
                "baseline": m.base_value, "candidate": m.cand_value, "delta": m.delta, "delta_pct": m.delta_pct,
                "exceeded": self.exceeded, "p_value": self.p_value, "decided_by": self.decided_by,
                "change_low": None if self.bounds is None else self.bounds[0],
                "change_high": None if self.bounds is None else self.bounds[1],
                "noise": None if m.noise is None else m.noise.to_json(), "message": self.message}


Violation = BudgetResult
"""A :class:`BudgetResult` whose status is ``fail`` (what :func:`check` returns)."""


def _limit(budget: Budget, m: MetricDelta) -> float:
    """The budget's threshold in the metric's unit (a relative one of the baseline's value)."""
    return budget.threshold * abs(m.base_value or 0.0) if budget.relative else budget.threshold


def _threshold_text(budget: Budget, m: MetricDelta) -> str:
    sign = "+" if budget.direction > 0 else "-"
    if budget.relative:
        return f"{sign}{budget.threshold * 100:g}%"
    return f"{sign}{format_value(budget.threshold, m.unit)}"


def _change_text(m: MetricDelta) -> str:
    pct = f" ({signed_percent(m.delta_pct)})" if m.delta_pct is not None else ""
    return (f"{m.label}: {format_value(m.base_value, m.unit)} -> {format_value(m.cand_value, m.unit)}"
            f"{pct}")


def noise_text(noise: Noise, unit: str) -> str:
    """The noise margin and where it came from, in words."""
    runs = f"{noise.baseline_runs} baseline run{'s' * (noise.baseline_runs != 1)}, " \
           f"{noise.candidate_runs} candidate run{'s' * (noise.candidate_runs != 1)}"
    if not noise.measured:
        text = (f"run-to-run noise not measured ({runs}): assumed +-{format_value(noise.margin, unit)}; "
                "a change that size could be noise it cannot see")
    else:
        explained = ""
        if noise.spread is not None and noise.unexplained is not None and noise.unexplained < noise.spread:
            explained = f"; the rest of their {format_value(noise.spread, unit)} spread is within what load adds"
        text = f"run-to-run noise +-{format_value(noise.margin, unit)} ({runs}{explained})"
    return text + _load_text(noise)


def _load_text(noise: Noise) -> str:
    """What the load added to the bounds, in words (nothing when no run waited for a core)."""
    load = noise.load
    if load is None or not load.inflation:
        return ""
    sides = [f"the {side}'s up to {inflation * 100:.0f}% too high"
             for side, inflation in (("baseline", load.baseline_inflation), ("candidate", load.candidate_inflation))
             if inflation]
    busy = ""
    if load.baseline_busy:
        loads = [b for b, busy_run in zip(busy_loads(load.baseline, load.baseline_preemption),
                                          busy_runs(load.baseline, load.baseline_preemption)) if busy_run]
        busy = (f"; the baseline was recorded busy (a run's preempted steps took "
                f"{max(loads):.2f}x their CPU time in wall time, "
                f"{BUSY_LOAD:g}x or more, and the rest of the machine was not measured quiet), so its every step "
                f"is allowed {LOAD_INFLATION * 100:.0f}%")
    return (f"; the runs were loaded (the most loaded one's steps took {load.worst:.2f}x their CPU time in "
            f"wall time, the baseline's {min(load.baseline):.2f}-{max(load.baseline):.2f}x), which inflates "
            f"CPU time: {' and '.join(sides)}{_preempted_text(load)}{busy}")


def _preempted_text(load: Load) -> str:
    """How many steps each side lost its core in, where its runs counted them (the steps the
    inflation was allowed on, :func:`~stepscope.analysis.compare.stats.preemption`)."""
    counts = []
    for side, found in (("baseline", load.baseline_preemption), ("candidate", load.candidate_preemption)):
        known = [p for p in found if p is not None]
        if known:
            counts.append(f"{sum(p.preempted for p in known)} of the {side}'s {sum(p.steps for p in known)}")
    if not counts:
        return ""
    return f", allowed on the preempted steps only ({' and '.join(counts)} steps were preempted)"


def _between_runs(test: MannWhitney | None, alpha: float) -> str:
    if test is None:
        return ""
    if test.min_p >= alpha:
        return (f"; Mann-Whitney over run values p={p_value(test.p_value)}, the lowest {test.n_x} vs "
                f"{test.n_y} runs can give is {p_value(test.min_p)}")
    return f"; Mann-Whitney over run values p={p_value(test.p_value)} (n={test.n_x}/{test.n_y} runs)"


def change_bounds(m: MetricDelta, noise: Noise, direction: int) -> tuple[float, float]:
    """The lowest and highest change (in the budget's direction, the metric's unit) that the
    candidate's value allows once the noise margin is taken off and added, and each side's load
    inflation allowed for (module docs). Load only inflates: the candidate's true value may be its
    measured one divided by ``1 + candidate_inflation`` (which lowers the change), the baseline's
    true value its measured one divided by ``1 + baseline_inflation`` (which raises the change, in
    the baseline's terms: the candidate's value times that factor)."""
    assert m.base_value is not None and m.cand_value is not None
    ends = [direction * (value - m.base_value)
            for value in ((m.cand_value - noise.margin) / (1.0 + noise.candidate_inflation),
                          (m.cand_value + noise.margin) * (1.0 + noise.baseline_inflation))]
    low, high = min(ends), max(ends)
    floor = _lowest_true_value(m, noise)
    if direction > 0 and floor is not None:
        low = min(max(low, floor - m.base_value), high)
    return low, high


def _lowest_true_value(m: MetricDelta, noise: Noise) -> float | None:
    """For a step time in CPU time (which load only inflates): the least the candidate's true
    value can be, the lowest of its runs each taken down by its own load allowance
    (:attr:`~stepscope.analysis.compare.stats.Load.candidate_allowances`), less the baseline's
    run-to-run noise relative to the baseline's value (at least :data:`MIN_NOISE`;
    :data:`UNSEEN_NOISE` with one baseline run).

    Why: the margin is the larger unexplained spread of either side, in the metric's unit, taken
    off the candidate's median. One candidate run inflated beyond its allowance (a busy neighbour
    that preempted nothing) makes that spread as large as the candidate's value, whatever the
    change's size: an 11x slower model whose runs took 6.5, 8.9 and 9.0 ms against 0.8 ms was one
    run at 1.5x from "cannot tell" (a recording of docs/ci.md's workflow test), and bench_gate's
    plugin part left 3 of 20 4x slowdowns inconclusive at +-4-5 ms of noise on a 2.8 ms baseline. An
    inflated run only raises the candidate's values; its lowest run, deflated, still bounds them
    from below. Each run by its own allowance, not the side's largest: that bounds a run's code
    from below as well, and the side's largest (one run preempted on every step, 90 %) taken off a
    run that was never preempted (6.34 ms, beside runs of 10.87 ms and of 7.37 ms preempted on
    every step, against a 2.78 ms baseline) left a 4x slowdown "cannot tell" in bench_gate's plugin
    part of 2026-12-04. It holds as long as one run stayed within its allowance. None for other
    metrics (noise moves them either way)."""
    load = noise.load
    if load is None or not m.cand_runs or not m.base_runs or not m.base_value:
        return None
    base = list(m.base_runs)
    if len(base) >= 2:
        inflations = run_inflations(load.baseline, load.baseline_preemption)
        relative = max(unexplained_range(base, inflations) / m.base_value, MIN_NOISE)
    else:
        relative = UNSEEN_NOISE
    return min(v / (1.0 + f) for v, f in zip(m.cand_runs, load.candidate_allowances)) * (1.0 - relative)


def _bounds_text(low: float, high: float, m: MetricDelta) -> str:
    base = abs(m.base_value or 0.0)
    if not base:
        return f"the change lies between {format_value(low, m.unit)} and {format_value(high, m.unit)}"
    return f"the change lies between {signed_percent(100 * low / base)} and {signed_percent(100 * high / base)}"


def _ceiling_text(load: Load) -> str:
    """Which side's runs were past the load ceiling, in words (for "too loaded to judge")."""
    sides = [f"a {side} run's preempted steps took {max(ceiling_loads(loads, found)):.1f}x their CPU time in wall time"
             for side, loads, found, past in (
                 ("candidate", load.candidate, load.candidate_preemption, load.candidate_too_loaded),
                 ("baseline", load.baseline, load.baseline_preemption, load.baseline_too_loaded)) if past]
    return (f"{' and '.join(sides)}, past the {load.ceiling:g}x beyond which load was measured to inflate CPU time "
            f"by more than {LOAD_INFLATION * 100:.0f}%: allowing up to {LOAD_INFLATION_PAST_CEILING * 100:.0f}%, "
            "the runs cannot tell")


def _rule(low: float, high: float, threshold: float, floor: float) -> str:
    """The ``decided_by`` of a change whose bounds are ``low``-``high`` (module docs, steps 2-5)."""
    if high <= threshold:
        return "threshold"
    if high <= floor:
        return "floor"
    return "noise" if low > max(threshold, floor) else "grey_zone"


def evaluate_budget(comparison: Comparison, budget: Budget, floor: float) -> BudgetResult:
    """Apply the rule in the module docs to one budget, with the metric's absolute ``floor``.

    Past the load ceiling (:data:`~stepscope.analysis.compare.stats.LOAD_CEILING`) a side is
    allowed :data:`~stepscope.analysis.compare.stats.LOAD_INFLATION_PAST_CEILING`; a change that
    the usual allowance would have passed or failed and that one leaves in the grey zone is
    ``too_loaded``: "too loaded to judge", not "cannot tell"."""
    m = comparison.metric(budget.metric)
    limit = _threshold_text(budget, m)

    def result(status: str, exceeded: bool | None, p: float | None, decided_by: str, message: str,
               bounds: tuple[float, float] | None = None) -> BudgetResult:
        return BudgetResult(budget, m, floor, status, exceeded, p, decided_by, message, bounds)

    noise = m.noise
    if m.delta is None or noise is None:
        return result("not_available", None, None, "not_available",
                      f"{m.label}: not available ({m.absent_reason or 'no value'})")
    test = m.increase if budget.direction > 0 else m.decrease
    p = None if test is None else test.p_value
    threshold = _limit(budget, m)
    exceeded = budget.direction * m.delta > threshold
    low, high = change_bounds(m, noise, budget.direction)
    about = f"{_bounds_text(low, high, m)}; {noise_text(noise, m.unit)}{_between_runs(test, comparison.alpha)}"
    rule = "threshold" if m.delta == 0 else _rule(low, high, threshold, floor)
    if rule == "threshold":
        return result("pass", False, p, "threshold", f"{_change_text(m)}, within {limit} ({about})", (low, high))
    if rule == "floor":
        return result("pass", exceeded, p, "floor", f"{_change_text(m)}, within the {format_value(floor, m.unit)} "
                                                    f"floor ({about})", (low, high))
    over = limit if threshold >= floor else f"{limit} and the {format_value(floor, m.unit)} floor"
    if rule == "noise":
        return result("fail", True, p, "noise", f"{_change_text(m)}, over {over} by more than the noise "
                                                f"({about})", (low, high))
    load = noise.load
    if load is not None and (load.baseline_too_loaded or load.candidate_too_loaded):
        usual = replace(noise, load=replace(load, ceiling=math.inf))
        if _rule(*change_bounds(m, usual, budget.direction), threshold, floor) != "grey_zone":
            return result("inconclusive", exceeded, p, "too_loaded",
                          f"{_change_text(m)}: too loaded to judge whether it is over {over}: {_ceiling_text(load)} "
                          f"({about})", (low, high))
    return result("inconclusive", exceeded, p, "grey_zone",
                  f"{_change_text(m)}, cannot tell whether it is over {over} ({about})", (low, high))


def evaluate(comparison: Comparison, budgets: list[Budget],
             floors: Mapping[str, float] | None = None) -> list[BudgetResult]:
    """One result per budget, in the order given; ``floors`` (metric -> amount) default to
    :func:`stepscope.analysis.compare.budgets.floors`."""
    known = default_floors() if floors is None else floors
    return [evaluate_budget(comparison, b, known[b.metric]) for b in budgets]


def check(comparison: Comparison, budgets: list[Budget],
          floors: Mapping[str, float] | None = None) -> list[Violation]:
    """The violated budgets only; empty means within budget."""
    return [r for r in evaluate(comparison, budgets, floors) if r.violated]


@dataclass(frozen=True)
class Verdict:
    """The decision: ``pass``, ``regression``, ``inconclusive`` or ``no_baseline``, its exit code
    and why."""

    status: str
    reasons: list[str]
    results: list[BudgetResult]
    exit_code: int
    missing_baseline: str | None = None
    """For ``no_baseline``: the ``--missing-baseline`` choice that set the exit code."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "exit_code": self.exit_code, "reasons": self.reasons}
        if self.missing_baseline is not None:
            out["missing_baseline"] = self.missing_baseline
        return out


def verdict(comparison: Comparison, budgets: list[Budget], floors: Mapping[str, float] | None = None,
            *, missing_baseline: str = "pass") -> Verdict:
    """``no_baseline`` when the comparison has no baseline (exit code as ``missing_baseline``
    says: ``pass`` 0, ``fail`` 1, ``inconclusive`` 4); inconclusive when the runs are not
    comparable or have no step time; else regression when any budget is violated; else
    inconclusive when any is in the grey zone; else pass."""
    results = evaluate(comparison, budgets, floors)
    if isinstance(comparison.baseline, Absent):
        return Verdict(NO_BASELINE, [comparison.baseline.reason], results,
                       EXIT_CODES[MISSING_BASELINE[missing_baseline]], missing_baseline)
    reasons = comparison.not_comparable_reasons
    step = comparison.metric("step_time")
    if step.delta is None:
        reasons = [*reasons, f"step time: not available ({step.absent_reason})"]
    if reasons:
        return Verdict(INCONCLUSIVE, reasons, results, EXIT_CODES[INCONCLUSIVE])
    violated = [r.message for r in results if r.violated]
    if violated:
        return Verdict(REGRESSION, violated, results, EXIT_CODES[REGRESSION])
    grey = [r.message for r in results if r.grey]
    if grey:
        return Verdict(INCONCLUSIVE, grey, results, EXIT_CODES[INCONCLUSIVE])
    return Verdict(PASS, [], results, EXIT_CODES[PASS])
