"""The comparison as titled tables (:class:`stepscope.render.table.Table`), built once from the
JSON contract and laid out by the terminal, Markdown and HTML renderers (so all show the same
rows with the same figures)."""

from __future__ import annotations

from typing import Any

from stepscope.render.compare_snapshots import snapshot_tables
from stepscope.render.table import Table
from stepscope.units import format_delta, format_value, signed_percent

TOP_NAMED = 10
"""Kernels, collectives and copies shown: the largest moves first."""

NAME_WIDTH = 90


def _short(name: str) -> str:
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 3] + "..."


def _runs(runs: list[str], one: str) -> str:
    return one if len(runs) <= 1 else f"{len(runs)} runs ({', '.join(runs)})"


def headline(doc: dict[str, Any]) -> str:
    """``PASS``/``REGRESSION``/``INCONCLUSIVE``/``NO_BASELINE``: baseline run(s) -> candidate run(s)."""
    base = _runs(doc["baseline_runs"], doc["baseline"]["run"]) if doc["baseline"] else "none yet"
    cand = _runs(doc["candidate_runs"], doc["candidate"]["run"])
    return f"{doc['verdict']['status'].upper()}: baseline {base} -> candidate {cand}"


def run_line(facts: dict[str, Any] | None, absent: str | None = None) -> str:
    """One line on a run's hardware and layout; ``absent`` says why there is no run."""
    if facts is None:
        return f"none: {absent or 'not available'}"
    gpus = ", ".join(facts["gpu_names"]) or "no GPU recorded"
    count = f" x{facts['gpu_count']}" if facts["gpu_count"] else ""
    world = f", world size {facts['world_size']}" if facts["world_size"] else ""
    return f"{facts['run']}: {gpus}{count}{world}, ranks {', '.join(map(str, facts['ranks']))}, {facts['steps']} profiled steps"


def budget_table(doc: dict[str, Any]) -> Table:
    judged = doc["verdict"]["status"] not in ("inconclusive", "no_baseline")
    rows = []
    for b in doc["budgets"]:
        result = b["status"].upper() if judged else "not judged"
        rows.append([b["budget"], format_value(b["baseline"], b["unit"]), format_value(b["candidate"], b["unit"]),
                     signed_percent(b["delta_pct"]), _noise(b["noise"], b["unit"]), b["decided_by"], result])
    note = ("noise: the run-to-run spread a change must exceed beyond its budget to fail, and stay under it "
            "to pass ('assumed' with one run a side: not measured); in between is the grey zone (inconclusive).")
    return Table.of_text("Budgets", ["budget", "baseline", "candidate", "change", "noise", "decided by", "result"],
                         rows, note)


def _noise(noise: dict[str, Any] | None, unit: str) -> str:
    if noise is None:
        return "n/a"
    load = noise.get("load") or {}
    inflation = f", load x{1 + load['inflation']:.2f}" if load.get("inflation") else ""
    return f"+-{format_value(noise['margin'], unit)}{'' if noise['measured'] else ' assumed'}{inflation}"


def metric_table(doc: dict[str, Any]) -> Table:
    rows = []
    for m in doc["metrics"]:
        def side(s: dict[str, Any] | None) -> str:
            if s is None:
                return "n/a"
            if m["statistic"] == "max":
                return format_value(s["max"], m["unit"])
            return (f"{format_value(s['median'], m['unit'])} "
                    f"[{format_value(s['p25'], m['unit'])}-{format_value(s['p75'], m['unit'])}]")
        worse = m["p_increase"] if (m["delta"] or 0) >= 0 else m["p_decrease"]
        rows.append([m["label"], side(m["baseline"]), side(m["candidate"]), format_delta(m["delta"], m["unit"]),
                     signed_percent(m["delta_pct"]), format_value(worse, "p")])
    note = (f"a side's value: the median over its runs of each run's median per step (peak memory: the "
            f"highest step peak) [p25-p75 of every step of its runs]. Step time from "
            f"{doc['step_time_source']}; wall time still shown. p: one-sided Mann-Whitney U over the runs' "
            f"values in the direction of the change (alpha {doc['alpha']:g}; with 3 runs against 1 it cannot "
            f"go below 0.25, and claims no more).")
    return Table.of_text("Step breakdown", ["metric", "baseline", "candidate", "delta", "change", "p"], rows, note)


def _named_rows(items: list[dict[str, Any]], unit: str) -> list[list[str]]:
    moved = [i for i in items if i["status"] != "same"]
    moved.sort(key=lambda i: (-abs((i["candidate"] or 0) - (i["baseline"] or 0)), i["name"]))
    return [[_short(i["name"]), i["status"], format_value(i["baseline"], unit), format_value(i["candidate"], unit),
             signed_percent(i["delta_pct"])] for i in moved[:TOP_NAMED]]


def named_table(doc: dict[str, Any], key: str, title: str, unit: str, what: str) -> Table:
    items = doc[key]
    header = [what, "status", "baseline", "candidate", "change"]
    if items is None:
        return Table.of_text(title, header, [], doc.get("absent_reasons", {}).get(key, "not available"))
    rows = _named_rows(items, unit)
    return Table.of_text(title, header, rows, None if rows else "no differences")


def comparability_table(doc: dict[str, Any]) -> Table:
    def show(v: Any) -> str:
        if v is None:
            return "n/a"
        if isinstance(v, list):
            return _short(", ".join(str(x) for x in v)) or "none"
        if isinstance(v, dict):
            return ", ".join(f"{k} {x:g}" for k, x in v.items()) or "none"
        return str(v)

    rows = [[c["check"], {True: "ok", False: "DIFFERS", None: "not checked"}[c["ok"]], show(c["baseline"]),
             show(c["candidate"])] for c in doc["comparability"]["checks"]]
    return Table.of_text("Comparability", ["check", "result", "baseline", "candidate"], rows)


def tables(doc: dict[str, Any]) -> list[Table]:
    """Every table of the report, in order."""
    return [
        budget_table(doc),
        metric_table(doc),
        named_table(doc, "kernels", "Kernels (time per step, largest changes)", "ns", "kernel"),
        named_table(doc, "collectives", "Collectives (bus bandwidth)", "gbps", "collective"),
        named_table(doc, "copies", "Copies (bandwidth)", "gbps", "copy"),
        comparability_table(doc),
        *snapshot_tables(doc),
    ]
