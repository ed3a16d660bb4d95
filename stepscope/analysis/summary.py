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

from stepscope.analysis.absent import NO_DATALOADER, NO_GPU_EVENTS, NO_STEPS, Absent, jsonable
from stepscope.analysis.basis import basis_of, quoted_rank
from stepscope.analysis.breakdown import (
    absence,
    host_breakdown,
    rank_status,
    rank_totals,
    step_breakdown,
)
from stepscope.analysis.findings import MIN_STAKE_NS, Finding, Results, Severity, evaluate, ranks_phrase, rule
from stepscope.analysis.kernels import launch_overhead, step_stats, top_cpu_ops, top_kernels
from stepscope.analysis.matching import NO_MATCH, clock_offsets
from stepscope.store.rankstats.parts import (
    DATA_LOADING,
    GPU,
    HOST,
    IDLE,
    IDLE_HOST_WAIT,
    IDLE_KERNEL_WAIT,
    IDLE_OTHER,
    PEER_WAITS,
    Part,
)
from stepscope.analysis.quantiles import median
from stepscope.analysis.sections import SQLStore, compute_sections, section
from stepscope.analysis.verdict import verdict
from stepscope.analysis.whole_trace import whole_trace_verdict
from stepscope.units import duration

SUMMARY_VERSION = 2
"""Bumped when a key of the summary JSON changes meaning or disappears (adding keys does not).
2: ``verdict.bound_by[].ns`` is a share of the mean step (the one basis), no longer of the median."""
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
    matched: frozenset[int] = frozenset()
    """Ranks with a collective matched with another traced rank's: their waits are known."""
    loaders: frozenset[int] = frozenset()
    """Ranks whose traces record ``enumerate(DataLoader)#...``: only there is data loading known
    (elsewhere it is absent, not 0)."""


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
    matched = frozenset(r["rank"] for r in clock_offsets(store, run).to_pylist() if r["instances"])
    loaders = frozenset(r["rank"] for r in store.sql(
        f"SELECT DISTINCT rank FROM events WHERE run = $run AND ({' OR '.join(DATA_LOADING.claims)})",
        {"run": run}).to_pylist())
    return RanksResult(
        ranks=tuple(_present_ranks(status, ranks)),
        status=status,
        breakdown=step_breakdown(store, run, ranks),
        host=host_breakdown(store, run, ranks),
        totals=rank_totals(store, run, ranks),
        totals_hta=rank_totals(store, run, ranks, hta_scope=True),
        stats=step_stats(store, run, ranks),
        matched=matched,
        loaders=loaders,
    )


def _unknown_waits(item: dict[str, Any]) -> None:
    """On a rank none of whose collectives was matched, waiting cannot be told from transfer:
    the wait split of both breakdowns is absent, not a claim of 0 waiting."""
    for wait in PEER_WAITS:
        parent = next(p for b in (GPU, HOST) for p in b.parts if wait in p.sub_parts)
        target = item if parent in GPU.parts else item["host"]
        if target.get(parent.column) is None:
            continue
        for sub in parent.sub_parts:
            target[sub.column] = Absent(NO_MATCH)


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
                if rank not in result.loaders:
                    item["host"][DATA_LOADING.column] = Absent(NO_DATALOADER)
                item["host"]["dur_ns"] = host_row["dur_ns"]
                if rank not in result.matched:
                    _unknown_waits(item)
                steps.append(item)
        totals_obj = _totals_json(totals.get(rank), no_gpu)
        totals_obj["hta_scope"] = _totals_json(totals_hta.get(rank), no_gpu)
        out.append({
            "rank": rank,
            "steps": steps,
            "totals": totals_obj,
            "step_stats": [{k: (Absent(ZERO_MEDIAN) if k == "spread_pct" and v is None else v)
                            for k, v in row.items() if k not in ("run", "rank")} for row in stats.get(rank, [])]
            or Absent(NO_STEPS),
        })
    return out


