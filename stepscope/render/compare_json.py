"""The comparison as JSON: the documented contract (docs/COMPARE_JSON.md) every other renderer
reads too, so the terminal table, the Markdown summary and the JSON never disagree."""

from __future__ import annotations

import json
from typing import Any

from stepscope.analysis.absent import Absent, jsonable
from stepscope.analysis.compare.comparison import Comparison, MetricDelta, NamedDelta
from stepscope.analysis.compare.gate import Verdict

SCHEMA = "stepscope.compare/3"
"""2: sides of several runs, the run-to-run noise, p-values over the runs' values, decided_by
noise/grey_zone, host parts, wall time. 3: a budget's ``change_low``/``change_high``; the step
time's ``noise.load`` is ``{baseline, candidate, worst, inflation}`` (was ``changed``,
``allowance``)."""


def _metric(m: MetricDelta) -> dict[str, Any]:
    def side(value: Any) -> Any:
        return value if isinstance(value, Absent) else value.to_json()

    out: dict[str, Any] = {
        "metric": m.metric, "label": m.label, "unit": m.unit, "statistic": m.statistic, "source": m.source,
        "baseline": side(m.baseline), "candidate": side(m.candidate),
        "delta": m.delta, "delta_pct": m.delta_pct,
        "baseline_run_values": list(m.base_runs), "candidate_run_values": list(m.cand_runs),
        "noise": None if m.noise is None else m.noise.to_json(),
        "p_increase": None if m.increase is None else m.increase.p_value,
        "p_decrease": None if m.decrease is None else m.decrease.p_value,
        "test": None if m.increase is None else m.increase.method,
    }
    if m.increase is None:
        out["absent_reasons"] = {"p_increase": m.absent_reason or "no per-step values",
                                 "p_decrease": m.absent_reason or "no per-step values",
                                 "test": m.absent_reason or "no per-step values"}
    if m.delta is None:
        out.setdefault("absent_reasons", {}).update(
            {"delta": m.absent_reason or "no value", "delta_pct": m.absent_reason or "no value"})
    elif m.delta_pct is None:
        out.setdefault("absent_reasons", {})["delta_pct"] = "the baseline's value is 0"
    return out


def _named(rows: Any, value_unit: str, count_name: str) -> Any:
    if isinstance(rows, Absent):
        return rows
    items: list[NamedDelta] = rows
    return [{"name": r.key, "status": r.status, "unit": value_unit, "baseline": r.baseline,
             "candidate": r.candidate, "delta": r.delta, "delta_pct": r.delta_pct,
             f"baseline_{count_name}": r.baseline_count, f"candidate_{count_name}": r.candidate_count}
            for r in items]


def to_json(comparison: Comparison, verdict: Verdict) -> dict[str, Any]:
    """The contract, as plain data (keys and meanings in docs/COMPARE_JSON.md)."""
    c = comparison
    no_baseline = isinstance(c.baseline, Absent)
    return jsonable({
        "schema": SCHEMA,
        "verdict": verdict.to_json(),
        "baseline": c.baseline if isinstance(c.baseline, Absent) else c.baseline.to_json(),
        "candidate": c.candidate.to_json(),
        "step_time_source": c.step_source,
        "baseline_runs": list(c.baseline_runs),
        "candidate_runs": list(c.candidate_runs),
        "alpha": c.alpha,
        "comparability": {"comparable": c.baseline if no_baseline else c.comparable,
                          "checks": [k.to_json() for k in c.checks]},
        "budgets": [r.to_json() for r in verdict.results],
        "metrics": [_metric(m) for m in c.metrics],
        "kernels": _named(c.kernels, "ns_per_step", "launches_per_step"),
        "collectives": _named(c.collectives, "busbw_gbps", "count"),
        "copies": _named(c.copies, "bandwidth_gbps", "bytes"),
        "findings": [f.to_json() for f in c.findings],
        **({} if c.snapshots is None else {"snapshots": c.snapshots}),
    })


def render_json(comparison: Comparison, verdict: Verdict) -> str:
    return json.dumps(to_json(comparison, verdict), indent=1, sort_keys=False) + "\n"
