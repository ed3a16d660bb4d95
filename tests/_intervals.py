"""Independent interval arithmetic for hand counts, straight from a trace's JSON.

Deliberately a different algorithm from the store's SQL sweep: merge each class into a sorted
union, then intersect/subtract unions pairwise. Pure Python, no store, no DuckDB.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

Intervals = list[tuple[int, int]]


def load_trace(path: Path) -> dict:
    """The JSON with every non-integer number as an exact ``Decimal``: ``ts`` of 4458676983543.183
    must give ...543183 ns, which float arithmetic misses by one now and then."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f, parse_float=Decimal)


def to_ns(trace: dict, ts: Decimal | int) -> int:
    """Absolute ns the way docs/STORE.md defines it (baseTimeNanoseconds + round(ts * 1000))."""
    return int(trace.get("baseTimeNanoseconds", 0)) + round(ts * 1000)


def union(intervals: Intervals) -> Intervals:
    merged: Intervals = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def intersect(a: Intervals, b: Intervals) -> Intervals:
    out: Intervals = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Intervals, b: Intervals) -> Intervals:
    out: Intervals = []
    j = 0
    for start, end in a:
        cur = start
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


def length(a: Intervals) -> int:
    return sum(end - start for start, end in a)


def clip(a: Intervals, start: int, end: int) -> Intervals:
    return intersect(a, [(start, end)])