ZERO_MEDIAN = "the median step is 0 ns: a spread relative to it is undefined"
"""Why ``step_stats[].spread_pct`` is null."""


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

    wanted = summary_args(ranks)
    return cached_json(store, "summary", run, wanted, lambda: _compute_summary(store, run, wanted))


def summary_args(ranks: Sequence[int] | None) -> list[int] | None:
    """The ranks asked for as the summary's cache key holds them (None: the whole run)."""
    return None if ranks is None else sorted(int(r) for r in ranks)


def summary_verdict(store: SQLStore, run: str) -> dict[str, Any]:
    """The whole run's ``verdict`` object, the summary's first screen (the dashboard's Overview
    opens with it): the same object :func:`build_summary` puts in its document, cached per run on
    its own (``<store>/cache/verdict/``: a few kB, where the document of 1,024 ranks is tens of MB).

    Shares the cache with ``stepscope summary``: taken from a summary document already computed;
    else from the sections, whose frames the analysis layer keeps for the summary to reuse
    (:mod:`stepscope.analysis.cache`), without building their JSON."""
    from stepscope.analysis.cache import cached_json, peek_json

    def compute() -> dict[str, Any]:
        doc = peek_json(store, "summary", run, None)
        if doc is not None:
            return doc["verdict"]
        return jsonable(_verdict(store, run, None, compute_sections(store, run, None)))

    return cached_json(store, "verdict", run, None, compute)


def _verdict(store: SQLStore, run: str, ranks: Sequence[int] | None, results: dict[str, object]) -> dict[str, Any]:
    """The ``verdict`` object over the sections' ``results`` (not yet made JSON-ready)."""
    ranks_result = results["ranks"]
    assert isinstance(ranks_result, RanksResult)
    return verdict(store, run, ranks_result, evaluate(results), clock_offsets(store, run),
                   whole_trace_verdict(store, run, ranks))


def _compute_summary(store: SQLStore, run: str, ranks: Sequence[int] | None) -> dict[str, Any]:
    from stepscope.analysis.sections import all_sections

    results = compute_sections(store, run, ranks)
    doc: dict[str, Any] = {"summary_version": SUMMARY_VERSION, "run": run}
    doc["verdict"] = _verdict(store, run, ranks, results)
    for s in all_sections():
        result = results[s.name]
        doc[s.name] = result if isinstance(result, Absent) else s.to_json(result)
    doc["findings"] = doc["verdict"]["findings"]  # with their share of the basis step
    return jsonable(doc)


# ---- findings on the ranks section ----

IDLE_WARNING_PCT = 30.0
"""GPU idle this share of the steps or more (and 1 ms per step) is worth a look."""
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


def _data_loading(ranks: RanksResult) -> dict[int, tuple[float, float]]:
    """Ranks whose data loading is a finding: rank -> (median share of the step in %, median ns
    per step). The median step spends 10% or more, and 1 ms or more, in the DataLoader."""
    out: dict[int, tuple[float, float]] = {}
    for rank, rows in sorted(_by_rank(ranks.host).items()):
        shares = [100 * r[DATA_LOADING.column] / r["dur_ns"] for r in rows if r["dur_ns"] > 0]
        if not shares:
            continue
        share, per_step = median(shares), median([r[DATA_LOADING.column] for r in rows])
        if share >= DATA_LOADING_WARNING_PCT and per_step >= MIN_STAKE_NS:
            out[rank] = (share, per_step)
    return out


def _host_busiest(rows: list[dict[str, Any]], top: int = 2) -> str:
    """The host parts that take the most of a rank's steps (``optimizer 33%, other 38%``):
    what the host did while the GPU waited for it."""
    total = sum(r["dur_ns"] for r in rows)
    if not total:
        return ""
    shares = sorted(((sum(r[p.column] for r in rows) / total, p) for p in HOST.leaves()), key=lambda s: -s[0])
    return ", ".join(f"{p.label} {100 * share:.0f}%" for share, p in shares[:top] if share >= 0.05)


