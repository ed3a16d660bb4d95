"""Host<->device copies (offload traffic): bytes, time, achieved bandwidth, and what compute hides.

Definitions (docs/ANALYSIS.md, "Copies"):

- A copy is a ``memcpy`` GPU event; its direction is the store's category (``memcpy_h2d``,
  ``memcpy_d2h``, ``memcpy_d2d``, ``memcpy_other``) and its host memory comes from the name
  Kineto gives it: ``Memcpy HtoD (Pageable -> Device)`` is pageable, ``(Pinned -> Device)``
  pinned. Device-to-device copies have no host memory (null).
- ``bandwidth_gbps = bytes / dur_ns`` (bytes per ns is GB/s, GB = 1e9); null for zero-length
  copies (Kineto rounds old traces to whole microseconds).
- The link peak is per direction and comes from the GPU's name (``deviceProperties`` records no
  PCIe generation): :data:`LINK_PEAKS`. An unknown GPU, or a device-to-device copy, has no peak
  (null, with the reason in ``absent_reason``): it is never guessed.
- ``hidden_ns`` is the part of a copy under the rank's compute-kernel union
  (:mod:`stepscope.store.rankstats.sweep`), ``exposed_ns = dur_ns - hidden_ns``. Each rank's copies
  with their hidden time (:mod:`stepscope.store.rankstats.copies`) are computed when its trace is
  ingested (table ``rank_copies``); this module reads them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from stepscope.analysis._local import local_sql
from stepscope.analysis._sql import rank_filter
from stepscope.analysis.absent import Absent, Maybe
from stepscope.analysis.basis import basis_of, quoted_rank
from stepscope.analysis.cache import cached_frame
from stepscope.analysis.findings import MIN_STAKE_NS, Finding, Results, Severity, ranks_phrase, rule
from stepscope.analysis.quantiles import quantile_sql
from stepscope.analysis.sections import SQLStore, section
from stepscope.units import bandwidth, duration, size

LINK_PEAKS: tuple[tuple[str, str, float], ...] = (
    (r"GH200|GB200|GB300|Grace", "NVLink-C2C", 450.0),
    (r"H100|H200|H800|H20\b|B200|B100|MI300|MI325", "PCIe Gen5 x16", 64.0),
    (r"A100|A800|A30\b|A40\b|A10\b|A10G|MI250|MI210|MI100", "PCIe Gen4 x16", 32.0),
    (r"V100|P100|T4\b|RTX 20|TITAN V|Quadro GP100|Quadro RTX", "PCIe Gen3 x16", 16.0),
)
"""(regex on ``sources.gpu_name``, host link, peak GB/s per direction), first match wins.

Peaks per direction from docs/REFERENCE (PCIe Gen3 x16 ~16, Gen4 x16 ~32, Gen5 x16 ~64 GB/s;
NVLink-C2C 450 GB/s). Which generation each GPU uses is from the vendors' data sheets: V100,
P100, T4 and Turing boards are Gen3; A100/A30/A40/A10, MI100/MI210/MI250 Gen4; H100/H200,
B200 and MI300 Gen5; Grace Hopper/Blackwell superchips use NVLink-C2C. A GPU not listed gets
no peak."""

NO_COPIES = "no memcpy events in the traces of this run (or of the ranks asked for)"


def _link_values() -> str:
    rows = ", ".join(
        f"({i}, '{pattern}', '{link}', {peak}::DOUBLE)" for i, (pattern, link, peak) in enumerate(LINK_PEAKS)
    )
    return f"(VALUES {rows}) AS l(priority, pattern, link, peak_gbps)"


def _copies_ctes(ranks_sql: str) -> str:
    """CTEs ``copies`` (one row per copy, from the ``rank_copies`` table that ingest wrote for
    each rank: direction, host memory, hidden time) with the host link of each source."""
    return f"""
