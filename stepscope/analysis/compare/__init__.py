"""Compare two runs and judge the difference against budgets: the data side of the CI gate.

- :mod:`~stepscope.analysis.compare.metrics`: what is compared about a run, read from the
  analyses' public functions (nothing recomputed here).
- :mod:`~stepscope.analysis.compare.stats`: spread and the Mann-Whitney U test (no scipy).
- :mod:`~stepscope.analysis.compare.comparability`: whether two runs can be compared at all.
- :mod:`~stepscope.analysis.compare.comparison`: the :class:`Comparison` of two runs.
- :mod:`~stepscope.analysis.compare.budgets`: ``step_time:+5%`` and friends.
- :mod:`~stepscope.analysis.compare.gate`: budgets judged, and the verdict.

Renderers (terminal, Markdown, JSON, JUnit, HTML) live in :mod:`stepscope.render`.
"""

from stepscope.analysis.compare.budgets import DEFAULT_BUDGETS, Budget, merge_budgets, parse_budget, parse_budgets
from stepscope.analysis.compare.comparison import ALPHA, Comparison, compare_profiles, compare_runs
from stepscope.analysis.compare.gate import BudgetResult, Verdict, Violation, check, evaluate, verdict

__all__ = [
    "ALPHA",
    "DEFAULT_BUDGETS",
    "Budget",
    "BudgetResult",
    "Comparison",
    "Verdict",
    "Violation",
    "check",
    "compare_profiles",
    "compare_runs",
    "evaluate",
    "merge_budgets",
    "parse_budget",
    "parse_budgets",
    "verdict",
]
