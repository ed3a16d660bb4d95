"""Independent reference figures computed in plain Python straight from a trace's JSON.

The analyses compute in DuckDB over the store; the tests recompute the same figures here,
without the store, so that a bug in either side shows up as a mismatch.
"""

from __future__ import annotations

import bisect
import copy
import re
from pathlib import Path
from typing import Any, Callable

from tests._intervals import Intervals, clip, length, to_ns, union
from tests.conftest import write_trace

COMM_KERNEL = re.compile(r"^nccl|^rccl|multimem_", re.IGNORECASE)


def span_ns(doc: dict[str, Any], event: dict[str, Any]) -> tuple[int, int]:
    """Absolute [start, end) in ns, the store's documented rule (base + round(ts * 1000))."""
    start = to_ns(doc, event["ts"])
    return start, start + round(event["dur"] * 1000)


def kernels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]


def comm_kernels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Communication kernels in time order."""
    return sorted((e for e in kernels(doc) if COMM_KERNEL.search(e["name"])), key=lambda e: e["ts"])


def compute_union(doc: dict[str, Any]) -> Intervals:
    """Union of the compute kernels (every kernel that is not communication)."""
    return union([span_ns(doc, e) for e in kernels(doc) if not COMM_KERNEL.search(e["name"])])


def covered(start: int, end: int, islands: Intervals) -> int:
    """Length of ``[start, end)`` inside the disjoint sorted ``islands`` (bisected to the few
    islands that can touch it, then clipped)."""
    lo = max(0, bisect.bisect_right(islands, (start, start)) - 1)
    hi = bisect.bisect_left(islands, (end, end))
    return length(clip(islands[lo:hi], start, end))


def profiler_steps(doc: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(step, start_ns, end_ns) of every ProfilerStep#N annotation."""
    return sorted(
        (int(e["name"].split("#")[1]), *span_ns(doc, e))
        for e in doc["traceEvents"]
        if re.fullmatch(r"ProfilerStep#\d+", e.get("name", "")) and e.get("ph") == "X"
    )


def rank_copy(doc: dict[str, Any], rank: int, shift_us: Callable[[int], float], path: Path,
              stretch_compute: float = 1.0) -> Path:
    """Write ``doc`` as another rank of the same job, with a hand-known arrival skew.

    The i-th communication kernel (time order) starts ``shift_us(i)`` microseconds later and
    ends when the original does (a late arrival shortens the wait, so the kernel is shorter);
    compute kernels are stretched by ``stretch_compute``. Everything else is unchanged.
    """
    out = copy.deepcopy(doc)
    out["distributedInfo"] = {**(out.get("distributedInfo") or {}), "rank": rank}
    comm_ids = {id(e): i for i, e in enumerate(comm_kernels(out))}
    for event in kernels(out):
        if id(event) in comm_ids:
            shift = shift_us(comm_ids[id(event)])
            event["ts"] += shift
            event["dur"] -= shift
        elif stretch_compute != 1.0:
            event["dur"] *= stretch_compute
    return write_trace(path, out["traceEvents"], **{k: v for k, v in out.items() if k != "traceEvents"})


def gpu_steps(doc: dict[str, Any]) -> dict[int, int]:
    """Correlation id -> step of the GPU work it launched: the ProfilerStep#N window in which the
    CPU launch call (``cuda_runtime``/``cuda_driver``) with that correlation starts (the store's
    rule: GPU work inherits the step of its launch)."""
    steps = profiler_steps(doc)
    out: dict[int, int] = {}
    for e in doc["traceEvents"]:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            start = to_ns(doc, e["ts"])
            step = next((s for s, lo, hi in steps if lo <= start < hi), None)
            if step is not None:
                out[e["args"]["correlation"]] = step
    return out


def step_windows(doc: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """Step -> [w0, w1) by the TensorBoard plugin's rule (docs/ANALYSIS.md, "Step windows"):
    GPU work belongs to the step holding its launch, a window ends when the CPU and the step's
    GPU work are done, and starts no earlier than the previous one ended."""
    steps = profiler_steps(doc)
    launch = {e["args"]["correlation"]: span_ns(doc, e)[0] for e in doc["traceEvents"]
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    gpu_end: dict[int, int] = {}
    for e in doc["traceEvents"]:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset") or e.get("dur", 0) <= 0:
            continue
        start, end = span_ns(doc, e)
        t = launch.get(e.get("args", {}).get("correlation"), start)
        step = next((s for s, a, b in steps if a <= t < b), None)
        if step is not None:
            gpu_end[step] = max(gpu_end.get(step, end), end)
    out, prev = {}, None
    for step, a, b in steps:
        w0 = a if prev is None else max(a, prev)
        w1 = max(b, gpu_end.get(step, b), w0)
        out[step], prev = (w0, w1), w1
    return out