link AS (
  SELECT s.source, arg_min(l.link, l.priority) AS link, arg_min(l.peak_gbps, l.priority) AS peak_gbps
  FROM sources s JOIN {_link_values()} ON regexp_matches(s.gpu_name, l.pattern)
  WHERE s.run = $run
  GROUP BY s.source
),
gpu_name AS (SELECT source, gpu_name FROM sources WHERE run = $run),
copies AS (
  SELECT c.run, c.rank, c.source, c.step, c.ts_ns, c.dur_ns, c.stream, c.name, c.bytes, c.direction,
         c.host_memory, c.hidden_ns, c.exposed_ns,
         CASE WHEN c.direction IN ('h2d', 'd2h') THEN l.link END AS link,
         CASE WHEN c.direction IN ('h2d', 'd2h') THEN l.peak_gbps END AS peak_gbps,
         CASE WHEN c.direction NOT IN ('h2d', 'd2h') THEN 'device-side copy: no host-link peak'
              WHEN l.peak_gbps IS NULL THEN 'no host-link peak known for GPU ' || coalesce(g.gpu_name, '(none recorded)')
         END AS peak_absent_reason
  FROM rank_copies c LEFT JOIN link l USING (source) LEFT JOIN gpu_name g USING (source)
  WHERE c.run = $run AND {ranks_sql}
)"""


def _params(run: str, ranks: Sequence[int] | None, column: str = "c.rank") -> tuple[str, dict[str, object]]:
    predicate, params = rank_filter(ranks, column)
    return predicate, {"run": run, **params}


@cached_frame("copies")
def _copies_table(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Every copy of the run with its hidden time and host link (from each rank's stored
    ``rank_copies``), which the frames below aggregate."""
    ranks_sql, params = _params(run, ranks)
    return store.sql(f"WITH {_copies_ctes(ranks_sql)} SELECT * EXCLUDE (source) FROM copies", params)


