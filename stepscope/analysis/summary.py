"""The summary of one run: per-rank steps and totals, kernels and ops, other sections, findings.

``build_summary(store, run)`` returns the JSON document documented in docs/SUMMARY_JSON.md;
``stepscope summary`` prints it or renders it. Two sections live here: ``ranks`` (the step
breakdown, host breakdown, HTA-style totals and step statistics of every rank) and ``kernels``
(top kernels, top CPU ops, launch overhead); other analyses register their own sections.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from stepscope.analysis.absent import NO_GPU_EVENTS, NO_STEPS, Absent, jsonable
from stepscope.analysis.breakdown import (
    absence,
    host_breakdown,
    rank_status,
    rank_totals,
    step_breakdown,
)
from stepscope.analysis.findings import Finding, Results, Severity, evaluate, rule
from stepscope.analysis.kernels import launch_overhead, step_stats, top_cpu_ops, top_kernels
from stepscope.analysis.parts import DATA_LOADING, GPU, HOST, IDLE, IDLE_HOST_WAIT, IDLE_KERNEL_WAIT, IDLE_OTHER
from stepscope.analysis.quantiles import median
from stepscope.analysis.sections import SQLStore, compute_sections, section

SUMMARY_VERSION = 1
"""Bumped when a key of the summary JSON changes meaning or disappears (adding keys does not)."""

TOTALS_KEYS = (
    "gpu_span_ns",
    "gpu_idle_ns",
    "compute_ns",
    "non_compute_ns",
    "comm_comp_overlap_pct",
    "gpu_busy_ns",
    "comm_ns",
    "comm_comp_overlap_ns",
)
GPU_STEP_KEYS = GPU.all_columns
"""Per-step keys of GPU runs: the disjoint parts, then the hidden parts and the sub-parts."""
HOST_STEP_KEYS = HOST.all_columns


@dataclass(frozen=True)
class RanksResult:
    """Everything per rank: the frames the ``ranks`` section and the rules read.

    ``breakdown``/``host``: :func:`step_breakdown` / :func:`host_breakdown` or ``Absent``;
    ``totals``/``totals_hta``: :func:`rank_totals` (default and HTA scope); ``stats``:
    :func:`step_stats`; ``status``: :func:`rank_status`; ``ranks``: the ranks reported.
    """

    ranks: tuple[int, ...]
    status: pa.Table
    breakdown: pa.Table | Absent
    host: pa.Table | Absent
    totals: pa.Table
    totals_hta: pa.Table
    stats: pa.Table


def _by_rank(table: pa.Table | Absent) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    if isinstance(table, Absent):
        return out
    for row in table.to_pylist():
        out.setdefault(row["rank"], []).append(row)
    return out


def _present_ranks(status: pa.Table, wanted: Sequence[int] | None) -> list[int]:
    have = [r for r in status.column("rank").to_pylist()]
    return list(wanted) if wanted is not None else have


@section("ranks", order=10, to_json=lambda r: ranks_json(r))
def ranks_section(store: SQLStore, run: str, ranks: Sequence[int] | None) -> RanksResult:
    """Per rank: every step's GPU and host breakdown, whole-trace totals (HTA definitions) and
    step-time statistics."""
    status = rank_status(store, run)
    return RanksResult(
        ranks=tuple(_present_ranks(status, ranks)),
        status=status,
        breakdown=step_breakdown(store, run, ranks),
        host=host_breakdown(store, run, ranks),
        totals=rank_totals(store, run, ranks),
        totals_hta=rank_totals(store, run, ranks, hta_scope=True),
        stats=step_stats(store, run, ranks),
    )


def _totals_json(row: dict[str, Any] | None, reason: str | None) -> dict[str, Any]:
    if row is None or row["absent_reason"]:
        why = reason or (row or {}).get("absent_reason") or NO_GPU_EVENTS
        return {key: Absent(why) for key in TOTALS_KEYS}
    out: dict[str, Any] = {key: row[key] for key in TOTALS_KEYS}
    if row["overlap_absent_reason"]:
        out["comm_comp_overlap_pct"] = Absent(row["overlap_absent_reason"])
    return out


def ranks_json(result: RanksResult) -> list[dict[str, Any]]:
    """The ``ranks`` list of the summary JSON (docs/SUMMARY_JSON.md)."""
    gpu = _by_rank(result.breakdown)
    host = {r: {row["step"]: row for row in rows} for r, rows in _by_rank(result.host).items()}
    totals = {row["rank"]: row for row in result.totals.to_pylist()}
    totals_hta = {row["rank"]: row for row in result.totals_hta.to_pylist()}
    stats = _by_rank(result.stats)
    out: list[dict[str, Any]] = []
    for rank in result.ranks:
        missing = absence(result.status, rank, needs_steps=False, needs_gpu=False)
        if missing:
            out.append({"rank": rank, "steps": Absent(missing), "totals": Absent(missing),
                        "step_stats": Absent(missing)})
            continue
        no_steps = absence(result.status, rank, needs_steps=True, needs_gpu=False)
        no_gpu = absence(result.status, rank, needs_steps=False, needs_gpu=True)
        steps: list[dict[str, Any]] | Absent
        if no_steps:
            steps = Absent(no_steps)
        else:
            steps = []
            gpu_rows = {row["step"]: row for row in gpu.get(rank, [])}
            for step, host_row in sorted(host.get(rank, {}).items()):
                gpu_row = gpu_rows.get(step)
                item: dict[str, Any] = {"step": step}
                if gpu_row is not None:
                    item["dur_ns"] = gpu_row["dur_ns"]
                    item["start_ns"] = gpu_row["start_ns"]
                    item["end_ns"] = gpu_row["end_ns"]
                    item["cpu_dur_ns"] = gpu_row["cpu_dur_ns"]
                    item.update({key: gpu_row[key] for key in GPU_STEP_KEYS})
                else:
                    item["dur_ns"] = host_row["dur_ns"]
                    item["start_ns"] = host_row["start_ns"]
                    item["end_ns"] = host_row["end_ns"]
                    item["cpu_dur_ns"] = host_row["dur_ns"]
                    item.update({key: Absent(no_gpu or NO_GPU_EVENTS) for key in GPU_STEP_KEYS})
                item["host"] = {key: host_row[key] for key in HOST_STEP_KEYS}
                item["host"]["dur_ns"] = host_row["dur_ns"]
                steps.append(item)
        totals_obj = _totals_json(totals.get(rank), no_gpu)
        totals_obj["hta_scope"] = _totals_json(totals_hta.get(rank), no_gpu)
        out.append({
            "rank": rank,
            "steps": steps,
            "totals": totals_obj,
            "step_stats": [{k: v for k, v in row.items() if k not in ("run", "rank")} for row in stats.get(rank, [])]
            or Absent(NO_STEPS),
        })
    return out


@dataclass(frozen=True)
class KernelsResult:
    """Top GPU work, top CPU ops and launch overhead (frames of :mod:`stepscope.analysis.kernels`)."""

    top_kernels: pa.Table
    top_cpu_ops: pa.Table
    launch_overhead: pa.Table


TOP_N = 10


@section("kernels", order=20, to_json=lambda r: kernels_json(r))
def kernels_section(store: SQLStore, run: str, ranks: Sequence[int] | None) -> KernelsResult:
    """Per rank: the GPU kernels and CPU ops with the most time, and launch overhead."""
    return KernelsResult(
        top_kernels=top_kernels(store, run, TOP_N, ranks),
        top_cpu_ops=top_cpu_ops(store, run, TOP_N, ranks),
        launch_overhead=launch_overhead(store, run, ranks),
    )


def kernels_json(result: KernelsResult) -> dict[str, Any]:
    def rows(table: pa.Table) -> list[dict[str, Any]]:
        return [
            {k: (Absent(NO_STEPS) if k == "share_of_steps_pct" and v is None else v)
             for k, v in row.items() if k != "run"}
            for row in table.to_pylist()
        ]

    return {
        "top_kernels": rows(result.top_kernels),
        "top_cpu_ops": rows(result.top_cpu_ops),
        "launch_overhead": rows(result.launch_overhead),
    }


def build_summary(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> dict[str, Any]:
    """The summary document of ``run`` (JSON-ready; contract in docs/SUMMARY_JSON.md).

    Cached per run (``stepscope.analysis.cache.cached_json``): a run's traces do not change,
    so the second summary of a run is read back instead of recomputed.
    """
    from stepscope.analysis.cache import cached_json

    wanted = None if ranks is None else sorted(int(r) for r in ranks)
    return cached_json(store, "summary", run, wanted, lambda: _compute_summary(store, run, wanted))


def _compute_summary(store: SQLStore, run: str, ranks: Sequence[int] | None) -> dict[str, Any]:
    from stepscope.analysis.sections import all_sections

    results = compute_sections(store, run, ranks)
    doc: dict[str, Any] = {"summary_version": SUMMARY_VERSION, "run": run}
    for s in all_sections():
        result = results[s.name]
        doc[s.name] = result if isinstance(result, Absent) else s.to_json(result)
    doc["findings"] = [f.to_json() for f in evaluate(results)]
    return jsonable(doc)


# ---- findings on the ranks section ----

IDLE_WARNING_PCT = 30.0
"""A step whose GPU is idle this share of its window or more is worth a look."""
IDLE_CRITICAL_PCT = 50.0
DATA_LOADING_WARNING_PCT = 10.0
"""Median share of the ProfilerStep the host spends inside ``enumerate(DataLoader)#...``."""
STEP_SPREAD_WARNING_PCT = 25.0
"""(max - min) / median of the ProfilerStep times, with at least 3 steps."""

