"""The gate: a comparison and budgets in, one result per budget and a verdict out.

A gate is data first, then a decision (pytest-memray's ``limit_memory``): :func:`evaluate`
returns a :class:`BudgetResult` for every budget, :func:`check` only the violations, and
:func:`verdict` the exit status. Nothing is printed here.

The rule for one budget (``decided_by`` names the step that settled it). A side's value is the
median of its runs' values; the noise margin ``M`` is the run-to-run spread of those values
(:class:`~stepscope.analysis.compare.stats.Noise`: measured when a side has two runs or more, else
assumed, and said so); ``T`` is the budget's threshold:

1. ``not_available``: the metric is missing on either side; the budget abstains (never fails).
2. ``threshold``: there is no change, or it is within ``T - M``: within budget even if the
   noise hid part of it; pass.
3. ``floor``: it is no larger than the metric's absolute floor
   (:func:`stepscope.analysis.compare.budgets.floors`: 0.5 ms, 16 MiB, 1 GB/s by default); pass.
   Not when the candidate ran at another load than the baseline (a CPU-time step time whose
   margin includes the load's, :class:`~stepscope.analysis.compare.stats.Load`): a load change
   moves CPU time by more than the floor, so a small change then says nothing either way.
4. ``noise``: it exceeds ``T + M``: over budget by more than runs of the same code differ; fail.
5. ``grey_zone``: between the two, noise alone could put it on either side of the budget;
   inconclusive (the pytest plugin re-runs the test first).

The Mann-Whitney U test over the per-run values is reported (``p_value``), never decisive: with
three runs against one it cannot go below 0.25, which is the truth about so few runs. A test
over the steps of one run would give p=1e-9 for a run that a busy machine slowed down as a whole.
Identical runs have zero deltas, so steps 2 or 3 pass every budget: they never fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from stepscope.analysis.absent import Absent
from stepscope.analysis.compare.budgets import Budget
from stepscope.analysis.compare.budgets import floors as default_floors
from stepscope.analysis.compare.comparison import Comparison, MetricDelta
from stepscope.analysis.compare.stats import MannWhitney, Noise
from stepscope.analysis.quantiles import median
from stepscope.errors import Inconclusive, StepscopeError
from stepscope.units import format_value, p_value, signed_percent

DECIDED_BY = ("not_available", "threshold", "floor", "noise", "grey_zone")

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
        text = f"run-to-run noise +-{format_value(noise.margin, unit)} ({runs})"
    return text + _load_text(noise, unit)


def _load_text(noise: Noise, unit: str) -> str:
    """What the change of load added to the margin, in words (nothing when it did not change)."""
    load = noise.load
    if load is None or not noise.load_allowance:
        return ""
    return (f"; the candidate ran at another load (its steps took {median(list(load.candidate)):.1f}x their CPU "
            f"time in wall time, the baseline's {min(load.baseline):.1f}-{max(load.baseline):.1f}x), which moves "
            f"CPU time too: +-{format_value(noise.load_allowance, unit)} of it included")


def _between_runs(test: MannWhitney | None, alpha: float) -> str:
    if test is None:
        return ""
    if test.min_p >= alpha:
        return (f"; Mann-Whitney over run values p={p_value(test.p_value)}, the lowest {test.n_x} vs "
                f"{test.n_y} runs can give is {p_value(test.min_p)}")
    return f"; Mann-Whitney over run values p={p_value(test.p_value)} (n={test.n_x}/{test.n_y} runs)"


def evaluate_budget(comparison: Comparison, budget: Budget, floor: float) -> BudgetResult:
    """Apply the rule in the module docs to one budget, with the metric's absolute ``floor``."""
    m = comparison.metric(budget.metric)
    limit = _threshold_text(budget, m)

    def result(status: str, exceeded: bool | None, p: float | None, decided_by: str, message: str) -> BudgetResult:
        return BudgetResult(budget, m, floor, status, exceeded, p, decided_by, message)

    noise = m.noise
    if m.delta is None or noise is None:
        return result("not_available", None, None, "not_available",
                      f"{m.label}: not available ({m.absent_reason or 'no value'})")
    test = m.increase if budget.direction > 0 else m.decrease
    p = None if test is None else test.p_value
    change, threshold, margin = budget.direction * m.delta, _limit(budget, m), noise.margin
    exceeded = change > threshold
    about = f"{noise_text(noise, m.unit)}{_between_runs(test, comparison.alpha)}"
    if m.delta == 0 or change <= threshold - margin:
        return result("pass", False, p, "threshold", f"{_change_text(m)}, within {limit} ({about})")
    if abs(m.delta) <= floor and not noise.load_allowance:
        return result("pass", exceeded, p, "floor", f"{_change_text(m)}, within the {format_value(floor, m.unit)} "
                                                    f"floor ({about})")
    if change > threshold + margin:
        return result("fail", True, p, "noise", f"{_change_text(m)}, over {limit} by more than the noise ({about})")
    return result("inconclusive", exceeded, p, "grey_zone",
                  f"{_change_text(m)}, within the noise of {limit} ({about}): cannot tell")


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
