"""FLOPs per op, per step and per op family, achieved TFLOP/s, and MFU against the device's peak.

Per rank, from the tables its traces' ingest wrote (``rank_flop_ops``, ``rank_flop_traces``:
:mod:`stepscope.store.rankstats.flops`, where the formulas and the counting rule below are
applied in SQL; docs/ANALYSIS.md, "FLOPs and MFU"):

- **Which ops count.** Candidates are the CPU ops of a FLOP family
  (:data:`stepscope.analysis.flop_formulas.FLOP_OPS`). An op's FLOPs come from its recorded
  shapes (one formula per op), else from the trace's own
  ``flops`` arg (``with_flops=True`` in torch versions that export it). Each product is counted
  once, at its **leaf**: the op that does it (``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``,
  ``aten::convolution`` and its backward, the attention ops), the outermost leaf with FLOPs
  when leaves nest (the flash kernel's own op inside ``aten::_scaled_dot_product_flash_attention``,
  the bmms of the math variant, do not count again). A **wrapper** (``aten::linear``,
  ``aten::matmul``, ``aten::conv2d``, ``aten::scaled_dot_product_attention``) counts only when no
  leaf with FLOPs was recorded inside it on its thread (a trace that recorded the wrapper's
  shapes or ``flops`` but not its leaves), and never inside a counted op.
- **dtype**: the op's first input whose ``Input type`` is an element type
  (:data:`stepscope.store.rankstats.flops.TRACE_DTYPES`). A float32 op is judged against the FP32 peak
  (PyTorch's default: no TF32), the TF32 peak only when a kernel it launched is a TF32 kernel
  (:data:`stepscope.analysis.peaks.TF32_KERNEL`).
- **Time of a family**: on a GPU rank, the summed duration of the compute kernels launched
  while its counted ops ran (launch on the op's thread, inside the op); on a CPU-only rank, the
  summed duration of the counted ops themselves. ``achieved_tflops = flops / time``.
- **Per step**: ``flops`` of the counted ops of the step (by the step of the op's CPU start),
  ``step_ns`` the step window (:func:`stepscope.analysis.breakdown.step_windows`),
  ``achieved_tflops = flops / step_ns``. ``ideal_ns = sum over the ops of flops / peak(dtype)``
  (what the products would take at the device's dense peak); ``mfu = ideal_ns / step_ns``;
  ``peak_tflops = flops / ideal_ns`` (the peak of the dtype, or the FLOP-weighted harmonic mean
  of the dtypes' peaks when a step mixes them); ``dtype`` the dtype carrying most of the FLOPs.
  Absent with the reason on CPU-only ranks, unknown devices and dtypes without a peak.

Recomputed forward ops (activation checkpointing) ran, so they count: on such runs the figure
is closer to hardware FLOPs than to model FLOPs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from stepscope.analysis._local import local_sql
from stepscope.analysis._sql import rank_filter
from stepscope.analysis.absent import NO_STEPS, Absent, Maybe
from stepscope.analysis.basis import StepBasis, basis_of
from stepscope.analysis.breakdown import step_windows
from stepscope.analysis.cache import cached_frame
from stepscope.analysis.findings import Finding, Results, Severity, rule
from stepscope.analysis.flop_formulas import FAMILIES
from stepscope.analysis.peaks import DevicePeak, device_peak, peak_dtype
from stepscope.analysis.quantiles import median
from stepscope.analysis.sections import SQLStore, section
from stepscope.store.rankstats.flops import SKIPPED_LEAF, skipped_kernels_query
from stepscope.store.rankstats.parts import COMPUTE
from stepscope.units import duration

FLOPS_PER_NS_PER_TFLOPS = 1e3
"""1 TFLOP/s = 1e12 FLOP / 1e9 ns = 1e3 FLOP per ns."""

OPS_SCHEMA = pa.schema([
    ("rank", pa.int64()), ("step", pa.int64()), ("source", pa.string()), ("pid", pa.int64()),
    ("tid", pa.int64()), ("name", pa.string()), ("family", pa.string()), ("leaf", pa.bool_()), ("ts_ns", pa.int64()),
    ("dur_ns", pa.int64()), ("flops", pa.int64()), ("flops_source", pa.string()), ("dtype", pa.string()),
    ("counted", pa.bool_()), ("reason", pa.string()), ("gpu_ns", pa.int64()), ("kernels", pa.int64()),
    ("tf32", pa.bool_()),
])
"""One row per candidate op: whether it is a leaf (the op doing the products) or a wrapper, its
FLOPs (null when unknown), where they came from (``shapes`` or ``kineto``), whether it is
counted, and why not (``reason``); the compute kernels a counted op launched (``gpu_ns``,
``kernels``, ``tf32``: :func:`flop_ops`)."""

NO_FLOP_OPS = ("no matrix product, convolution or attention op with recorded shapes in this run's traces "
               "(profile with record_shapes=True)")
NO_SHAPES = "the traces of this run record no shapes (Input Dims): profile with record_shapes=True"
CPU_ONLY = "CPU-only rank: MFU is measured against an accelerator's dense peak, and this rank has none"


@cached_frame("flop_ops")
def flop_ops(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Every candidate op of the run with its FLOPs and whether it is counted (:data:`OPS_SCHEMA`,
    module docs), with ``gpu_ns``/``kernels``: the compute kernels each counted op launched (null
    on ops not counted and on ranks where no compute kernel's launch was recorded); ``tf32``: one
    of them is a TF32 kernel. Read from ``rank_flop_ops`` (computed per trace at ingest:
    :mod:`stepscope.store.rankstats.flops`)."""
    rf, extra = rank_filter(ranks, "o.rank")
    ops = store.sql(f"""
        WITH g AS (SELECT rank, bool_or(launches) AS launches FROM rank_flop_traces WHERE run = $run GROUP BY rank)
        SELECT o.rank, o.step, o.source::VARCHAR AS source, o.pid, o.tid, o.name, o.family::VARCHAR AS family,
               o.leaf, o.ts_ns, o.dur_ns, o.flops, o.flops_source::VARCHAR AS flops_source, o.dtype::VARCHAR AS dtype,
               o.counted, o.reason,
               CASE WHEN g.launches THEN o.gpu_ns END AS gpu_ns, CASE WHEN g.launches THEN o.kernels END AS kernels,
               o.tf32
        FROM rank_flop_ops o LEFT JOIN g ON g.rank = o.rank
        WHERE o.run = $run AND {rf}
        ORDER BY o.rank, o.ts_ns, o.source, o.pid, o.tid, o.dur_ns DESC, o.leaf, o.name
    """, {"run": run, **extra})
    return ops.cast(OPS_SCHEMA)