def copy_events(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """One row per copy: direction, host memory, bytes, time, hidden/exposed, bandwidth vs peak."""
    return local_sql("""
SELECT run, rank, step, direction, host_memory, ts_ns, dur_ns, hidden_ns, exposed_ns, bytes,
       bytes / nullif(dur_ns, 0) AS bandwidth_gbps, link, peak_gbps,
       100.0 * bytes / nullif(dur_ns, 0) / peak_gbps AS pct_of_peak,
       CASE WHEN dur_ns = 0 THEN 'zero-duration copy: no bandwidth' ELSE peak_absent_reason END AS absent_reason,
       stream, name
FROM copies
ORDER BY rank, ts_ns
""", copies=_copies_table(store, run, ranks))


def _step_durations(store: SQLStore, run: str, ranks: Sequence[int] | None) -> pa.Table:
    """``(rank, step, steps_ns)``: each ProfilerStep CPU window, plus a null-step row per rank
    holding the sum of its windows."""
    ranks_sql, params = _params(run, ranks, "rank")
    return store.sql(f"""
SELECT rank, step, sum(dur_ns)::BIGINT AS steps_ns FROM steps WHERE run = $run AND {ranks_sql} GROUP BY rank, step
UNION ALL
SELECT rank, NULL, sum(dur_ns)::BIGINT FROM steps WHERE run = $run AND {ranks_sql} GROUP BY rank
""", params)


def copy_summary(store: SQLStore, run: str, ranks: Sequence[int] | None = None,
                 *, per_step: bool = True) -> pa.Table:
    """Per rank, step (when ``per_step``), direction and host memory: count, bytes, time,
    hidden/exposed time, achieved bandwidth and its distribution against the link's peak.

    ``bandwidth_gbps`` is total bytes over total time; ``p10/p50/p90_bandwidth_gbps`` are over
    the copies (each weighted once) with a nonzero duration. ``pct_of_peak`` relates
    ``bandwidth_gbps`` to the link's peak; ``p50_pct_of_peak`` the median copy.
    ``exposed_pct_of_steps`` relates the exposed time to the step's ``ProfilerStep`` CPU window
    (to the sum of the rank's windows for the totals).
    """
    return _copy_summary(_copies_table(store, run, ranks), _step_durations(store, run, ranks), per_step)


def _copy_summary(copies: pa.Table, step_dur: pa.Table, per_step: bool) -> pa.Table:
    step_col = "step" if per_step else "NULL::BIGINT AS step"
    step_join = "s.step = g.step" if per_step else "s.step IS NULL"
    query = f"""
WITH bw AS (SELECT *, bytes / nullif(dur_ns, 0) AS bandwidth_gbps FROM copies),
g AS (
  SELECT run, rank, {step_col}, direction, host_memory, count(*) AS count, sum(bytes)::BIGINT AS bytes,
         sum(dur_ns)::BIGINT AS dur_ns, sum(hidden_ns)::BIGINT AS hidden_ns,
         sum(exposed_ns)::BIGINT AS exposed_ns,
         100.0 * sum(hidden_ns) / nullif(sum(dur_ns), 0) AS hidden_pct,
         sum(bytes) / nullif(sum(dur_ns), 0) AS bandwidth_gbps,
         {quantile_sql('bandwidth_gbps', 0.1)} AS p10_bandwidth_gbps,
         {quantile_sql('bandwidth_gbps', 0.5)} AS p50_bandwidth_gbps,
         {quantile_sql('bandwidth_gbps', 0.9)} AS p90_bandwidth_gbps,
         max(bandwidth_gbps) AS max_bandwidth_gbps,
         any_value(link) AS link, any_value(peak_gbps) AS peak_gbps,
         100.0 * sum(bytes) / nullif(sum(dur_ns), 0) / any_value(peak_gbps) AS pct_of_peak,
         100.0 * {quantile_sql('bandwidth_gbps', 0.5)} / any_value(peak_gbps) AS p50_pct_of_peak,
         any_value(peak_absent_reason) AS peak_absent_reason
  FROM bw
  GROUP BY ALL
)
SELECT g.* EXCLUDE (peak_absent_reason),
       100.0 * g.exposed_ns / s.steps_ns AS exposed_pct_of_steps,
       nullif(concat_ws('; ', g.peak_absent_reason,
                        CASE WHEN s.steps_ns IS NULL THEN 'no ProfilerStep window for these copies' END), '')
         AS absent_reason
FROM g LEFT JOIN step_dur s ON s.rank = g.rank AND {step_join}
ORDER BY g.rank, g.step NULLS LAST, g.direction, g.host_memory
"""
    return local_sql(query, copies=copies, step_dur=step_dur)


@dataclass(frozen=True)
class CopiesResult:
    """The ``copies`` section: totals per rank and per step, by direction and host memory."""

    totals: pa.Table
    per_step: pa.Table


@section("copies", order=50, to_json=lambda r: {
    "totals": r.totals.to_pylist(),
    "per_step": r.per_step.to_pylist(),
})
def copies_section(store: SQLStore, run: str, ranks: Sequence[int] | None) -> Maybe[CopiesResult]:
    """Host<->device and device copies: bytes, time, bandwidth against the link's peak,
    pinned vs pageable, and how much of the copy time compute hides."""
    copies = _copies_table(store, run, ranks)
    if copies.num_rows == 0:
        return Absent(NO_COPIES)
    step_dur = _step_durations(store, run, ranks)
    return CopiesResult(totals=_copy_summary(copies, step_dur, per_step=False),
                        per_step=_copy_summary(copies, step_dur, per_step=True))


PAGEABLE_MIN_BYTES = 16 * 1024**2
"""Pageable traffic below this (scalars read back with ``.item()``, tiny inputs) is harmless."""


EXPOSED_PCT_WARN = 10.0
"""Copies of one direction exposed (not under compute) for this share of step time warn."""

_EXPOSED_ADVICE = {
    "h2d": "prefetch on a side stream from pinned memory (non_blocking=True) so compute hides it",
    "d2h": "copy back asynchronously into pinned buffers, or less often",
    "d2d": "look for needless copies (.contiguous(), torch.cat, dtype casts) in the hot path",
    "other": "check what issues these copies",
}


def _steps_per_rank(result: CopiesResult) -> dict[int, int]:
    """Profiled steps with copies per rank (the per-step table), to turn totals into per-step times."""
    steps: dict[int, set[int]] = {}
    for row in result.per_step.to_pylist():
        if row["step"] is not None:
            steps.setdefault(row["rank"], set()).add(row["step"])
    return {rank: len(s) for rank, s in steps.items()}


@rule("copies.exposed", needs=("copies",))
def exposed_rule(results: Results) -> Iterator[Finding]:
    """Copies of one direction run outside compute for at least 10% of the step time and 1 ms per
    step: the GPU waits on them. One finding per direction, over the ranks where it holds."""
    result = results["copies"]
    assert isinstance(result, CopiesResult)
    steps = _steps_per_rank(result)
    exposed: dict[tuple[int, str], list[dict]] = {}
    for row in result.totals.to_pylist():
        exposed.setdefault((row["rank"], row["direction"]), []).append(row)
    flagged: dict[str, list[dict]] = {}
    for (rank, direction), rows in sorted(exposed.items()):
        pct = sum(r["exposed_pct_of_steps"] or 0.0 for r in rows)
        if all(r["exposed_pct_of_steps"] is None for r in rows) or pct < EXPOSED_PCT_WARN or not steps.get(rank):
            continue
        exposed_ns = sum(r["exposed_ns"] for r in rows)
        if exposed_ns / steps[rank] < MIN_STAKE_NS:
            continue
        flagged.setdefault(direction, []).append({
            "rank": rank, "pct": pct, "exposed_ns": exposed_ns, "per_step": exposed_ns / steps[rank],
            "dur_ns": sum(r["dur_ns"] for r in rows), "bytes": sum(r["bytes"] or 0 for r in rows)})
    basis = basis_of(results)
    for direction, rows in flagged.items():
        worst = max(rows, key=lambda r: r["per_step"])
        ranks = tuple(r["rank"] for r in rows)
        spread = quoted_rank(ranks, worst["rank"], {r["rank"]: r["per_step"] for r in rows})
        yield Finding(
            Severity.WARNING,
            "copies.exposed",
            f"{ranks_phrase(ranks)}: {direction.upper()} copies exposed for {duration(worst['per_step'])} per step "
            f"({basis.of_step(worst['per_step']) if basis else 'share unknown'}{'; ' + spread if spread else ''}; "
            f"{size(worst['bytes'])}, "
            f"{100 * (1 - worst['exposed_ns'] / worst['dur_ns']):.0f}% hidden under compute): "
            f"{_EXPOSED_ADVICE[direction]}",
            {"ranks": list(ranks), "direction": direction, "worst_rank": worst["rank"],
             "exposed_ns": worst["exposed_ns"], "dur_ns": worst["dur_ns"], "bytes": worst["bytes"],
             "exposed_pct_of_steps": worst["pct"], "exposed_ns_per_step": round(worst["per_step"])},
            ranks=ranks,
            time_at_stake_ns=round(worst["per_step"]),
        )


@rule("copies.pageable", needs=("copies",))
def pageable_rule(results: Results) -> Iterator[Finding]:
    """Host<->device copies move at least 16 MiB from or to pageable host memory: the driver
    stages them through a pinned bounce buffer, they cannot overlap compute and reach a
    fraction of the link's bandwidth. Pin the host tensors (``pin_memory=True``). When the trace
    has steps, also at least 1 ms of exposed copy time per step; one finding per direction."""
    result = results["copies"]
    assert isinstance(result, CopiesResult)
    steps = _steps_per_rank(result)
    flagged: dict[str, list[dict]] = {}
    for row in result.totals.to_pylist():
        if row["host_memory"] != "pageable" or row["direction"] not in ("h2d", "d2h"):
            continue
        if (row["bytes"] or 0) < PAGEABLE_MIN_BYTES:
            continue
        per_step = row["exposed_ns"] / steps[row["rank"]] if steps.get(row["rank"]) else None
        if per_step is not None and per_step < MIN_STAKE_NS:
            continue
        flagged.setdefault(row["direction"], []).append({**row, "per_step": per_step})
    for direction, rows in flagged.items():
        worst = max(rows, key=lambda r: (r["per_step"] or 0, r["bytes"]))
        ranks = tuple(sorted(r["rank"] for r in rows))
        what = "H2D copies from" if direction == "h2d" else "D2H copies to"
        peak = f" ({worst['pct_of_peak']:.0f}% of {worst['link']})" if worst["pct_of_peak"] is not None else ""
        cost = f", {duration(worst['per_step'])} per step" if worst["per_step"] is not None else ""
        yield Finding(
            Severity.WARNING,
            "copies.pageable",
            f"{ranks_phrase(ranks)}: {what} pageable memory: {size(worst['bytes'])} at "
            f"{bandwidth(worst['bandwidth_gbps'])}{peak}{cost}: pin host memory",
            {"ranks": list(ranks), "direction": direction, "worst_rank": worst["rank"], "bytes": worst["bytes"],
             "count": worst["count"], "bandwidth_gbps": worst["bandwidth_gbps"], "pct_of_peak": worst["pct_of_peak"],
             "exposed_ns_per_step": None if worst["per_step"] is None else round(worst["per_step"])},
            ranks=ranks,
            time_at_stake_ns=None if worst["per_step"] is None else round(worst["per_step"]),
        )
