"""What the gate compares about one run, taken from the analyses' public functions.

Nothing here recomputes an analysis figure: step parts come from
:func:`stepscope.analysis.breakdown.step_breakdown`, step windows from
:func:`~stepscope.analysis.breakdown.step_windows`, collective bandwidth from
:func:`stepscope.analysis.comm.collective_summary`, copy bandwidth from
:func:`stepscope.analysis.copies.copy_summary`, memory peaks from
:func:`stepscope.analysis.memory.step_peaks` and kernels from
:func:`stepscope.analysis.kernels.top_kernels`; the per-step bus and copy bandwidths sum the
rows of :func:`~stepscope.analysis.comm.collective_kernels` and ``copy_summary`` per step. This module only gathers their rows into per-step samples
(one value per rank and step) and per-name tables, the shapes that statistics need. Which step
parts are compared, and under which metric names, is the catalogue's
(``stepscope.store.rankstats.parts.GPU.budget_metrics()``).
When an analysis abstains, the metric is :class:`~stepscope.analysis.absent.Absent` with the
reason, and the comparison says "not available" instead of inventing a number. The analyses are
imported, never looked up by name: a renamed one fails at import, it cannot silently switch a
budget off.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from stepscope.analysis.absent import Absent, Maybe
from stepscope.analysis.compare.budgets import COPY_DIRECTIONS
from stepscope.analysis.breakdown import host_breakdown, step_breakdown, step_windows
from stepscope.analysis.comm import collective_kernels, collective_summary
from stepscope.analysis.copies import copy_summary
from stepscope.analysis.kernels import top_cpu_ops, top_kernels
from stepscope.analysis.memory import step_peaks
from stepscope.store.rankstats.parts import GPU, HOST, Breakdown
from stepscope.analysis.quantiles import median
from stepscope.analysis.sections import SQLStore

STEP_WINDOWS_SOURCE = "step_windows"
STEP_MEASURES: tuple[str, ...] = ("gpu_ns", "cpu_ns", "wall_ns")
"""Columns of ``step_times`` the step time can be judged on, in order of preference: device time
(a GPU run), the training thread's CPU time (a CPU run: the measure other processes on the
machine disturb least, docs/ci.md), wall time. ``step_source`` names them ``step_times.<column>``."""
PREEMPTIONS = "preemptions"
"""The ``step_times`` column of each step's involuntary context switches, read beside a CPU step
time: the :class:`~stepscope.analysis.compare.stats.Preemption` of a run."""
OTHERS = "others_cpu_ns"
"""The ``step_times`` column of the CPU time the rest of the machine used during each step, read
beside a CPU step time: whether the run was measured quiet
(:attr:`~stepscope.analysis.compare.stats.Preemption.others`)."""
CPU_TIME_SOURCE = "step_times.cpu_ns"
"""The step time's source when it is the training thread's CPU time, the measure whose noise
margin follows the load (:class:`~stepscope.analysis.compare.stats.Load`)."""


@dataclass(frozen=True)
class RunFacts:
    """What a run ran on and how it was laid out: the comparability checks read these."""

    run: str
    name: str | None
    ranks: tuple[int, ...]
    world_size: int | None
    backend: str | None
    gpu_names: tuple[str, ...]
    gpu_count: int | None
    process_groups: tuple[str, ...] | None
    """``desc (size N)`` per process group recorded in ``distributedInfo.pg_config``; None when
    no trace of the run recorded any."""
    steps: int
    """ProfilerSteps per rank (the largest count over ranks)."""
    threads: int | None = None
    """torch's intra-op threads as the collector recorded them (``torch_threads`` in
    ``sources.metadata``); None for traces recorded without the collector."""

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "name": self.name, "ranks": list(self.ranks), "world_size": self.world_size,
                "backend": self.backend, "gpu_names": list(self.gpu_names), "gpu_count": self.gpu_count,
                "process_groups": None if self.process_groups is None else list(self.process_groups),
                "steps": self.steps, "threads": self.threads}


@dataclass(frozen=True)
class NamedStat:
    """A per-name figure (a kernel, a collective and size bucket, a copy direction)."""

    key: str
    value: float | None
    count: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunProfile:
    """Everything about one run that the comparison reads, each item possibly absent."""

    facts: RunFacts
    step_source: str
    samples: dict[str, Maybe[list[float]]]
    """Metric -> one value per (rank, step): ``step_time`` and each metric of
    ``stepscope.store.rankstats.parts.GPU.budget_metrics()``; with a CPU step time also
    :data:`PREEMPTIONS` and :data:`OTHERS`, in the order of ``step_time``'s values."""
    peak_memory: Maybe[list[float]]
    """Peak allocated bytes per (rank, device, step) on the GPU (the host when no GPU rows)."""
    peak_memory_device: str | None
    kernels: Maybe[list[NamedStat]]
    """Per kernel name: time per step (ns, median over ranks) and launches per step."""
    collectives: Maybe[list[NamedStat]]
    """Per ``collective size_bucket``: bus bandwidth (GB/s, median over ranks), count."""
    copies: Maybe[list[NamedStat]]
    """Per ``direction host_memory``: copy bandwidth (GB/s, median over ranks), bytes."""
    collectives_per_step: Maybe[dict[str, float]]
    """Collective kind -> median number issued per step: the step-structure check."""
    cpu_ops: Maybe[list[NamedStat]] = Absent("not gathered")
    """Per CPU operator name: time per profiled step (ns, median over ranks) and calls per step:
    the top-ops and (without collectives) step-structure checks."""


