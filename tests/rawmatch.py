"""Collectives matched across ranks, recomputed in plain Python from the traces' JSON.

The independent side of the matching, clock and wait tests: the rules of docs/ANALYSIS.md
("Collectives across ranks") applied with loops over the raw events of each rank's file, no
store and no SQL. Only the name tables are shared with the store (``normalise_collective``,
``dtype_bytes``: tested on their own in tests/test_classify.py).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from stepscope.store.classify import dtype_bytes, is_communication_host_op, normalise_collective
from tests.rawcalc import comm_kernels, profiler_steps, span_ns

P2P = {"send", "recv", "send_recv"}
ROOTED = {"broadcast", "reduce", "gather", "scatter"}

@dataclass
class Member:
    rank: int
    step: int | None
    start: int
    end: int
    collective: str | None
    dtype: str | None
    nbytes: int | None
    seq: int | None
    pg: str | None
    host_side: bool
    aligned: int = 0
    wait: int | None = None
    late: bool | None = None

    @property
    def kind(self) -> str:
        return "p2p" if self.collective in P2P else (self.collective or "?")

@dataclass
class Instance:
    members: list[Member] = field(default_factory=list)
    valid: bool = False

def _elements(dims: Any) -> int | None:
    if not dims or not isinstance(dims, list):
        return None
    first = dims[0]
    shapes = first if first and isinstance(first[0], list) else [first]
    if not shapes or any(not isinstance(s, list) for s in shapes):
        return None
    return sum(math.prod(s) for s in shapes) if shapes else None

def _payload(args: dict[str, Any]) -> tuple[str | None, int | None]:
    """(dtype, bytes) by the store's rule: collective args, else the first input."""
    nin, nout, dt = args.get("In msg nelems"), args.get("Out msg nelems"), args.get("dtype")
    if nin is None and nout is None:
        nin = nout = _elements(args.get("Input Dims"))
        types = args.get("Input type") or []
        dt = dt or (types[0] if types and isinstance(types[0], str) and dtype_bytes(types[0]) else None)
    dt = dt.removeprefix("c10::") if dt else None
    size = dtype_bytes(dt)
    largest = max((v for v in (nin, nout) if v is not None), default=None)
    return dt, (largest * size if size is not None and largest is not None else None)

def members_of(doc: dict[str, Any], rank: int) -> list[Member]:
    """Every communication kernel (what it is from its args, else from the innermost enclosing
    communication op of its launch, else its name) and every gloo transfer of one rank."""
    events = doc["traceEvents"]
    steps = profiler_steps(doc)

    def step_at(t: int) -> int | None:
        return next((s for s, a, b in steps if a <= t < b), None)

    launch: dict[int, dict[str, Any]] = {}
    for e in sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")), key=lambda e: e["ts"]):
        corr = e.get("args", {}).get("correlation")
        if corr is not None:
            launch.setdefault(corr, e)
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
           and is_communication_host_op(e.get("name", "")) and not e["name"].startswith("gloo:")]
    out = []
    for k in comm_kernels(doc):
        a = k.get("args", {})
        start, end = span_ns(doc, k)
        la = launch.get(a.get("correlation"))
        enclosing = [] if la is None else sorted(
            (o for o in ops if o["pid"] == la["pid"] and o["tid"] == la["tid"]
             and o["ts"] <= la["ts"] <= o["ts"] + o["dur"]), key=lambda o: o["ts"], reverse=True)

        def innermost(get):
            return next((v for v in map(get, enclosing) if v is not None), None)

        own = normalise_collective(a["Collective name"]) if "Collective name" in a else None
        linked = innermost(lambda o: normalise_collective(o.get("args", {}).get("Collective name") or o["name"]))
        collective = own or linked or normalise_collective(k["name"])
        dtype, nbytes = _payload(a)
        dtype = dtype or innermost(lambda o: _payload(o.get("args", {}))[0])
        nbytes = nbytes if nbytes is not None else innermost(lambda o: _payload(o.get("args", {}))[1])
        seq = a.get("Seq", innermost(lambda o: o.get("args", {}).get("Seq")))
        pg = a.get("Process Group Name", innermost(lambda o: o.get("args", {}).get("Process Group Name")))
        out.append(Member(rank, step_at(span_ns(doc, la)[0]) if la else step_at(start), start, end, collective,
                          dtype, nbytes, seq, pg, False))
    for e in events:
        if e.get("cat") == "user_annotation" and e.get("name", "").startswith("gloo:"):
            start, end = span_ns(doc, e)
            dtype, nbytes = _payload(e.get("args", {}))
            out.append(Member(rank, step_at(start), start, end, normalise_collective(e["name"]), dtype, nbytes,
                              None, None, True))
    return out

