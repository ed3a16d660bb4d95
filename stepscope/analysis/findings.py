"""Findings: rules that turn analysis results into plain statements with evidence.

One registry for every rule of every analysis. A rule is a function over the results of the
summary's sections (see :mod:`stepscope.analysis.sections`) that yields :class:`Finding` s.
Adding one is a decorator::

    from stepscope.analysis.findings import Finding, Severity, rule

    @rule("comm.exposed_allreduce", needs=("comm",))
    def exposed_allreduce(results):
        comm = results["comm"]            # whatever the "comm" section computed
        ...
        yield Finding(Severity.WARNING, "comm.exposed_allreduce",
                      "all-reduce exposed 22% of step 3 on rank 1: overlap with backward is poor",
                      {"rank": 1, "step": 3, "exposed_pct": 22.1})

A rule runs only when every section it ``needs`` was computed and is not
:class:`~stepscope.analysis.absent.Absent`, so rules never see a missing figure and never have
to invent one. Rules live in any module of the ``stepscope.analysis`` package (next to the
analysis they judge); :func:`stepscope.analysis.sections.load_modules` imports them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from stepscope.analysis.absent import Absent

Results = Mapping[str, object]
"""Section name -> that section's result (a frame, a dataclass, or :class:`Absent`)."""


class Severity(str, Enum):
    """How much a finding matters; the order is the order of the report."""

    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """0 for the most severe, for sorting."""
        return list(Severity).index(self)


@dataclass(frozen=True)
class Finding:
    """One plain statement, its severity, the rule that made it and the numbers behind it.

    ``evidence`` holds JSON-ready scalars (ints, floats, strings, lists of them) so the summary,
    the dashboard and the CI gate can show or compare them without recomputing. ``ranks``: the
    ranks the statement is about (one finding per cause, grouped across ranks).
    ``time_at_stake_ns``: the step time the cause costs, per step (on the worst of those ranks,
    averaged over the profiled steps); None for findings that are not about time (memory).
    """

    severity: Severity
    rule: str
    message: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    ranks: tuple[int, ...] = ()
    time_at_stake_ns: int | None = None
    leads: bool = False
    """A finding that explains a failure (``memory.oom``): it goes before every other one."""

    def to_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity.value,
            "rule": self.rule,
            "message": self.message,
            "evidence": dict(self.evidence),
            "ranks": list(self.ranks),
            "time_at_stake_ns": self.time_at_stake_ns,
        }


MIN_STAKE_NS = 1_000_000
"""The absolute floor beside every relative threshold: a cause costing less than 1 ms per step is
not a finding, whatever its share (0.19 ms of a 19.9 ms step is noise, not a straggler)."""


def ranks_phrase(ranks: Iterable[int]) -> str:
    """``rank 3``, ``ranks 1, 3, 4`` or ``ranks 0-7, 9``: runs of three or more consecutive
    ranks are written as a range."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ordered[i]}-{ordered[j]}")
        else:
            parts.extend(str(r) for r in ordered[i:j + 1])
        i = j + 1
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(parts)


RuleFunc = Callable[[Results], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    """A registered rule: its id, the sections it reads, and the function."""

    id: str
    needs: tuple[str, ...]
    func: RuleFunc
    doc: str


RULES: dict[str, Rule] = {}
"""Every registered rule, by id. Filled by :func:`rule` when the analysis modules are imported."""


def rule(rule_id: str, *, needs: tuple[str, ...]) -> Callable[[RuleFunc], RuleFunc]:
    """Register ``func`` as the rule ``rule_id`` reading the sections ``needs``."""

    def register(func: RuleFunc) -> RuleFunc:
        if rule_id in RULES and RULES[rule_id].func is not func:
            raise ValueError(f"rule {rule_id!r} is registered twice")
        RULES[rule_id] = Rule(rule_id, tuple(needs), func, (func.__doc__ or "").strip())
        return func

    return register


Adjuster = Callable[[list[Finding], Results], list[Finding]]

ADJUSTERS: list[Adjuster] = []
"""Passes over every rule's findings before they are ordered (:func:`adjuster`): the replay's
time at stake (:mod:`stepscope.analysis.stakes`) replaces each rule's own estimate there."""


def adjuster(func: Adjuster) -> Adjuster:
    """Register ``func`` to rewrite the findings of :func:`evaluate` (after the rules, before
    the order)."""
    if func not in ADJUSTERS:
        ADJUSTERS.append(func)
    return func


def order_key(finding: Finding) -> tuple[bool, bool, int, int, str]:
    """The report order: the most time at stake first, findings that are not about time after
    the timed ones, then by severity and rule id."""
    stake = finding.time_at_stake_ns
    return (not finding.leads, stake is None, -(stake or 0), finding.severity.rank, finding.rule)


def evaluate(results: Results, rules: Iterable[Rule] | None = None) -> list[Finding]:
    """Run every applicable rule over ``results``, in :func:`order_key` order (time at stake).

    A rule whose needed sections are missing or :class:`Absent` is skipped: there is nothing
    to judge. A rule that yields a finding under another rule's id is a bug and raises.
    """
    if rules is None:
        from stepscope.analysis.sections import load_modules

        load_modules()
        rules = RULES.values()
    found: list[Finding] = []
    for r in rules:
        if any(name not in results or isinstance(results[name], Absent) for name in r.needs):
            continue
        for finding in r.func(results):
            if finding.rule != r.id:
                raise ValueError(f"rule {r.id!r} yielded a finding for {finding.rule!r}")
            found.append(finding)
    for adjust in ADJUSTERS:
        found = adjust(found, results)
    found.sort(key=order_key)
    return found