def _distinct(store: SQLStore, query: str, run: str) -> list[Any]:
    return [row["v"] for row in store.sql(query, {"run": run}).to_pylist()]


def _process_groups(infos: list[str | None]) -> tuple[str, ...] | None:
    groups: set[str] = set()
    seen = False
    for text in infos:
        if not text:
            continue
        config = json.loads(text).get("pg_config")
        if not isinstance(config, list):
            continue
        seen = True
        for pg in config:
            if isinstance(pg, dict):
                groups.add(f"{pg.get('pg_desc') or pg.get('pg_name')} (size {pg.get('pg_size')})")
    return tuple(sorted(groups)) if seen else None


def run_facts(store: SQLStore, run: str) -> RunFacts:
    """Hardware and layout of ``run`` from its ``sources`` rows (raises ``UsageError`` if unknown)."""
    from stepscope.errors import UsageError

    rows = store.sql(
        "SELECT rank, run_name, world_size, backend, gpu_name, gpu_count, distributed_info, metadata "
        "FROM sources WHERE run = $run ORDER BY rank", {"run": run}).to_pylist()
    if not rows:
        known = _distinct(store, "SELECT DISTINCT run AS v FROM sources WHERE $run IS NOT NULL ORDER BY v", run)
        raise UsageError(f"no run {run!r} in the store (runs: {', '.join(known) or 'none'})")
    steps = store.sql("SELECT max(n) AS n FROM (SELECT rank, count(*) AS n FROM steps WHERE run = $run "
                      "GROUP BY rank)", {"run": run}).to_pylist()[0]["n"] or 0

    def first(key: str) -> Any:
        return next((r[key] for r in rows if r[key] is not None), None)

    counts = [r["gpu_count"] for r in rows if r["gpu_count"] is not None]
    sizes = [r["world_size"] for r in rows if r["world_size"] is not None]
    return RunFacts(
        run=run,
        name=first("run_name"),
        ranks=tuple(sorted({r["rank"] for r in rows})),
        world_size=max(sizes) if sizes else None,
        backend=first("backend"),
        gpu_names=tuple(sorted({r["gpu_name"] for r in rows if r["gpu_name"]})),
        gpu_count=max(counts) if counts else None,
        process_groups=_process_groups([r["distributed_info"] for r in rows]),
        steps=int(steps),
        threads=_threads([r["metadata"] for r in rows]),
    )


def _threads(metadata: list[str | None]) -> int | None:
    """The largest ``torch_threads`` the collector recorded on any rank (None: not recorded)."""
    found = []
    for text in metadata:
        try:
            value = json.loads(text).get("torch_threads") if text else None
        except (ValueError, AttributeError):
            value = None
        if isinstance(value, int):
            found.append(value)
    return max(found) if found else None