_IDLE_CAUSE_ADVICE = {
    IDLE_HOST_WAIT: "mostly host wait: the CPU is not launching work fast enough",
    IDLE_KERNEL_WAIT: "mostly short gaps between kernels: launch latency of many small kernels",
    IDLE_OTHER: "mostly waits on other streams, events or synchronisation",
}
"""Advice per idle sub-part (cause); the evidence names a cause without the ``idle_`` prefix."""


@rule("gpu.idle", needs=("ranks",))
def gpu_idle(results: Results) -> Iterator[Finding]:
    """GPU idle for a large share of a step, with the dominant HTA cause (and the host's data
    loading time when it is significant)."""
    ranks: RanksResult = results["ranks"]  # type: ignore[assignment]
    host = _by_rank(ranks.host)
    for rank, rows in sorted(_by_rank(ranks.breakdown).items()):
        idle = [(100 * r[IDLE.column] / r["dur_ns"], r) for r in rows if r["dur_ns"] > 0]
        flagged = [(pct, r) for pct, r in idle if pct >= IDLE_WARNING_PCT]
        if not flagged:
            continue
        worst_pct, worst = max(flagged, key=lambda item: item[0])
        causes = {c: worst[c.column] for c in IDLE.sub_parts}
        cause = max(causes, key=lambda c: causes[c])
        message = (f"GPU idle {worst_pct:.0f}% of step {worst['step']} on rank {rank} "
                   f"({len(flagged)} of {len(idle)} steps at {IDLE_WARNING_PCT:.0f}% or more), "
                   f"{_IDLE_CAUSE_ADVICE[cause]}")
        loading = [h[DATA_LOADING.column] for h in host.get(rank, [])]
        data_ms = median(loading) / 1e6 if loading else 0.0
        if cause == IDLE_HOST_WAIT and data_ms > 0:
            message += f" (data loading {data_ms:.1f} ms/step)"
        yield Finding(
            Severity.CRITICAL if worst_pct >= IDLE_CRITICAL_PCT else Severity.WARNING,
            "gpu.idle",
            message,
            {"rank": rank, "step": worst["step"], "idle_pct": round(worst_pct, 2),
             "steps_flagged": len(flagged), "steps": len(idle), "cause": cause.name.removeprefix(f"{IDLE.name}_"),
             **{c.column: v for c, v in causes.items()}, "data_loading_ms_per_step": round(data_ms, 3)},
        )


