"""Edit real Kineto traces to plant known regressions, for the compare tests.

Edits are time warps: time is inserted at chosen points; an event's start moves by the time
inserted at or before it, its end by the time inserted strictly before it (so an event that ends
exactly where time is inserted keeps its duration). So the edited trace stays self-consistent (no two kernels
of one stream overlap, CPU launches stay before their kernels, steps stretch) and the planted
change is known exactly.
"""

from __future__ import annotations

import gzip
from bisect import bisect_left, bisect_right
from itertools import accumulate
from pathlib import Path
from typing import Any

import msgspec

COMM_PREFIXES = ("ncclKernel", "ncclDevKernel")


def _kernels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]


def _warp(doc: dict[str, Any], inserts: list[tuple[float, float]], skip: set[int] = frozenset()) -> None:
    """Insert ``d`` at each point ``p`` of ``inserts``: starts t -> t + sum(d for p <= t), ends
    t -> t + sum(d for p < t)."""
    inserts = sorted(inserts)
    points = [p for p, _ in inserts]
    total = [0, *accumulate(d for _, d in inserts)]

    for event in doc["traceEvents"]:
        if id(event) in skip or not isinstance(event.get("ts"), (int, float)):
            continue
        start = event["ts"]
        new_start = start + total[bisect_right(points, start)]
        if isinstance(event.get("dur"), (int, float)):
            end = start + event["dur"]
            event["dur"] = max(end + total[bisect_left(points, end)], new_start) - new_start
        event["ts"] = new_start


def slow_kernel(doc: dict[str, Any], name_part: str, factor: int, cat: str = "kernel") -> list[dict[str, Any]]:
    """Make every GPU event of category ``cat`` (``kernel``, ``gpu_memcpy``) whose name contains
    ``name_part`` ``factor`` times longer; returns them."""
    slowed = [k for k in doc["traceEvents"] if k.get("cat") == cat and k.get("ph") == "X" and name_part in k["name"]]
    assert slowed, f"no {cat} named like {name_part!r}"
    extra = [k["dur"] * (factor - 1) for k in slowed]
    _warp(doc, [(k["ts"] + k["dur"], d) for k, d in zip(slowed, extra)])
    for k, d in zip(slowed, extra):
        k["dur"] += d
    return slowed


def _free_point(spans: list[tuple[float, float]], t: float) -> float:
    """The first moment at or after ``t`` that no compute kernel strictly spans (start < p < end):
    the end of the kernel running at ``t``, then of any that started under it, and so on."""
    p = t
    while True:
        ends = [end for start, end in spans if start < p < end]
        if not ends:
            return p
        p = max(ends)


def expose_collectives(doc: dict[str, Any], name_part: str) -> list[dict[str, Any]]:
    """Stop every communication kernel named like ``name_part`` overlapping compute: each waits
    for the compute kernel running when it started to end, runs alone, and the time it takes is
    inserted there for everything else (later work waits for it). Returns the moved kernels."""
    spans = [(k["ts"], k["ts"] + k["dur"]) for k in _kernels(doc)
             if not k["name"].startswith(COMM_PREFIXES) and k["dur"] > 0]
    moved = sorted((k for k in _kernels(doc) if name_part in k["name"]), key=lambda k: k["ts"])
    assert moved, f"no kernel named like {name_part!r}"
    placed = [(k, _free_point(spans, k["ts"])) for k in moved]
    inserts = [(gap, k["dur"]) for k, gap in placed]
    points = sorted(inserts)
    _warp(doc, inserts, skip={id(k) for k in moved})
    # Each moved kernel starts where its inserted time begins: after the time inserted before its
    # point, plus the kernels placed at the same point ahead of it.
    before = {id(k): sum(d for p, d in points if p < gap) for k, gap in placed}
    queue: dict[float, float] = {}
    for k, gap in placed:
        offset = queue.get(gap, 0.0)
        k["ts"] = gap + before[id(k)] + offset
        queue[gap] = offset + k["dur"]
    return moved


def load(path: Path) -> dict[str, Any]:
    """The trace's JSON (msgspec: the stdlib parser takes seconds on 100k events)."""
    data = path.read_bytes()
    return msgspec.json.decode(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def save(doc: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(msgspec.json.encode(doc), compresslevel=1))
    return path
