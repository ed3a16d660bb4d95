"""The verdict: per run, the step, what bounds it, and the findings in order of time at stake.

The summary's first screen and the dashboard's Overview open with it; the JSON carries it as
``verdict`` (docs/SUMMARY_JSON.md). Definitions (docs/ANALYSIS.md, "The verdict"):

- ``basis``: the one step every share and per-step figure is stated against, the mean step
  window over every rank and profiled step (:mod:`stepscope.analysis.basis`), with its median,
  range and number of windows. ``mean_step_ns`` is its step; ``step_ns`` the median of the same
  windows (:mod:`stepscope.analysis.quantiles`), kept beside it.
- ``bound_by``: the breakdown's finest parts (leaves), each with ``share`` = its time summed
  over every rank and step / the step windows summed (the shares of all leaves sum to 1) and
  ``ns`` = share x the basis step (so the ``ns`` of all leaves sum to it); the largest first, those
  with 5% or more, at most four. On a run where no collective was matched across ranks, waiting
  cannot be told from transfer, so exposed communication stays one part there.
- ``findings``: every finding, in order of time at stake (:func:`stepscope.analysis.findings.evaluate`),
  each with ``share_of_step`` = its time at stake / the basis step.
- ``clock_corrections``: the ranks whose clocks were corrected before waits and lateness were
  computed (:func:`stepscope.analysis.matching.clock_offsets`), relative to the reference rank.
- ``whole_trace``: on a run without steps, what the device did over each trace instead
  (:mod:`stepscope.analysis.whole_trace`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from stepscope.analysis.absent import NO_STEPS, Absent
from stepscope.analysis.basis import step_basis
from stepscope.analysis.findings import Finding
from stepscope.store.rankstats.parts import GPU, HOST, PEER_WAITS, Breakdown, Part
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
    """What bounds the step: parts by share of the summed step windows, ``ns`` of the basis step
    ``step_ns`` (module docs)."""
    total = sum(table.column("dur_ns").to_pylist())
    if not total:
        return []
    shares = [(p, sum(table.column(p.column).to_pylist()) / total) for p in _parts(breakdown, waits_known)]
    shares.sort(key=lambda item: -item[1])
    named = [(p, s) for p, s in shares if s >= BOUND_BY_MIN_SHARE][:BOUND_BY_MAX] or shares[:1]
    return [{"part": p.name, "label": p.label, "ns": round(s * step_ns), "share": round(s, 4)} for p, s in named]


def run_facts(store: SQLStore, run: str) -> dict[str, Any]:
    """What the first line says about the run: its name, ranks traced, world size, backend, GPU;
    ``start_ns``, the start of its earliest trace, is what times in the tables are relative to."""
    rows = store.sql("SELECT name, ranks, world_size, backend, gpu_name, gpu_count, "
                     "(SELECT min(trace_start_ns) FROM sources WHERE run = $run) AS start_ns FROM runs WHERE run = $run",
                     {"run": run}).to_pylist()
    return rows[0] if rows else {"name": run}


def _finding_json(finding: Finding, step_ns: float | None) -> dict[str, Any]:
    out = finding.to_json()
    stake = finding.time_at_stake_ns
    out["share_of_step"] = round(stake / step_ns, 4) if stake is not None and step_ns else None
    return out


def verdict(store: SQLStore, run: str, ranks_result: object, findings: Sequence[Finding], offsets: pa.Table,
            whole_trace: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``verdict`` object (module docs). ``ranks_result``: the ``ranks`` section's result (the
    GPU and host step breakdowns of the ranks reported); ``offsets``:
    :func:`stepscope.analysis.matching.clock_offsets` (which ranks' collectives were matched, whose
    clocks were corrected); ``whole_trace``: the run's whole-trace verdict, for a run without steps."""
    gpu, host = getattr(ranks_result, "breakdown"), getattr(ranks_result, "host")
    table, breakdown = (gpu, GPU) if isinstance(gpu, pa.Table) and gpu.num_rows else (host, HOST)
    rows = offsets.to_pylist()
    waits_known = any(r["instances"] for r in rows)
    basis = step_basis(ranks_result)
    out: dict[str, Any] = {
        "run": run_facts(store, run),
        "findings": [_finding_json(f, basis.step_ns if basis else None) for f in findings],
        "clock_corrections": [{"rank": r["rank"], "ns": r["clock_correction_ns"],
                               "reference_rank": r["reference_rank"]} for r in rows if r["clock_correction_ns"]],
    }
    if basis is None or not isinstance(table, pa.Table):
        out.update(step_ns=Absent(table.reason if isinstance(table, Absent) else NO_STEPS), mean_step_ns=None,
                   basis=None, bound_by=[], breakdown=None, ranks=0, steps=0)
        if whole_trace is not None:
            out["whole_trace"] = whole_trace
        return out
    out.update(step_ns=round(basis.median_ns), mean_step_ns=round(basis.step_ns), basis=basis.to_json(),
               breakdown=breakdown.name, ranks=basis.ranks, steps=len(set(table.column("step").to_pylist())),
               bound_by=bound_by(table, breakdown, basis.step_ns, waits_known))
    return out