@rule("gpu.idle", needs=("ranks",))
def gpu_idle(results: Results) -> Iterator[Finding]:
    """The GPU is idle for 30% or more of steps, and 1 ms or more per step, with the dominant HTA
    cause. Idle time the host's data loading explains is ``host.data_loading``'s finding (one
    finding per cause): on such ranks only the idle time beyond the data loading counts here.
    One finding per dominant cause, over the ranks where it holds."""
    ranks: RanksResult = results["ranks"]  # type: ignore[assignment]
    loading = _data_loading(ranks)
    host = _by_rank(ranks.host)
    flagged: dict[Part, list[dict[str, Any]]] = {}
    for rank, rows in sorted(_by_rank(ranks.breakdown).items()):
        rows = [r for r in rows if r["dur_ns"] > 0]
        if not rows:
            continue
        causes = {c: sum(r[c.column] for r in rows) for c in IDLE.sub_parts}
        cause = max(causes, key=lambda c: causes[c])
        idle = sum(r[IDLE.column] for r in rows) / len(rows)
        explained = loading[rank][1] if cause == IDLE_HOST_WAIT and rank in loading else 0.0
        per_step = idle - explained
        share = 100 * per_step * len(rows) / sum(r["dur_ns"] for r in rows)
        if share < IDLE_WARNING_PCT or per_step < MIN_STAKE_NS:
            continue
        worst = max(rows, key=lambda r: r[IDLE.column] / r["dur_ns"])
        flagged.setdefault(cause, []).append({
            "rank": rank, "per_step": per_step, "share": share, "explained": explained, "steps": len(rows),
            "worst_step": worst["step"], "worst_pct": 100 * worst[IDLE.column] / worst["dur_ns"],
            **{c.column: v / len(rows) for c, v in causes.items()}})
    basis = basis_of(results)
    for cause, rows in flagged.items():
        worst = max(rows, key=lambda r: r["per_step"])
        ranks_tuple = tuple(r["rank"] for r in rows)
        beyond = " beyond what data loading explains" if worst["explained"] else ""
        spread = quoted_rank(ranks_tuple, worst["rank"], {r["rank"]: r["per_step"] for r in rows})
        message = (f"{ranks_phrase(ranks_tuple)}: GPU idle {duration(worst['per_step'])} per step{beyond} "
                   f"({basis.of_step(worst['per_step']) if basis else 'share unknown'}"
                   f"{'; ' + spread if spread else ''}; worst step: {worst['worst_step']} of rank {worst['rank']}, "
                   f"idle {worst['worst_pct']:.0f}% of that step), {_IDLE_CAUSE_ADVICE[cause]}")
        busiest = _host_busiest(host.get(worst["rank"], []))
        if cause == IDLE_HOST_WAIT and busiest:
            message += f" (the host's step: {busiest})"
        yield Finding(
            Severity.CRITICAL if worst["share"] >= IDLE_CRITICAL_PCT else Severity.WARNING,
            "gpu.idle",
            message,
            {"ranks": list(ranks_tuple), "rank": worst["rank"], "step": worst["worst_step"],
             "idle_pct": round(worst["share"], 2), "idle_ns_per_step": round(worst["per_step"]),
             "worst_step_idle_pct": round(worst["worst_pct"], 2), "steps": worst["steps"],
             "cause": cause.name.removeprefix(f"{IDLE.name}_"),
             "data_loading_ns_per_step": round(worst["explained"]) if worst["rank"] in ranks.loaders
             else Absent(NO_DATALOADER),
             **{c.column: round(worst[c.column]) for c in IDLE.sub_parts}},
            ranks=ranks_tuple,
            time_at_stake_ns=round(worst["per_step"]),
        )


