"""The verdict: per run, the median step, what bounds it, and the findings in order of time at stake.

The summary's first screen and the dashboard's Overview open with it; the JSON carries it as
``verdict`` (docs/SUMMARY_JSON.md). Definitions (docs/ANALYSIS.md, "The verdict"):

- ``step_ns``: the median step window (:mod:`stepscope.analysis.quantiles`) over every rank and
  profiled step of the GPU step breakdown, or of the host breakdown on a run without GPU events.
- ``bound_by``: the breakdown's finest parts (leaves), each with ``share`` = its time summed
  over every rank and step / the step windows summed (the shares of all leaves sum to 1) and
  ``ns`` = share x ``step_ns``; the largest first, those with 5% or more, at most four. On a run
  where no collective was matched across ranks, waiting cannot be told from transfer, so
  exposed communication stays one part there.
- ``findings``: every finding, in order of time at stake (:func:`stepscope.analysis.findings.evaluate`);
  ``mean_step_ns``, the mean of the same windows, is what a finding's time at stake (a mean per
  step) is a share of.
- ``clock_corrections``: the ranks whose clocks were corrected before waits and lateness were
  computed (:func:`stepscope.analysis.matching.clock_offsets`), relative to the reference rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from stepscope.analysis.absent import NO_STEPS, Absent
from stepscope.analysis.findings import Finding
from stepscope.store.rankstats.parts import GPU, HOST, PEER_WAITS, Breakdown, Part
from stepscope.analysis.quantiles import median
from stepscope.analysis.sections import SQLStore

BOUND_BY_MIN_SHARE = 0.05
"""Parts below this share of the step are not named among what bounds it."""
BOUND_BY_MAX = 4


def _parts(breakdown: Breakdown, waits_known: bool) -> list[Part]:
    """The leaves, with a wait-split part kept whole when no wait is known."""
    out: list[Part] = []
    for part in breakdown.parts:
        split_by_waits = any(s in PEER_WAITS for s in part.sub_parts)
        out.extend(part.sub_parts if part.sub_parts and (waits_known or not split_by_waits) else (part,))
    return out


def bound_by(table: pa.Table, breakdown: Breakdown, step_ns: float, waits_known: bool) -> list[dict[str, Any]]:
    """What bounds the step: parts by share of the summed step windows (module docs)."""
    total = sum(table.column("dur_ns").to_pylist())
    if not total:
        return []
    shares = [(p, sum(table.column(p.column).to_pylist()) / total) for p in _parts(breakdown, waits_known)]
    shares.sort(key=lambda item: -item[1])
    named = [(p, s) for p, s in shares if s >= BOUND_BY_MIN_SHARE][:BOUND_BY_MAX] or shares[:1]
    return [{"part": p.name, "label": p.label, "ns": round(s * step_ns), "share": round(s, 4)} for p, s in named]


def run_facts(store: SQLStore, run: str) -> dict[str, Any]:
    """What the first line says about the run: its name, ranks traced, world size, backend, GPU."""
    rows = store.sql("SELECT name, ranks, world_size, backend, gpu_name, gpu_count FROM runs WHERE run = $run",
                     {"run": run}).to_pylist()
    return rows[0] if rows else {"name": run}


def verdict(store: SQLStore, run: str, breakdowns: tuple[pa.Table | Absent, pa.Table | Absent],
            findings: Sequence[Finding], offsets: pa.Table) -> dict[str, Any]:
    """The ``verdict`` object (module docs). ``breakdowns``: the GPU and host step breakdowns of
    the ranks reported; ``offsets``: :func:`stepscope.analysis.matching.clock_offsets` (which
    ranks' collectives were matched, whose clocks were corrected)."""
    gpu, host = breakdowns
    table, breakdown = (gpu, GPU) if isinstance(gpu, pa.Table) and gpu.num_rows else (host, HOST)
    rows = offsets.to_pylist()
    waits_known = any(r["instances"] for r in rows)
    out: dict[str, Any] = {
        "run": run_facts(store, run), "findings": [f.to_json() for f in findings],
        "clock_corrections": [{"rank": r["rank"], "ns": r["clock_correction_ns"],
                               "reference_rank": r["reference_rank"]} for r in rows if r["clock_correction_ns"]],
    }
    if not isinstance(table, pa.Table) or table.num_rows == 0:
        out.update(step_ns=Absent(table.reason if isinstance(table, Absent) else NO_STEPS), mean_step_ns=None,
                   bound_by=[], breakdown=None, ranks=0, steps=0)
        return out
    durations = table.column("dur_ns").to_pylist()
    step_ns = median(durations)
    out.update(step_ns=round(step_ns), mean_step_ns=round(sum(durations) / len(durations)), breakdown=breakdown.name,
               ranks=len(set(table.column("rank").to_pylist())), steps=len(set(table.column("step").to_pylist())),
               bound_by=bound_by(table, breakdown, step_ns, waits_known))
    return out
