"""The gate: a comparison and budgets in, one result per budget and a verdict out.

A gate is data first, then a decision (pytest-memray's ``limit_memory``): :func:`evaluate`
returns a :class:`BudgetResult` for every budget, :func:`check` only the violations, and
:func:`verdict` the exit status. Nothing is printed here.

The rule for one budget (``decided_by`` names the step that settled it):

1. ``not_available``: the metric is missing in either run; the budget abstains (never fails).
2. ``threshold``: the change does not exceed the threshold; pass.
3. ``mann_whitney``: the change exceeds the threshold but a one-sided Mann-Whitney U test over
   the per-step values does not reject "same distribution" at ``alpha``: the difference is
   within the run-to-run spread; pass.
4. ``threshold+mann_whitney``: it exceeds the threshold and the test rejects; fail.
5. ``threshold_only``: it exceeds the threshold and no test is possible (the metric is one value
   per run, like a peak, or there are too few steps for the test to ever reach ``alpha``); fail,
   and the message says the decision had no noise test.

Identical runs have zero deltas, so step 2 passes every budget: they never fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepscope.analysis.compare.budgets import Budget
from stepscope.analysis.compare.comparison import Comparison, MetricDelta
from stepscope.errors import Inconclusive, StepscopeError
from stepscope.render.units import format_value, p_value, signed_percent

DECIDED_BY = ("not_available", "threshold", "mann_whitney", "threshold+mann_whitney", "threshold_only")

PASS, REGRESSION, INCONCLUSIVE = "pass", "regression", "inconclusive"
EXIT_CODES = {PASS: 0, REGRESSION: StepscopeError.exit_code, INCONCLUSIVE: Inconclusive.exit_code}


@dataclass(frozen=True)
class BudgetResult:
    """How one budget fared. ``status`` is ``pass``, ``fail`` or ``not_available``."""

    budget: Budget
    metric: MetricDelta
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
        return {**self.budget.to_json(), "status": self.status, "unit": m.unit, "statistic": m.statistic,
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


def evaluate_budget(comparison: Comparison, budget: Budget) -> BudgetResult:
    """Apply the rule in the module docs to one budget."""
    m = comparison.metric(budget.metric)
    limit = _threshold_text(budget, m)
    if m.delta is None:
        return BudgetResult(budget, m, "not_available", None, None, "not_available",
                            f"{m.label}: not available ({m.absent_reason or 'no value'})")
    if not _exceeded(budget, m):
        return BudgetResult(budget, m, "pass", False, None, "threshold",
                            f"{_change_text(m)}, within {limit}")
    test = m.increase if budget.direction > 0 else m.decrease
    if m.statistic != "median" or test is None or test.min_p > comparison.alpha:
        why = (f"{m.statistic} is one value per run" if m.statistic != "median" or test is None
               else f"too few steps for a noise test ({test.n_x} and {test.n_y})")
        return BudgetResult(budget, m, "fail", True, None, "threshold_only",
                            f"{_change_text(m)}, over {limit} (no noise test: {why})")
    if test.p_value < comparison.alpha:
        return BudgetResult(budget, m, "fail", True, test.p_value, "threshold+mann_whitney",
                            f"{_change_text(m)}, over {limit} and beyond the run-to-run spread "
                            f"(Mann-Whitney p={p_value(test.p_value)}, n={test.n_x}/{test.n_y})")
    return BudgetResult(budget, m, "pass", True, test.p_value, "mann_whitney",
                        f"{_change_text(m)}, over {limit} but within the run-to-run spread "
                        f"(Mann-Whitney p={p_value(test.p_value)} >= {comparison.alpha:g})")


def evaluate(comparison: Comparison, budgets: list[Budget]) -> list[BudgetResult]:
    """One result per budget, in the order given."""
    return [evaluate_budget(comparison, b) for b in budgets]


def check(comparison: Comparison, budgets: list[Budget]) -> list[Violation]:
    """The violated budgets only; empty means within budget."""
    return [r for r in evaluate(comparison, budgets) if r.violated]


@dataclass(frozen=True)
class Verdict:
    """The decision: ``pass``, ``regression`` or ``inconclusive``, its exit code and why."""

    status: str
    reasons: list[str]
    results: list[BudgetResult]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "exit_code": self.exit_code, "reasons": self.reasons}


def verdict(comparison: Comparison, budgets: list[Budget]) -> Verdict:
    """Inconclusive when the runs are not comparable or have no step time; else regression when
    any budget is violated; else pass."""
    results = evaluate(comparison, budgets)
    reasons = comparison.not_comparable_reasons
    step = comparison.metric("step_time")
    if step.delta is None:
        reasons = [*reasons, f"step time: not available ({step.absent_reason})"]
    if reasons:
        return Verdict(INCONCLUSIVE, reasons, results)
    violated = [r.message for r in results if r.violated]
    if violated:
        return Verdict(REGRESSION, violated, results)
    return Verdict(PASS, [], results)