@rule("host.data_loading", needs=("ranks",))
def host_data_loading(results: Results) -> Iterator[Finding]:
    """The host spends 10% or more of the median step, and 1 ms or more, waiting for the
    DataLoader (with the GPU idle time it causes, when the run has GPU events). One finding over
    the ranks where it holds."""
    ranks: RanksResult = results["ranks"]  # type: ignore[assignment]
    loading = _data_loading(ranks)
    if not loading:
        return
    rank, (share, per_step) = max(loading.items(), key=lambda kv: kv[1][1])
    gpu = _by_rank(ranks.breakdown).get(rank, [])
    host_wait = median([r[IDLE_HOST_WAIT.column] for r in gpu]) if gpu else None
    idle = f"; the GPU idles {duration(host_wait)} per step waiting for the host" if host_wait else ""
    ranks_tuple = tuple(loading)
    basis = basis_of(results)
    spread = quoted_rank(ranks_tuple, rank, {r: v[1] for r, v in loading.items()})
    yield Finding(
        Severity.WARNING,
        "host.data_loading",
        f"{ranks_phrase(ranks_tuple)}: data loading takes {duration(per_step)} per step (the median step's; "
        f"{basis.of_step(per_step) if basis else 'share unknown'}{'; ' + spread if spread else ''}{idle}): "
        "use DataLoader workers, pinned memory and prefetching",
        {"ranks": list(ranks_tuple), "rank": rank, "data_loading_pct_median": round(share, 2),
         "data_loading_ms_median": round(per_step / 1e6, 3),
         "gpu_host_wait_ns_median": None if host_wait is None else round(host_wait)},
        ranks=ranks_tuple,
        time_at_stake_ns=round(per_step),
    )


@rule("steps.unstable", needs=("ranks",))
def steps_unstable(results: Results) -> Iterator[Finding]:
    """Step times vary a lot between steps of one rank (warm-up, stalls, recompilation): three
    or more steps, (max - min) / median of 25% or more, and steps exceeding the median by 1 ms
    or more on average. One finding per source of step times, over the ranks where it holds."""
    ranks: RanksResult = results["ranks"]  # type: ignore[assignment]
    durations: dict[tuple[int, str], list[int]] = {}
    for rank, rows in _by_rank(ranks.host).items():
        durations[(rank, "profiler_steps")] = [r["dur_ns"] for r in rows]
    flagged: dict[str, list[dict[str, Any]]] = {}
    for row in ranks.stats.to_pylist():
        if row["steps"] < 3 or row["spread_pct"] is None or row["spread_pct"] < STEP_SPREAD_WARNING_PCT:
            continue
        values = durations.get((row["rank"], row["source"]))
        excess = (sum(max(0, d - row["median_ns"]) for d in values) / len(values)) if values else \
            row["mean_ns"] - row["median_ns"]
        if excess < MIN_STAKE_NS:
            continue
        flagged.setdefault(row["source"], []).append({**row, "excess": excess})
    for source, rows in flagged.items():
        worst = max(rows, key=lambda r: r["excess"])
        ranks_tuple = tuple(sorted(r["rank"] for r in rows))
        yield Finding(
            Severity.WARNING,
            "steps.unstable",
            f"{ranks_phrase(ranks_tuple)}: step time varies by {worst['spread_pct']:.0f}% "
            f"(rank {worst['rank']}: median {duration(worst['median_ns'])}, min {duration(worst['min_ns'])}, "
            f"max {duration(worst['max_ns'])} over {worst['steps']} {source}; {duration(worst['excess'])} per step above the "
            "median): profile steady-state steps, look for stalls or recompilation"
            + (f" ({worst['disturbed_steps']} steps stepscope itself disturbed, profiling, exporting or "
               "converting a trace, are left out)" if worst.get("disturbed_steps") else ""),
            {"ranks": list(ranks_tuple), "rank": worst["rank"], "source": source, "steps": worst["steps"],
             "spread_pct": round(worst["spread_pct"], 2), "median_ns": worst["median_ns"],
             "min_ns": worst["min_ns"], "max_ns": worst["max_ns"], "excess_ns_per_step": round(worst["excess"])},
            ranks=ranks_tuple,
            time_at_stake_ns=round(worst["excess"]),
        )
