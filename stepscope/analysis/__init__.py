"""Analyses over a stepscope store: DuckDB SQL in, Arrow/pandas frames or frozen dataclasses out.

No UI code and no torch here: the CLI and the dashboard render what these functions return.
Shared conventions:

- :mod:`~stepscope.analysis.absent`: a figure that cannot be computed is
  :class:`Absent` with a reason, never 0.
- :mod:`~stepscope.analysis.sections`: the registry of summary sections (``stepscope summary``
  prints one JSON key per section).
- :mod:`~stepscope.analysis.findings`: the registry of rules turning results into findings.
"""

from stepscope.analysis.absent import Absent, Maybe, is_absent, jsonable
from stepscope.analysis.findings import RULES, Finding, Rule, Severity, evaluate, rule
from stepscope.analysis.sections import SECTIONS, Section, SQLStore, compute_sections, section



def __getattr__(name: str) -> object:
    """``stepscope.analysis.what_if`` (:mod:`.replay`), imported when first asked for."""
    if name == "what_if":
        from stepscope.analysis.replay import what_if

        return what_if
    raise AttributeError(name)


__all__ = [
    "RULES",
    "SECTIONS",
    "Absent",
    "Finding",
    "Maybe",
    "Rule",
    "SQLStore",
    "Section",
    "Severity",
    "compute_sections",
    "evaluate",
    "is_absent",
    "jsonable",
    "rule",
    "section",
    "what_if",
]
