"""The verdict of a run without steps: what the device did over each trace, with its idle causes.

A trace recorded without ``ProfilerStep#N`` (no ``prof.step()`` calls) has no step to state
figures per; its whole-trace totals still say where the time went. This applies the step
breakdown's rules (the same parts, the same HTA idle causes) to one window per trace: the span
of its GPU work (a rank's traces are windows of their own, so the gap between two profiled
windows is never counted), or on a run without GPU events the trace's recorded span with the host
breakdown. Definitions: docs/ANALYSIS.md, "A run without steps".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from stepscope.analysis._sql import rank_filter
from stepscope.analysis.breakdown import parts_over, rank_status
from stepscope.analysis.sections import SQLStore
from stepscope.analysis.verdict import bound_by
from stepscope.store.rankstats.parts import GPU, HOST, IDLE, Breakdown
from stepscope.units import duration

HOW_TO_MARK_STEPS = (
    "steps were not marked: call prof.step() once per training step inside torch.profiler.profile(schedule=...) "
    "(each call records a ProfilerStep#N), or profile with stepscope.profile(store=..., run=...), whose prof.step() "
    "does the same; per-step figures, the step basis and the step findings need them")
"""What the verdict of a run without steps says about how to get steps."""

_GPU_WINDOWS = """
SELECT rank, row_number() OVER (PARTITION BY rank ORDER BY gpu_start_ns) AS key, gpu_start_ns AS w0, gpu_end_ns AS w1
FROM rank_gpu_totals WHERE run = $run AND scope = 'all' AND gpu_end_ns > gpu_start_ns AND {rf}
"""
_HOST_WINDOWS = """
SELECT rank, row_number() OVER (PARTITION BY rank ORDER BY trace_start_ns) AS key, trace_start_ns AS w0,
       trace_end_ns AS w1
FROM sources WHERE run = $run AND trace_end_ns > trace_start_ns AND {rf}
"""


def _windows(store: SQLStore, run: str, ranks: Sequence[int] | None) -> tuple[list[tuple[int, int, int, int]], Breakdown]:
    """One window per trace: its GPU span (GPU breakdown), else its recorded span (host)."""
    rf, extra = rank_filter(ranks)
    for query, breakdown in ((_GPU_WINDOWS, GPU), (_HOST_WINDOWS, HOST)):
        rows = store.sql(query.format(rf=rf), {"run": run, **extra}).to_pylist()
        if rows:
            return [(r["rank"], r["key"], r["w0"], r["w1"]) for r in rows], breakdown
    return [], GPU


def whole_trace_verdict(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> dict[str, Any] | None:
    """The whole-trace verdict of a run none of whose ranks has steps, else None (module docs).

    ``breakdown``; ``traces``, ``ranks``; ``span_ns`` (the windows summed); ``bound_by`` (as the
    verdict's, ``ns`` = the part's time over every window); ``idle_causes`` (every cause of the
    GPU's idle time, ``ns`` and ``share`` of the span); ``statement`` (the sentence the first
    screen prints) and ``how_to_mark_steps``.
    """
    status = rank_status(store, run).to_pylist()
    wanted = [r for r in status if ranks is None or r["rank"] in ranks]
    if not wanted or any(r["steps"] for r in wanted):
        return None
    windows, breakdown = _windows(store, run, ranks)
    if not windows:
        return None
    table = parts_over(store, run, breakdown, windows)
    table = table.append_column("dur_ns", pc.subtract(table.column("w1"), table.column("w0")))
    span = sum(table.column("dur_ns").to_pylist())
    parts = bound_by(table, breakdown, span, waits_known=False)
    out: dict[str, Any] = {"breakdown": breakdown.name, "traces": len(windows),
                           "ranks": len({w[0] for w in windows}), "span_ns": span, "bound_by": parts,
                           "idle_causes": _idle_causes(table, span) if breakdown is GPU else [],
                           "how_to_mark_steps": HOW_TO_MARK_STEPS}
    out["statement"] = _statement(out)
    return out


def _idle_causes(table: pa.Table, span: int) -> list[dict[str, Any]]:
    return [{"part": c.name, "label": c.label, "ns": total, "share": round(total / span, 4) if span else None}
            for c in IDLE.sub_parts if (total := sum(table.column(c.column).to_pylist()))]


def _statement(doc: dict[str, Any]) -> str:
    """``GPU idle 86% of the 14.5 s its work spans (GPU idle: host wait 80%, ...); compute 12%``."""
    where = "its GPU work spans" if doc["breakdown"] == "gpu" else "the traces span (host time: no GPU events)"
    parts = "; ".join(f"{p['label']} {100 * p['share']:.0f}%" for p in doc["bound_by"])
    causes = ", ".join(f"{c['label'].removeprefix('GPU idle: ')} {100 * c['share']:.0f}%" for c in doc["idle_causes"])
    idle = f" (idle causes: {causes})" if causes else ""
    return (f"over the {duration(doc['span_ns'])} {where} in {doc['traces']} trace"
            f"{'s' if doc['traces'] != 1 else ''}: {parts}{idle}")