def _step_times(store: SQLStore, run: str) -> dict[str, list[float | None]]:
    """Every training step the collector timed: column -> values (nulls kept), per
    :data:`STEP_MEASURES`, :data:`PREEMPTIONS` and :data:`OTHERS`; a column that the run's files lack (written
    before it existed) is all null. Empty lists when it timed none."""
    table = store.sql("SELECT * FROM step_times WHERE run = $run ORDER BY rank, step", {"run": run})
    return {column: ([None] * table.num_rows if column not in table.column_names
                     else [None if v is None else float(v) for v in table.column(column).to_pylist()])
            for column in (*STEP_MEASURES, PREEMPTIONS, OTHERS)}


def step_measures(store: SQLStore, run: str) -> tuple[str, ...]:
    """The :data:`STEP_MEASURES` this run has a value of for every timed step (none without
    ``step_times``), in order of preference."""
    timed = _step_times(store, run)
    return tuple(m for m in STEP_MEASURES if timed[m] and all(v is not None for v in timed[m]))


def step_source(measures: list[tuple[str, ...]]) -> str:
    """Where the compared runs' step time comes from: the first :data:`STEP_MEASURES` column
    every run has (``step_times.<column>``), else the profiled steps' windows."""
    shared = [m for m in STEP_MEASURES if all(m in have for have in measures)]
    return f"step_times.{shared[0]}" if shared else STEP_WINDOWS_SOURCE


def _part_samples(samples: dict[str, Maybe[list[float]]], breakdown: Breakdown, table: Maybe[Any]) -> None:
    for metric, part in breakdown.budget_metrics().items():
        samples[metric] = table if isinstance(table, Absent) else [
            float(v) for v in table.column(part.column).to_pylist()]


def step_samples(store: SQLStore, run: str, source: str) -> dict[str, Maybe[list[float]]]:
    """Per-step values of the step time, the wall time and each step part.

    The step time is ``source`` (:func:`step_source`): a ``step_times`` column (every training
    step of the run; with the CPU time, each step's :data:`PREEMPTIONS` and :data:`OTHERS` too) or the step windows
    of :func:`~stepscope.analysis.breakdown.step_windows` (the profiled steps only). The wall
    time is ``step_times.wall_ns`` when the step time comes from ``step_times``, else the windows
    too. The parts always come from the profiled steps'
    breakdowns: the GPU's (:func:`~stepscope.analysis.breakdown.step_breakdown`) and the host's
    (:func:`~stepscope.analysis.breakdown.host_breakdown`).
    """
    samples: dict[str, Maybe[list[float]]] = {}
    if source == STEP_WINDOWS_SOURCE:
        windows = [float(v) for v in step_windows(store, run).column("dur_ns").to_pylist()]
        samples["step_time"] = windows or Absent("no ProfilerStep#N annotations in this run's traces")
        samples["wall_time"] = samples["step_time"]
    else:
        timed = _step_times(store, run)
        column = source.removeprefix("step_times.")
        samples["step_time"] = [v for v in timed[column] if v is not None]
        samples["wall_time"] = [v for v in timed["wall_ns"] if v is not None]
        if source == CPU_TIME_SOURCE:
            for extra in (PREEMPTIONS, OTHERS):
                values = timed[extra]
                samples[extra] = (Absent(f"step_times.{extra} not recorded") if None in values
                                  else [v for v in values if v is not None])
    _part_samples(samples, GPU, step_breakdown(store, run))
    _part_samples(samples, HOST, host_breakdown(store, run))
    return samples


def peak_memory_samples(store: SQLStore, run: str) -> tuple[Maybe[list[float]], str | None]:
    """Per-step allocated-memory peaks from :func:`stepscope.analysis.memory.step_peaks`: rows of
    accelerator memory (CUDA, HIP, ...: :mod:`stepscope.store.rankstats.devices`) when there are any,
    else host rows. Rows outside every step count too (a peak is a peak)."""
    rows = step_peaks(store, run).to_pylist()
    for accelerator, label in ((True, "gpu"), (False, "cpu")):
        values = [float(r["peak_allocated_bytes"]) for r in rows
                  if r["accelerator"] == accelerator and r["peak_allocated_bytes"] is not None]
        if values:
            return values, label
    return Absent("no [memory] events in this run's traces (record with profile_memory=True)"), None


