"""The findings' time at stake from the replay: what the step would save if the cause went away.

Each rule estimates its own time at stake (the longest wait, a share of idle time, ...); those
overlap and none says what the step would take without the cause. Where the replay
(:mod:`stepscope.analysis.replay`) can express the change that removes a finding's cause, the
finding's ``time_at_stake_ns`` becomes the replayed saving per step (the unchanged replay minus
the changed one, mean over the steps), and its evidence says so: ``stake_from`` (``replay``),
``stake_change`` (the ``--change`` texts of ``stepscope whatif``), ``stake_error_ns`` (the error
bar: the unchanged replay against the measured steps) and ``rule_stake_ns`` (the rule's own
estimate). The findings are then ordered by it (:func:`stepscope.analysis.findings.order_key`).

A finding keeps its rule's estimate (``stake_from``: ``rule``) where the run has no critical
path or more than :data:`~stepscope.analysis.critical_path.REPLAYED_RANKS` ranks, where no change
is known for its rule, or where the replay finds the change saves nothing at all: the replay
does not model that cause on that run (the GPU's own order of kernels, a GPU rank whose host
never waits for its collectives), and 0 would be an invented figure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from stepscope.analysis.critical_path import REPLAYED_RANKS, CriticalPathResult
from stepscope.analysis.findings import Finding, Results, adjuster
from stepscope.analysis.replay import parse_change, replay


def _on(ranks: tuple[int, ...], change: str) -> str:
    return f"rank {','.join(str(r) for r in ranks)}: {change}" if ranks else change


CHANGES: dict[str, Callable[[Finding], list[str]]] = {
    "comm.late_rank": lambda f: [f"rank {r}: on time" for r in f.ranks],
    "comm.exposed": lambda f: [_on(f.ranks, "comm_exposed*0"), _on(f.ranks, "comm_transfer*0")],
    "copies.exposed": lambda f: [_on(f.ranks, "copies hidden")],
    "gpu.idle": lambda f: [_on(f.ranks, "no launch gaps")],
    "host.data_loading": lambda f: [_on(f.ranks, "data_loading*0")],
}
"""Rule id -> the changes that remove a finding's cause (on the ranks it is about)."""


@adjuster
def replayed_stakes(found: list[Finding], results: Results) -> list[Finding]:
    """Each finding with a known change, its time at stake from the replay (module docs)."""
    result = results.get("critical_path")
    if not isinstance(result, CriticalPathResult):
        return found
    if len(result.graph.ranks) > REPLAYED_RANKS:
        return found
    out = []
    for finding in found:
        make = CHANGES.get(finding.rule)
        if make is None:
            out.append(finding)
            continue
        texts = make(finding)
        what = replay(result.graph, "", [parse_change(t) for t in texts])
        if round(what.saving_ns) == 0:
            out.append(replace(finding, evidence={**finding.evidence, "stake_from": "rule", "stake_change": texts}))
            continue
        out.append(replace(finding, time_at_stake_ns=max(round(what.saving_ns), 0), evidence={
            **finding.evidence, "stake_from": "replay", "stake_change": texts,
            "stake_error_ns": round(what.error_ns), "rule_stake_ns": finding.time_at_stake_ns}))
    return out