@rule("host.data_loading", needs=("ranks",))
def host_data_loading(results: Results) -> Iterator[Finding]:
    """The host spends a large share of each step waiting for the DataLoader."""
    ranks: RanksResult = results["ranks"]  # type: ignore[assignment]
    for rank, rows in sorted(_by_rank(ranks.host).items()):
        shares = [100 * r[DATA_LOADING.column] / r["dur_ns"] for r in rows if r["dur_ns"] > 0]
        if not shares or median(shares) < DATA_LOADING_WARNING_PCT:
            continue
        median_ms = median([r[DATA_LOADING.column] for r in rows]) / 1e6
        yield Finding(
            Severity.WARNING,
            "host.data_loading",
            f"data loading takes {median(shares):.0f}% of each step on rank {rank} "
            f"({median_ms:.1f} ms/step, median): use DataLoader workers, pinned memory and prefetching",
            {"rank": rank, "data_loading_pct_median": round(median(shares), 2),
             "data_loading_ms_median": round(median_ms, 3), "steps": len(shares)},
        )


@rule("steps.unstable", needs=("ranks",))
def steps_unstable(results: Results) -> Iterator[Finding]:
    """Step times vary a lot between steps of one rank (warm-up, stalls, recompilation)."""
    ranks: RanksResult = results["ranks"]  # type: ignore[assignment]
    for row in ranks.stats.to_pylist():
        if row["steps"] < 3 or row["spread_pct"] is None or row["spread_pct"] < STEP_SPREAD_WARNING_PCT:
            continue
        yield Finding(
            Severity.WARNING,
            "steps.unstable",
            f"step time varies by {row['spread_pct']:.0f}% on rank {row['rank']} "
            f"(median {row['median_ns'] / 1e6:.1f} ms, min {row['min_ns'] / 1e6:.1f} ms, "
            f"max {row['max_ns'] / 1e6:.1f} ms over {row['steps']} {row['source']}): "
            "profile steady-state steps, look for stalls or recompilation",
            {"rank": row["rank"], "source": row["source"], "steps": row["steps"],
             "spread_pct": round(row["spread_pct"], 2), "median_ns": row["median_ns"],
             "min_ns": row["min_ns"], "max_ns": row["max_ns"]},
        )
