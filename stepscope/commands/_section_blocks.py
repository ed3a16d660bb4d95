"""Terminal and Markdown blocks for the summary sections whose generic rendering would bury the
figure that matters: the pipeline's bubbles beside the schedule's ideal, MFU per step.

Pure: summary JSON in (docs/SUMMARY_JSON.md), ``(title, columns, rows)`` blocks out, in the
units of :mod:`stepscope.units`. ``stepscope summary`` looks a section up here and falls
back to its generic rendering for the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from stepscope.units import MISSING, count, format_value, percent, significant, since

Block = tuple[str, list[str], list[list[str]]]


def ns_cell(value: Any) -> str:
    """A duration in ns as text (``n/a`` when missing)."""
    return format_value(value, "ns")


def _fraction(value: Any) -> str:
    return MISSING if value is None else percent(100 * value)


def pipeline_blocks(title: str, pipe: dict[str, Any]) -> Iterator[Block]:
    """The schedule and its ideal, then every stage's step: busy and the bubble split."""
    reasons = pipe.get("absent_reasons", {})
    per_rank = pipe.get("stages_per_rank") or 1
    shape = f"{pipe['stages_count']} stages" + (f" x {per_rank} per rank" if per_rank > 1 else "")
    microbatches = pipe.get("microbatches")
    yield (f"{title}: {pipe['schedule']}, {shape}, "
           + (f"{microbatches} microbatches" if microbatches is not None else "microbatches unknown"),
           ["pipelines (ranks in stage order)", "ideal bubble", "measured bubble"],
           [[" ; ".join(" -> ".join(map(str, p)) for p in pipe["pipelines"]),
             _fraction(pipe.get("ideal_fraction")) if "ideal_fraction" not in reasons else f"- ({reasons['ideal_fraction']})",
             _fraction(pipe.get("measured_fraction"))]])
    ideal = pipe.get("ideal_fraction")
    yield (f"{title}: per stage and step (bubble = fill + wait + drain)",
           ["stage", "rank", "step", "step time", "busy", "fill", "wait", "drain", "bubble", "vs ideal", "order"],
           [[str(s["stage"]), str(s["rank"]), str(s["step"]), ns_cell(s["step_ns"]), ns_cell(s["busy_ns"]), ns_cell(s["fill_ns"]),
             ns_cell(s["wait_ns"]), ns_cell(s["drain_ns"]), _fraction(s["bubble_fraction"]),
             MISSING if ideal is None or s["bubble_fraction"] is None else f"{100 * (s['bubble_fraction'] - ideal):+.0f} pts",
             s["order"]] for s in pipe["stages"]])


def _tflops(value: Any) -> str:
    return MISSING if value is None else significant(value)


def _gflop(flops: Any) -> str:
    return MISSING if flops is None else count(round(flops / 1e9, 3))


def _why_not(rows: list[dict[str, Any]], key: str) -> Iterator[Block]:
    """One row per distinct reason a column is n/a."""
    reasons = sorted({(r.get("absent_reasons") or {}).get(key) for r in rows} - {None})
    if reasons:
        yield (f"why {key} is n/a", ["reason"], [[reason] for reason in reasons])


def mfu_blocks(title: str, rows: list[dict[str, Any]]) -> Iterator[Block]:
    """Per rank and step: model FLOPs, achieved TFLOP/s, the peak used and MFU (or why none)."""
    yield (f"{title}: model FLOPs and MFU per step",
           ["rank", "step", "GFLOP", "matmul", "conv", "attention", "step time", "TFLOP/s", "dtype", "peak TFLOP/s",
            "MFU"],
           [[str(r["rank"]), str(r["step"]), _gflop(r["flops"]),
             *(_fraction(r[f"{f}_flops"] / r["flops"]) if r["flops"] else MISSING for f in ("matmul", "conv", "attention")),
             ns_cell(r["step_ns"]), _tflops(r["achieved_tflops"]), r["dtype"] or MISSING, _tflops(r["peak_tflops"]),
             _fraction(r["mfu"])] for r in rows])
    yield from _why_not(rows, "mfu")


def _skipped(row: dict[str, Any]) -> str:
    """``318 (136 ms)``: the ops the FLOP count skipped and their kernels' time."""
    ops = row.get("uncounted_ops") or 0
    kernels = row.get("uncounted_kernel_ns")
    return count(ops) + (f" ({ns_cell(kernels)})" if ops and kernels is not None else "")


def family_blocks(title: str, rows: list[dict[str, Any]]) -> Iterator[Block]:
    """Per rank and op family: FLOPs over the time of their kernels (or CPU ops), against peak."""
    yield (f"{title}: achieved TFLOP/s per op family (whole trace; skipped: ops the count could not size, "
           "and their kernels' time)",
           ["rank", "family", "ops", "skipped", "GFLOP", "time", "on", "TFLOP/s", "dtype", "peak TFLOP/s", "of peak"],
           [[str(r["rank"]), r["family"], count(r["ops"]), _skipped(r), _gflop(r["flops"]), ns_cell(r["time_ns"]),
             "GPU kernels" if r["time_source"] == "gpu_kernels" else "CPU ops", _tflops(r["achieved_tflops"]),
             r["dtype"] or MISSING, _tflops(r["peak_tflops"]), _fraction(r["of_peak"])] for r in rows])
    yield from _why_not(rows, "peak_tflops")


def _ranks(ranks: Any) -> str:
    return ", ".join(map(str, ranks or [])) or MISSING


def late_blocks(title: str, late: dict[str, Any], origin: float | None = None) -> Iterator[Block]:
    """Per step with late ranks: who was late, who waited and how long, when (since the run's
    start) and where the lateness came from."""
    steps = late.get("steps") or []
    yield (f"{title}: late ranks per step ({late.get('profiled_steps', MISSING)} profiled steps)",
           ["step", "late ranks", "waiting ranks", "collective", "longest wait", "caused wait", "late arrival",
            "late by", "from", "cause"],
           [[str(r["step"]), _ranks(r["late_ranks"]), _ranks(r["waiting_ranks"]), r["collective"] or MISSING,
             ns_cell(r["max_wait_ns"]), ns_cell(r["caused_wait_ns"]),
             since(r["late_arrival_ns"], origin) if origin is not None and r["late_arrival_ns"] is not None else MISSING,
             ns_cell(r["lateness_ns"]), (r["origin"] or MISSING).replace("_", " "), r["cause"] or MISSING]
            for r in steps] or [["-", "-", "-", "-", "-", "-", "-", "-", "-", "no step with late ranks"]])


SectionBlocks = Callable[[str, Any, "float | None"], Iterator[Block]]
"""A section's renderer: title, its JSON, the run's start (what times are relative to)."""

SECTION_BLOCKS: dict[str, SectionBlocks] = {
    "pipeline": lambda title, value, _origin: pipeline_blocks(title, value),
    "mfu": lambda title, value, _origin: mfu_blocks(title, value),
    "flops_by_family": lambda title, value, _origin: family_blocks(title, value),
    "late": late_blocks,
}
"""Section name -> its blocks; sections not here are rendered generically."""