def _per_step_rate(rows: list[dict[str, Any]], amount: str) -> list[float]:
    """``sum(amount) / sum(dur_ns)`` per (rank, step) over ``rows`` inside a step with a known
    amount and a nonzero duration: bytes per ns, i.e. GB/s."""
    totals: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for row in rows:
        if row["step"] is None or row[amount] is None or not row["dur_ns"]:
            continue
        total = totals[(row["rank"], row["step"])]
        total[0] += row[amount]
        total[1] += row["dur_ns"]
    return [moved / ns for moved, ns in (totals[k] for k in sorted(totals)) if ns > 0]


def busbw_samples(kernels: list[dict[str, Any]]) -> Maybe[list[float]]:
    """Bus bandwidth per rank and step (GB/s): the step's collective kernels' bytes times their
    nccl-tests bus factor over their summed time (``kernels``: the rows of
    :func:`stepscope.analysis.comm.collective_kernels`, whose ``busbw_gbps * dur_ns`` is that
    product). Host-side (gloo, CPU) collectives are left out: their duration is the CPU op's, not
    a transfer's."""
    rows = [{**r, "moved": None if r["busbw_gbps"] is None else r["busbw_gbps"] * r["dur_ns"]}
            for r in kernels if not r["host_side"]]
    values = _per_step_rate(rows, "moved")
    return values or Absent("no device collectives with a known size and bus factor inside steps")


def copy_bandwidth_samples(store: SQLStore, run: str) -> dict[str, Maybe[list[float]]]:
    """Copy bandwidth per rank and step (GB/s: bytes over copy time) from
    :func:`stepscope.analysis.copies.copy_summary` (per step): ``copy_bandwidth`` over every copy,
    ``copy_bandwidth_<direction>`` over one direction's."""
    rows = copy_summary(store, run, per_step=True).to_pylist()
    out: dict[str, Maybe[list[float]]] = {}
    for metric, direction in (("copy_bandwidth", None), *((f"copy_bandwidth_{d}", d) for d in COPY_DIRECTIONS)):
        values = _per_step_rate([r for r in rows if direction in (None, r["direction"])], "bytes")
        what = "memcpy events" if direction is None else f"{direction.upper()} copies"
        out[metric] = values or Absent(f"no {what} with a known size inside steps")
    return out


def _median_over_ranks(per_rank: dict[str, list[float]]) -> dict[str, float]:
    return {key: median(values) for key, values in per_rank.items() if values}


TOP_KERNELS = 50
"""Kernels matched by name among each run's top 50 by time (a kernel that leaves one run's top 50
shows as added or removed)."""


def kernel_stats(store: SQLStore, run: str, steps: int) -> Maybe[list[NamedStat]]:
    """Per GPU activity name: time and launches per profiled step (median over ranks), from
    :func:`stepscope.analysis.kernels.top_kernels` (which counts work launched inside steps)."""
    if steps == 0:
        return Absent("no ProfilerStep#N annotations: kernel time per step is undefined")
    return _per_step_by_name(top_kernels(store, run, TOP_KERNELS).to_pylist(), steps,
                             "no GPU kernels in this run's traces")


def _per_step_by_name(rows: list[dict[str, Any]], steps: int, none: str) -> Maybe[list[NamedStat]]:
    """Rows of a top-N frame (``name, total_ns, count`` per rank) as time and count per step,
    each the median over ranks; ``none`` is the reason when there are no rows."""
    times: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        times[row["name"]].append(row["total_ns"] / steps)
        counts[row["name"]].append(row["count"] / steps)
    if not times:
        return Absent(none)
    med_t, med_c = _median_over_ranks(times), _median_over_ranks(counts)
    return [NamedStat(name, med_t[name], med_c.get(name)) for name in sorted(med_t)]