# ---- ops the count skipped ----

SIZED_COVERAGE_MIN = 0.9
"""MFU needs the sized (counted) product ops' kernels to take at least this share of the kernel
time of every product op, sized or skipped: below it the FLOP count misses too much of the work."""


@dataclass(frozen=True)
class Coverage:
    """How much of a rank's product ops' kernel time the FLOP count sized: the counted ops'
    kernels (``sized_ns``) against those of the leaves it skipped (``skipped_ns``, ``skipped_ops``)."""

    sized_ns: int
    skipped_ns: int
    skipped_ops: int

    @property
    def share(self) -> float | None:
        total = self.sized_ns + self.skipped_ns
        return self.sized_ns / total if total else None

    def absence(self) -> str | None:
        """Why MFU is not stated for this rank (too little of the products sized), or None."""
        share = self.share
        if share is None or share >= SIZED_COVERAGE_MIN:
            return None
        return (f"the FLOP count skipped {self.skipped_ops:,} product ops it could not size (no shapes, stride or "
                f"padding recorded), whose kernels took {duration(self.skipped_ns)}: the sized ops' kernels are "
                f"{share:.0%} of the product ops' kernel time, and MFU needs {SIZED_COVERAGE_MIN:.0%}")


def skipped_kernels(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> dict[tuple[int, str], tuple[int, int]]:
    """Per (rank, family): (skipped ops, the summed duration of the compute kernels they
    launched, each kernel once), for the leaves whose shapes gave no figure; only families whose
    skipped ops launched a kernel.

    Read from ``rank_flop_skipped``, which ingest writes; a trace ingested before that table
    existed (a skipped leaf in ``rank_flop_ops``, no row there) is counted from its events with
    the same query (64 ranks of df_index_resolver: 4 s of CPU, which the table saves)."""
    rf, extra = rank_filter(ranks)
    params = {"run": run, **extra}
    rows = store.sql(f"SELECT rank, family, ops, kernel_ns FROM rank_flop_skipped WHERE run = $run AND {rf}",
                     params).to_pylist()
    stale = f"""source IN (SELECT source FROM rank_flop_ops WHERE run = $run AND {rf} AND {SKIPPED_LEAF}
                           EXCEPT SELECT source FROM rank_flop_skipped WHERE run = $run)"""
    if store.sql(f"SELECT count(*) > 0 AS any FROM rank_flop_ops WHERE run = $run AND {rf} AND {stale}",
                 params).to_pylist()[0]["any"]:
        recount = skipped_kernels_query("rank_flop_ops", ("rank", "source"), f"run = $run AND {rf} AND {stale}")
        rows += store.sql(recount, params).to_pylist()
    launched = {(r["rank"], r["family"]) for r in rows if r["kernel_ns"] is not None}
    out: dict[tuple[int, str], tuple[int, int]] = {}
    for r in rows:
        key = (r["rank"], r["family"])
        if key in launched:
            ops, kernel_ns = out.get(key, (0, 0))
            out[key] = (ops + r["ops"], kernel_ns + (r["kernel_ns"] or 0))
    return out


def coverage(ops: pa.Table, skipped: dict[tuple[int, str], tuple[int, int]]) -> dict[int, Coverage]:
    """Per rank: :class:`Coverage` from the counted ops' kernels (``flop_ops``) and :func:`skipped_kernels`."""
    # Summed in SQL: a 1,024-rank run has millions of ops (a Python loop over them took 10 s), and
    # Arrow's group_by imports acero and dataset on its first call.
    per_rank = local_sql("SELECT rank, sum(gpu_ns)::BIGINT AS gpu_ns FROM ops "
                         "WHERE counted AND gpu_ns IS NOT NULL AND gpu_ns <> 0 GROUP BY rank", ops=ops)
    sized = dict(zip(per_rank.column("rank").to_pylist(), per_rank.column("gpu_ns").to_pylist()))
    by_rank: dict[int, list[tuple[int, int]]] = {}
    for (rank, _), value in skipped.items():
        by_rank.setdefault(rank, []).append(value)
    out: dict[int, Coverage] = {}
    for rank in {*sized, *by_rank}:
        parts = by_rank.get(rank, [])
        out[rank] = Coverage(sized.get(rank, 0), sum(ns for _, ns in parts), sum(n for n, _ in parts))
    return out


# ---- per step and per family ----


@dataclass(frozen=True)
class Device:
    """What a rank ran on: the trace's device name, its peak row, and whether it has GPU kernels."""

    name: str | None
    peak: DevicePeak | None
    gpu: bool

    def absence(self) -> str | None:
        """Why this rank has no peak, or None."""
        if not self.gpu:
            return CPU_ONLY
        if self.name is None:
            return "the trace records no device name (no deviceProperties): its peak is unknown"
        if self.peak is None:
            return f"no dense peak known for {self.name!r} (the table in stepscope.analysis.peaks)"
        return None


def rank_devices(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> dict[int, Device]:
    """Per rank: its device (name, peak row, GPU kernels in any of its traces: ``rank_flop_traces``)."""
    rf, extra = rank_filter(ranks, "s.rank")
    rows = store.sql(f"""
        WITH t AS (SELECT rank, bool_or(kernels) AS gpu FROM rank_flop_traces WHERE run = $run GROUP BY rank)
        SELECT s.rank, any_value(s.gpu_name) AS gpu_name, coalesce(any_value(t.gpu), FALSE) AS gpu
        FROM sources s LEFT JOIN t ON t.rank = s.rank WHERE s.run = $run AND {rf} GROUP BY s.rank
    """, {"run": run, **extra}).to_pylist()
    return {r["rank"]: Device(r["gpu_name"], device_peak(r["gpu_name"]), bool(r["gpu"])) for r in rows}


@dataclass(frozen=True)
class Ideal:
    """Some ops' FLOPs, the dtype carrying most of them, and the time they would take at peak
    (``ns``; None with ``reason`` when there is no peak)."""

    flops: int
    dtype: str | None
    ns: float | None
    reason: str | None
    peak_dtype: str | None

    @property
    def peak_tflops(self) -> float | None:
        """``flops / ns``: the dtype's peak, or the FLOP-weighted harmonic mean of several."""
        return tflops(self.flops, self.ns) if self.ns else None


def tflops(flops: float, ns: float | None) -> float | None:
    """FLOPs over nanoseconds in TFLOP/s; None without a time."""
    return flops / ns / FLOPS_PER_NS_PER_TFLOPS if ns else None


def ideal_time(device: Device, flops_by_math: dict[tuple[str | None, bool], int]) -> Ideal:
    """``sum flops / peak(dtype)`` in ns over some ops' FLOPs by (dtype, ran on TF32 kernels)
    (module docs)."""
    flops_by_math = {d: f for d, f in flops_by_math.items() if f}
    flops_by_dtype: dict[str | None, int] = {}
    for (op_dtype, _), op_flops in flops_by_math.items():
        flops_by_dtype[op_dtype] = flops_by_dtype.get(op_dtype, 0) + op_flops
    flops = sum(flops_by_dtype.values())
    dtype = max(flops_by_dtype, key=lambda d: flops_by_dtype[d]) if flops_by_dtype else None
    reason = device.absence()
    if reason is None and not flops:
        reason = "no FLOPs counted: no peak to relate them to"
    if reason:
        return Ideal(flops, dtype, None, reason, None)
    assert device.peak is not None
    ns = 0.0
    columns = set()
    for (op_dtype, tf32), op_flops in flops_by_math.items():
        column = peak_dtype(device.peak, op_dtype, tf32)
        if column is None:
            return Ideal(flops, dtype, None, f"no {op_dtype or 'unknown dtype'} peak for {device.peak.device} "
                         "in the peak table", None)
        columns.add(column)
        ns += op_flops / (device.peak.tflops[column] * FLOPS_PER_NS_PER_TFLOPS)
    return Ideal(flops, dtype, ns, None, "+".join(sorted(columns)))


def _grouped(rows: list[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(tuple(row[k] for k in keys), []).append(row)
    return out


def _shapes_recorded(store: SQLStore, run: str, ranks: Sequence[int] | None) -> set[int]:
    """Ranks with a trace whose CPU ops recorded shapes (``Input Dims``)."""
    rf, extra = rank_filter(ranks)
    rows = store.sql(f"SELECT DISTINCT rank FROM rank_flop_traces WHERE run = $run AND shapes AND {rf}",
                     {"run": run, **extra}).to_pylist()
    return {r["rank"] for r in rows}


def mfu_steps(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[pa.Table]:
    """Per rank and step: FLOPs (all and per family), step time, achieved TFLOP/s, peak, MFU.

    Columns: ``rank, step, flops, matmul_flops, conv_flops, attention_flops, step_ns,
    achieved_tflops, ideal_ns, peak_tflops, peak_dtype, dtype, mfu, device, kernel_ns`` (the
    summed duration of the kernels the step's counted ops launched; null on CPU-only ranks),
    ``absent_reason`` (why ``peak_tflops``/``mfu``/``ideal_ns`` are null). Ranks without recorded shapes have no
    rows; the result is :class:`Absent` when no rank has both shapes and steps.
    """
    recorded = _shapes_recorded(store, run, ranks)
    if not recorded:
        return Absent(NO_SHAPES)
    ops = flop_ops(store, run, ranks)
    windows = step_windows(store, run, ranks)
    per_dtype = local_sql(f"""
        SELECT w.rank, w.step, w.dur_ns AS step_ns, o.dtype, coalesce(o.tf32, FALSE) AS tf32, {", ".join(
            f"coalesce(sum(o.flops) FILTER (WHERE o.family = '{f}'), 0)::BIGINT AS {f}_flops" for f in FAMILIES)},
               coalesce(sum(o.flops), 0)::BIGINT AS flops, sum(o.gpu_ns)::BIGINT AS kernel_ns
        FROM windows w LEFT JOIN (SELECT * FROM ops WHERE counted) o ON o.rank = w.rank AND o.step = w.step
        WHERE list_contains($recorded, w.rank)
        GROUP BY ALL ORDER BY w.rank, w.step
    """, {"recorded": sorted(recorded)}, ops=ops, windows=windows).to_pylist()
    if not per_dtype:
        return Absent(NO_STEPS)
    devices = rank_devices(store, run, ranks)
    covered = coverage(ops, skipped_kernels(store, run, ranks))
    return pa.Table.from_pylist(list(_step_rows(per_dtype, devices, covered)), schema=MFU_SCHEMA)


MFU_SCHEMA = pa.schema([
    ("rank", pa.int64()), ("step", pa.int64()), ("flops", pa.int64()),
    *[(f"{f}_flops", pa.int64()) for f in FAMILIES], ("step_ns", pa.int64()),
    ("achieved_tflops", pa.float64()), ("ideal_ns", pa.float64()), ("peak_tflops", pa.float64()),
    ("peak_dtype", pa.string()), ("dtype", pa.string()), ("mfu", pa.float64()), ("device", pa.string()),
    ("kernel_ns", pa.int64()), ("absent_reason", pa.string()),
])


def _step_rows(per_dtype: list[dict[str, Any]], devices: dict[int, Device],
               covered: dict[int, Coverage]) -> Iterator[dict[str, Any]]:
    """One row per (rank, step) from the rows per (rank, step, dtype); MFU absent on a rank whose
    count sized too little of the products (:class:`Coverage`)."""
    for (rank, step), parts in _grouped(per_dtype, "rank", "step").items():
        device = devices.get(rank, Device(None, None, False))
        ideal = ideal_time(device, {(p["dtype"], p["tf32"]): p["flops"] for p in parts})
        thin = covered[rank].absence() if rank in covered else None
        if thin and (ideal.reason is None or not ideal.flops):
            ideal = Ideal(ideal.flops, ideal.dtype, None, thin, None)
        step_ns = parts[0]["step_ns"]
        peak = ideal.peak_tflops
        yield {
            "rank": rank, "step": step, "flops": ideal.flops,
            **{f"{f}_flops": sum(p[f"{f}_flops"] for p in parts) for f in FAMILIES},
            "step_ns": step_ns, "achieved_tflops": tflops(ideal.flops, step_ns),
            "ideal_ns": ideal.ns if peak is not None else None, "peak_tflops": peak,
            "peak_dtype": ideal.peak_dtype if peak is not None else None, "dtype": ideal.dtype,
            "mfu": ideal.ns / step_ns if peak is not None and ideal.ns and step_ns else None,
            "device": device.name,
            "kernel_ns": sum(p["kernel_ns"] or 0 for p in parts) if device.gpu else None,
            "absent_reason": ideal.reason if peak is None else None,
        }


def flops_by_family(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[pa.Table]:
    """Per rank and family, over the whole trace: counted ops, FLOPs, their time (GPU kernels on a
    GPU rank, the ops' own CPU time otherwise: ``time_source``), achieved TFLOP/s, the dtype's
    peak and the fraction of it reached (``of_peak``), and the ops of the family not counted
    for want of shapes (``uncounted_ops``: leaves only; nested and wrapper ops are not among them)."""
    ops = flop_ops(store, run, ranks)
    if ops.num_rows == 0:
        return Absent(NO_FLOP_OPS)
    families = local_sql("""
        SELECT rank, family, dtype, tf32,
               count(*) FILTER (WHERE counted) AS ops,
               count(*) FILTER (WHERE flops IS NULL AND leaf) AS uncounted_ops,
               coalesce(sum(flops) FILTER (WHERE counted), 0)::BIGINT AS flops,
               sum(dur_ns) FILTER (WHERE counted)::BIGINT AS cpu_ns,
               sum(gpu_ns) FILTER (WHERE counted)::BIGINT AS gpu_ns,
               sum(kernels) FILTER (WHERE counted)::BIGINT AS kernels
        FROM ops GROUP BY ALL ORDER BY rank, family, dtype NULLS LAST
    """, ops=ops).to_pylist()
    devices = rank_devices(store, run, ranks)
    skipped = skipped_kernels(store, run, ranks)
    return pa.Table.from_pylist(list(_family_rows(families, devices, skipped)), schema=FAMILY_SCHEMA)


FAMILY_SCHEMA = pa.schema([
    ("rank", pa.int64()), ("family", pa.string()), ("ops", pa.int64()), ("uncounted_ops", pa.int64()),
    ("uncounted_kernel_ns", pa.int64()), ("flops", pa.int64()), ("kernels", pa.int64()), ("time_ns", pa.int64()), ("time_source", pa.string()),
    ("achieved_tflops", pa.float64()), ("peak_tflops", pa.float64()), ("of_peak", pa.float64()),
    ("dtype", pa.string()), ("absent_reason", pa.string()),
])


def _family_rows(rows: list[dict[str, Any]], devices: dict[int, Device],
                 skipped: dict[tuple[int, str], tuple[int, int]]) -> Iterator[dict[str, Any]]:
    """One row per (rank, family) from the rows per (rank, family, dtype); ``uncounted_kernel_ns``:
    the compute kernels the uncounted leaves launched (null on a CPU-only rank)."""
    for (rank, family), parts in _grouped(rows, "rank", "family").items():
        device = devices.get(rank, Device(None, None, False))
        ideal = ideal_time(device, {(p["dtype"], p["tf32"]): p["flops"] for p in parts})
        time_ns = sum(p["gpu_ns" if device.gpu else "cpu_ns"] or 0 for p in parts)
        achieved, peak = tflops(ideal.flops, time_ns), ideal.peak_tflops
        reasons = [r for r in (ideal.reason if peak is None else None,
                               "no time measured for these ops" if achieved is None and ideal.flops else None) if r]
        yield {
            "rank": rank, "family": family, "ops": sum(p["ops"] for p in parts),
            "uncounted_ops": sum(p["uncounted_ops"] for p in parts),
            "uncounted_kernel_ns": skipped.get((rank, family), (0, 0))[1] if device.gpu else None,
            "flops": ideal.flops,
            "kernels": sum(p["kernels"] or 0 for p in parts) if device.gpu else None,
            "time_ns": time_ns, "time_source": "gpu_kernels" if device.gpu else "cpu_ops",
            "achieved_tflops": achieved, "peak_tflops": peak,
            "of_peak": achieved / peak if achieved is not None and peak else None,
            "dtype": ideal.dtype, "absent_reason": "; ".join(reasons) or None,
        }


# ---- summary sections ----

MFU_KEYS = ("rank", "step", "flops", *(f"{f}_flops" for f in FAMILIES), "step_ns", "achieved_tflops",
            "peak_tflops", "dtype", "mfu", "peak_dtype", "ideal_ns", "device", "kernel_ns")
"""Keys of each ``mfu`` item (docs/SUMMARY_JSON.md); the first eleven are the issue's contract."""

_PEAK_KEYS = ("peak_tflops", "mfu", "peak_dtype", "ideal_ns")


def _with_reasons(row: dict[str, Any], keys: Sequence[str], absent_keys: Sequence[str]) -> dict[str, Any]:
    """``row`` restricted to ``keys``; the null ``absent_keys`` become :class:`Absent` with the row's reason."""
    reason = row.get("absent_reason")
    return {k: Absent(reason) if k in absent_keys and row[k] is None and reason else row[k] for k in keys}


@section("mfu", order=55, to_json=lambda t: [_with_reasons(r, MFU_KEYS, _PEAK_KEYS) for r in t.to_pylist()])
def mfu_section(store: SQLStore, run: str, ranks: Sequence[int] | None) -> Maybe[pa.Table]:
    """Per rank and step: model FLOPs (matmul, convolution, attention), achieved TFLOP/s, and
    MFU against the device's dense peak for the dtype."""
    return mfu_steps(store, run, ranks)


FAMILY_KEYS = ("rank", "family", "ops", "uncounted_ops", "uncounted_kernel_ns", "flops", "kernels", "time_ns", "time_source",
               "achieved_tflops", "peak_tflops", "of_peak", "dtype")


@section("flops_by_family", order=56,
         to_json=lambda t: [_with_reasons(r, FAMILY_KEYS, ("peak_tflops", "of_peak", "achieved_tflops"))
                            for r in t.to_pylist()])
def flops_by_family_section(store: SQLStore, run: str, ranks: Sequence[int] | None) -> Maybe[pa.Table]:
    """Per rank and op family (matmul, conv, attention): FLOPs, the time of their kernels (or
    ops, on CPU), achieved TFLOP/s and the fraction of the dtype's peak."""
    return flops_by_family(store, run, ranks)


# ---- the finding ----

MFU_LOW = 0.30
"""MFU below this (30% of the dense peak) while the step is compute-bound is worth a look."""
COMPUTE_BOUND_SHARE = 0.5
"""A step is compute-bound when compute kernels run (alone) for at least half of its window."""
MFU_MIN_STAKE_NS = 1_000_000
"""Less than 1 ms per step of compute above what peak would need is not a finding."""


def low_mfu_findings(mfu: pa.Table, breakdown: pa.Table, families: pa.Table | Absent,
                     basis: StepBasis | None = None) -> Iterator[Finding]:
    """Per rank: median MFU under :data:`MFU_LOW` over its compute-bound steps (module docs);
    the time at stake is the compute time above what the products would need at peak."""
    compute = {(r["rank"], r["step"]): r for r in breakdown.to_pylist()}
    by_rank: dict[int, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for row in mfu.to_pylist():
        step = compute.get((row["rank"], row["step"]))
        if row["mfu"] is None or step is None or not step["dur_ns"]:
            continue
        if step[COMPUTE.column] >= COMPUTE_BOUND_SHARE * step["dur_ns"]:
            by_rank.setdefault(row["rank"], []).append((row, step))
    fam = {} if isinstance(families, Absent) else {(r["rank"], r["family"]): r for r in families.to_pylist()}
    for rank, pairs in sorted(by_rank.items()):
        value = median([row["mfu"] for row, _ in pairs])
        stake = round(sum(step[COMPUTE.column] - row["ideal_ns"] for row, step in pairs) / len(pairs))
        if value >= MFU_LOW or stake < MFU_MIN_STAKE_NS:
            continue
        row = pairs[0][0]
        compute_ns = sum(step[COMPUTE.column] for _, step in pairs) / len(pairs)
        share = compute_ns / (sum(step["dur_ns"] for _, step in pairs) / len(pairs))
        ideal_ns = sum(r["ideal_ns"] for r, _ in pairs) / len(pairs)
        kernel_ns = sum(r["kernel_ns"] or 0 for r, _ in pairs) / len(pairs)
        rates = [f"{f} at {fam[(rank, f)]['of_peak']:.0%} of peak" for f in FAMILIES
                 if (rank, f) in fam and fam[(rank, f)]["of_peak"] is not None and fam[(rank, f)]["flops"]]
        advice = _advice(row, kernel_ns / compute_ns if compute_ns else 0.0)
        yield Finding(
            Severity.WARNING, "mfu.low",
            f"MFU {value:.1%} on rank {rank} (median of {len(pairs)} compute-bound steps, compute "
            f"{duration(compute_ns)} per step, {basis.of_step(compute_ns) if basis else 'share unknown'}): the products would need {ideal_ns / 1e6:.1f} ms per step at the {row['device']}'s dense "
            f"{_peak_words(row)}; compute takes {compute_ns / 1e6:.1f} ms, "
            f"of which their kernels {kernel_ns / 1e6:.1f} ms" + (f" ({', '.join(rates)})" if rates else "")
            + f": {advice}",
            {"rank": rank, "ranks": [rank], "mfu_median": round(value, 4),
             "steps": len(pairs), "compute_share": round(share, 4), "ideal_ns": round(ideal_ns),
             "compute_ns": round(compute_ns), "kernel_ns": round(kernel_ns), "dtype": row["dtype"],
             "peak_tflops": row["peak_tflops"],
             "device": row["device"]},
            ranks=(rank,),
            time_at_stake_ns=stake,
        )


def _peak_words(row: dict[str, Any]) -> str:
    """``bf16 peak (989 TFLOP/s)``, or for a step of several columns ``fp32 and tf32 peaks (by
    the kernels of each product; 120 TFLOP/s over the step)``."""
    columns = row["peak_dtype"].split("+")
    if len(columns) == 1:
        return f"{columns[0]} peak ({row['peak_tflops']:.0f} TFLOP/s)"
    return (f"{' and '.join(columns)} peaks (by the kernels of each product; {row['peak_tflops']:.0f} TFLOP/s "
            "over the step)")


def _advice(row: dict[str, Any], products_share: float) -> str:
    """What the numbers point at: compute outside the products, float32 without TF32, or slow products."""
    if products_share < 0.5:
        return ("most compute is outside the matrix products (embedding lookups, elementwise ops, normalisation: "
                "memory-bound kernels, see the top kernels), so MFU cannot be high until those shrink")
    device = device_peak(row["device"])
    if row["dtype"] == "float32" and row["peak_dtype"] == "fp32" and device and "tf32" in device.tflops:
        return (f"float32 products on FP32 kernels (no TF32: PyTorch's default): allow TF32 "
                f"(torch.set_float32_matmul_precision('high'), a {device.tflops['tf32']:.0f} TFLOP/s peak) or "
                "train in bfloat16")
    return "the products run far below peak: small or oddly shaped matrices (grow the batch, dimensions in multiples of 64)"


@rule("mfu.low", needs=("mfu", "ranks"))
def mfu_low(results: Results) -> Iterator[Finding]:
    """MFU under 30% of the device's dense peak while compute kernels take at least half of the
    step: the time at stake is the compute time above what the products would need at peak."""
    ranks = results["ranks"]
    breakdown = getattr(ranks, "breakdown", None)
    mfu = results["mfu"]
    if not isinstance(breakdown, pa.Table) or not isinstance(mfu, pa.Table):
        return
    yield from low_mfu_findings(mfu, breakdown, results.get("flops_by_family", Absent("not computed")),
                                basis_of(results))
