"""The gate: a comparison and budgets in, one result per budget and a verdict out.

A gate is data first, then a decision (pytest-memray's ``limit_memory``): :func:`evaluate`
returns a :class:`BudgetResult` for every budget, :func:`check` only the violations, and
:func:`verdict` the exit status. Nothing is printed here.

The rule for one budget (``decided_by`` names the step that settled it):

1. ``not_available``: the metric is missing in either run; the budget abstains (never fails).
2. ``threshold``: the change does not exceed the threshold; pass.
3. ``floor``: it exceeds the threshold but is no larger than the metric's absolute floor
   (:func:`stepscope.analysis.compare.budgets.floors`: 0.5 ms, 16 MiB, 1 GB/s by default); pass.
4. ``mann_whitney``: it exceeds both, but a one-sided Mann-Whitney U test over the per-step
   values (step times, parts, per-step memory peaks, per-step bandwidths) does not reject "same
   distribution" at ``alpha``: the difference is within the run-to-run spread; pass.
5. ``threshold+mann_whitney``: it exceeds both and the test rejects; fail.
6. ``threshold_only``: it exceeds both and no test is possible (too few steps for the test to
   ever reach ``alpha``, e.g. 2 and 2); fail, and the message says the decision had no noise test.

Identical runs have zero deltas, so step 2 passes every budget: they never fail. Runs of the
same code differ by noise, which steps 3 and 4 absorb.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from stepscope.analysis.absent import Absent
from stepscope.analysis.compare.budgets import Budget
from stepscope.analysis.compare.budgets import floors as default_floors
from stepscope.analysis.compare.comparison import Comparison, MetricDelta
from stepscope.errors import Inconclusive, StepscopeError
from stepscope.units import format_value, p_value, signed_percent

DECIDED_BY = ("not_available", "threshold", "floor", "mann_whitney", "threshold+mann_whitney", "threshold_only")

PASS, REGRESSION, INCONCLUSIVE, NO_BASELINE = "pass", "regression", "inconclusive", "no_baseline"
EXIT_CODES = {PASS: 0, REGRESSION: StepscopeError.exit_code, INCONCLUSIVE: Inconclusive.exit_code}
"""Exit code per judged outcome. ``no_baseline`` exits as the outcome its caller chose for it
(``--missing-baseline pass|fail|inconclusive``, :data:`MISSING_BASELINE`)."""

MISSING_BASELINE = {"pass": PASS, "fail": REGRESSION, "inconclusive": INCONCLUSIVE}
"""``--missing-baseline`` choice -> the outcome whose exit code a ``no_baseline`` verdict takes."""


@dataclass(frozen=True)
class BudgetResult:
    """How one budget fared. ``status`` is ``pass``, ``fail`` or ``not_available``."""

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

    def to_json(self) -> dict[str, Any]:
        m = self.metric
        return {**self.budget.to_json(), "floor": self.floor, "status": self.status, "unit": m.unit,
                "statistic": m.statistic,
                "baseline": m.base_value, "candidate": m.cand_value, "delta": m.delta, "delta_pct": m.delta_pct,
                "exceeded": self.exceeded, "p_value": self.p_value, "decided_by": self.decided_by,
                "message": self.message}


Violation = BudgetResult
"""A :class:`BudgetResult` whose status is ``fail`` (what :func:`check` returns)."""


def _exceeded(budget: Budget, m: MetricDelta) -> bool:
    delta = m.delta or 0.0
    if budget.relative:
        if not m.base_value:
            return delta * budget.direction > 0
        return budget.direction * delta / abs(m.base_value) > budget.threshold
    return budget.direction * delta > budget.threshold


def _threshold_text(budget: Budget, m: MetricDelta) -> str:
    sign = "+" if budget.direction > 0 else "-"
    if budget.relative:
        return f"{sign}{budget.threshold * 100:g}%"
    return f"{sign}{format_value(budget.threshold, m.unit)}"


def _change_text(m: MetricDelta) -> str:
    pct = f" ({signed_percent(m.delta_pct)})" if m.delta_pct is not None else ""
    return (f"{m.label}: {format_value(m.base_value, m.unit)} -> {format_value(m.cand_value, m.unit)}"
            f"{pct}")


def evaluate_budget(comparison: Comparison, budget: Budget, floor: float) -> BudgetResult:
    """Apply the rule in the module docs to one budget, with the metric's absolute ``floor``."""
    m = comparison.metric(budget.metric)
    limit = _threshold_text(budget, m)

    def result(status: str, exceeded: bool | None, p: float | None, decided_by: str, message: str) -> BudgetResult:
        return BudgetResult(budget, m, floor, status, exceeded, p, decided_by, message)

    if m.delta is None:
        return result("not_available", None, None, "not_available",
                      f"{m.label}: not available ({m.absent_reason or 'no value'})")
    if not _exceeded(budget, m):
        return result("pass", False, None, "threshold", f"{_change_text(m)}, within {limit}")
    if abs(m.delta) <= floor:
        return result("pass", True, None, "floor", f"{_change_text(m)}, over {limit} but within the "
                                                   f"{format_value(floor, m.unit)} floor")
    test = m.increase if budget.direction > 0 else m.decrease
    if test is None or test.min_p > comparison.alpha:
        why = ("no per-step values" if test is None
               else f"too few steps for a noise test ({test.n_x} and {test.n_y})")
        return result("fail", True, None, "threshold_only", f"{_change_text(m)}, over {limit} (no noise test: {why})")
    if test.p_value < comparison.alpha:
        return result("fail", True, test.p_value, "threshold+mann_whitney",
                      f"{_change_text(m)}, over {limit} and beyond the run-to-run spread "
                      f"(Mann-Whitney p={p_value(test.p_value)}, n={test.n_x}/{test.n_y})")
    return result("pass", True, test.p_value, "mann_whitney",
                  f"{_change_text(m)}, over {limit} but within the run-to-run spread "
                  f"(Mann-Whitney p={p_value(test.p_value)} >= {comparison.alpha:g})")


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
    comparable or have no step time; else regression when any budget is violated; else pass."""
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
    return Verdict(PASS, [], results, EXIT_CODES[PASS])