def collective_stats(store: SQLStore, run: str) -> Maybe[list[NamedStat]]:
    """Per collective and message-size bucket: bus bandwidth (median over ranks) and count."""
    rows = collective_summary(store, run).to_pylist()
    if not rows:
        return Absent("no communication kernels in this run's traces")
    bw: dict[str, list[float]] = defaultdict(list)
    count: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        key = f"{row['collective'] or 'unknown'} {row['size_bucket'] or '(size unknown)'}"
        count[key].append(float(row["count"]))
        if row["busbw_gbps"] is not None:
            bw[key].append(row["busbw_gbps"])
    med_bw, med_count = _median_over_ranks(bw), _median_over_ranks(count)
    return [NamedStat(key, med_bw.get(key), med_count[key]) for key in sorted(med_count)]


def collectives_per_step(kernels: list[dict[str, Any]]) -> Maybe[dict[str, float]]:
    """Collective kind -> median count per (rank, step), from the rows of
    :func:`stepscope.analysis.comm.collective_kernels` (kernels outside any step are left out;
    kinds with a median of 0 too)."""
    per: dict[str, dict[tuple[int, int], int]] = defaultdict(lambda: defaultdict(int))
    rank_steps: set[tuple[int, int]] = set()
    for row in kernels:
        if row["step"] is None:
            continue
        per[row["collective"] or "unknown"][(row["rank"], row["step"])] += 1
        rank_steps.add((row["rank"], row["step"]))
    if not rank_steps:
        return Absent("no communication kernels inside steps")
    medians = {kind: median([by_step.get(rs, 0) for rs in sorted(rank_steps)])
               for kind, by_step in sorted(per.items())}
    # a kind absent from most steps (a kernel whose launch the trace missed) is not the structure
    return {kind: n for kind, n in medians.items() if n > 0}


def copy_stats(store: SQLStore, run: str) -> Maybe[list[NamedStat]]:
    """Per copy direction and host memory: achieved bandwidth (median over ranks) and bytes."""
    rows = copy_summary(store, run, per_step=False).to_pylist()
    if not rows:
        return Absent("no memcpy events in this run's traces")
    bw: dict[str, list[float]] = defaultdict(list)
    size: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        key = f"{row['direction']} {row['host_memory'] or ''}".strip()
        size[key].append(float(row["bytes"] or 0))
        if row["bandwidth_gbps"] is not None:
            bw[key].append(row["bandwidth_gbps"])
    med_bw, med_size = _median_over_ranks(bw), _median_over_ranks(size)
    return [NamedStat(key, med_bw.get(key), med_size[key]) for key in sorted(med_size)]


def cpu_op_stats(store: SQLStore, run: str, steps: int) -> Maybe[list[NamedStat]]:
    """Per CPU operator name: time and calls per profiled step (median over ranks), from
    :func:`stepscope.analysis.kernels.top_cpu_ops` (ops inside steps)."""
    if steps == 0:
        return Absent("no ProfilerStep#N annotations: op time per step is undefined")
    return _per_step_by_name(top_cpu_ops(store, run, TOP_KERNELS).to_pylist(), steps,
                             "no CPU ops in this run's traces")


def run_profile(store: SQLStore, run: str, source: str) -> RunProfile:
    """Gather everything the comparison needs about ``run``, its step time from ``source``
    (:func:`step_source`)."""
    facts = run_facts(store, run)
    samples = step_samples(store, run, source)
    kernels = collective_kernels(store, run).to_pylist()
    samples["busbw"] = busbw_samples(kernels)
    samples.update(copy_bandwidth_samples(store, run))
    peaks, device = peak_memory_samples(store, run)
    return RunProfile(
        facts=facts,
        step_source=source,
        samples=samples,
        peak_memory=peaks,
        peak_memory_device=device,
        kernels=kernel_stats(store, run, facts.steps),
        collectives=collective_stats(store, run),
        copies=copy_stats(store, run),
        collectives_per_step=collectives_per_step(kernels),
        cpu_ops=cpu_op_stats(store, run, facts.steps),
    )