def _pg(doc: dict[str, Any]) -> str | None:
    groups = (doc.get("distributedInfo") or {}).get("pg_config") or []
    return groups[0]["pg_name"] if len(groups) == 1 else None

def _deviations(instances: list[Instance], keep) -> dict[int, list[float]]:
    """Per rank: each kept instance's end minus the median end of its members."""
    devs: dict[int, list[float]] = defaultdict(list)
    for inst in instances:
        if keep(inst):
            first = min(m.end for m in inst.members)
            mid = statistics.median(m.end - first for m in inst.members)
            for m in inst.members:
                devs[m.rank].append(m.end - first - mid)
    return devs


def _round(x: float) -> int:
    """Half away from zero, as SQL's round()."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def _offsets(instances: list[Instance], keep) -> dict[Any, Any]:
    """Per rank: the correction (median end deviation when it exceeds its median absolute deviation)."""
    out: dict[Any, Any] = {}
    for rank, d in _deviations(instances, keep).items():
        offset = statistics.median(d)
        spread = statistics.median(abs(x - offset) for x in d)
        out[rank] = _round(offset) if abs(offset) > spread and abs(offset) >= 1_000_000 else 0
        out[(rank, "spread")] = spread
    return out

def match(docs: list[dict[str, Any]]) -> list[Instance]:
    """Instances of the ranks' collectives (``docs[r]`` is rank ``r``), with validity, waits and late flags."""
    keyed: dict[tuple, Instance] = defaultdict(Instance)
    for rank, doc in enumerate(docs):
        counters: dict[tuple, int] = defaultdict(int)
        default_pg = _pg(doc)
        for m in sorted(members_of(doc, rank), key=lambda m: m.start):
            pg = m.pg if m.pg is not None else default_pg
            if m.seq is not None:
                key = (pg, "seq", "p2p" if m.kind == "p2p" else "collective", None, m.seq)
            else:
                counters[(pg, m.kind, m.step)] += 1
                key = (pg, "order", m.kind, m.step, counters[(pg, m.kind, m.step)])
            keyed[key].members.append(m)
    instances = list(keyed.values())

    def candidate(inst: Instance) -> bool:
        ms = inst.members
        ranks = {m.rank for m in ms}
        sizes = {m.nbytes for m in ms if m.nbytes is not None}
        dtypes = {m.dtype.lower() for m in ms if m.dtype}
        return (len(ranks) >= 2 and len(ranks) == len(ms) and len({m.kind for m in ms}) == 1
                and len(dtypes) <= 1 and (len(sizes) <= 1 or any(m.collective == "all_to_all" for m in ms)))

    first = _offsets(instances, candidate)
    for inst in instances:
        if not candidate(inst):
            continue
        rooted = any(m.collective in ROOTED for m in inst.members)
        tol = 2 * max(first[(m.rank, "spread")] if first[m.rank] else 0 for m in inst.members)
        starts = [m.start - first[m.rank] for m in inst.members]
        ends = [m.end - first[m.rank] for m in inst.members]
        inst.valid = rooted or max(starts) <= min(ends) + tol
    final = _offsets(instances, lambda i: i.valid)
    for inst in instances:
        for m in inst.members:
            m.aligned = m.start - final.get(m.rank, 0)
        if not inst.valid:
            continue
        last = max(m.aligned for m in inst.members)
        ordered = sorted(m.aligned for m in inst.members)
        gaps = [b - a for a, b in zip(ordered, ordered[1:])]
        late_from = None
        if max(gaps) > 0:
            late_from = ordered[max(i for i, g in enumerate(gaps) if g == max(gaps)) + 1]
        for m in inst.members:
            m.wait = min(max(last - m.aligned, 0), m.end - m.start)
            m.late = late_from is not None and m.aligned >= late_from
    return instances

def offsets(docs: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """Per rank: (clock offset, spread) from the valid instances, as documented."""
    out = {}
    for rank, d in _deviations(match(docs), lambda i: i.valid).items():
        offset = statistics.median(d)
        out[rank] = (offset, statistics.median(abs(x - offset) for x in d))
    return out

GLOO = re.compile(r"^gloo:")
