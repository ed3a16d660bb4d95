"""The step's graph across ranks and its critical path.

Each rank's step is its main thread's time line from the step's start to its end, cut at the
*marks* its ``rank_edges`` rows give (:mod:`stepscope.store.rankstats.edges`): where it issued a
collective and where it waited for one (or for the GPU). Between marks the host works. The rank
graphs are joined by the collectives matched across ranks (:mod:`stepscope.analysis.matching`,
clock-aligned by its offsets): an instance ends on each rank only after its last rank started
it (the edge from the last arrival's start to each member's end; a send and its recv are one
instance). Every time below is aligned to the reference rank's clock.

The **critical path** of a step is found backwards from the rank whose step ends last: along
its host time line; at a wait that held the host (the awaited work ended after the host got
there) into the awaited work: a matched collective's transfer from its last arrival, then to
that last-arriving rank's issue of it and on along *its* host; the GPU's work up to the wait
(an unmatched collective: its whole duration); until a step start is reached. Its pieces are
contiguous. Where it begins, its rank's step start, another rank may have started earlier:
that rank waited for nothing of this step, and the path's rank was still in its previous step
(its thread order), so the path begins with that rank's **carried** piece, from the earliest
start over the ranks to its own. Its length is therefore the measured step: the latest end minus
the earliest start over the ranks (aligned). Each piece is cut into the catalogue's parts (host
and carried pieces by the host breakdown's time line, GPU pieces by the GPU's,
``rank_segments``; a transfer is ``comm_transfer``, a gloo one ``communication_transfer``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from stepscope.analysis.absent import Absent
from stepscope.analysis.matching import collective_rows, ranks_with_collectives
from stepscope.analysis.sections import SQLStore, section
from stepscope.analysis.segment_index import Segments
from stepscope.store.rankstats.parts import COMM_TRANSFER, COMMUNICATION_TRANSFER, GPU, HOST

KEY = tuple[int, int, int, int, int]
"""A collective event: (rank, ts_ns, end_ns, stream, tid) as recorded (stream and tid -1 when null)."""


@dataclass(slots=True)
class Collective:
    """One collective event of a rank, aligned: its instance when matched, else ``inst`` None."""

    rank: int
    ts: int
    end: int
    lane: tuple[int, int]
    host_side: bool
    name: str
    inst: int | None = None
    issued: int | None = None
    """A point-to-point transfer's issue (aligned): when its rank arrived at it (a gloo transfer's
    annotation may start only after its op moved the data)."""
    bytes: int | None = None
    """The message's size as recorded (None: not recorded): what a volume change scales."""

    @property
    def arrival(self) -> int:
        """When the rank arrived at the collective: its start; a point-to-point transfer's issue."""
        return self.ts if self.issued is None else min(self.issued, self.ts)


@dataclass(slots=True)
class Mark:
    """A point of a rank's host time line: ``issue`` (at ``t``) or ``wait`` (``t`` .. ``t_end``)."""

    kind: str
    t: int
    t_end: int
    dep: Collective | None = None
    dep_end: int | None = None


@dataclass(slots=True)
class RankStep:
    """One rank's step: window and marks in time order, aligned."""

    rank: int
    start: int
    end: int
    marks: list[Mark] = field(default_factory=list)


@dataclass
class StepGraph:
    """The graph of one step: every rank's :class:`RankStep` and the matched instances' members."""

    step: int
    ranks: dict[int, RankStep]
    instances: dict[int, list[Collective]]


@dataclass(frozen=True)
class Piece:
    """A stretch of the critical path: ``what`` (host, gpu, transfer, issue, carried) on ``rank``."""

    rank: int
    what: str
    t0: int
    t1: int
    label: str = ""


def _key(rank: int, ts: int, end: int, stream: Any, tid: Any) -> KEY:
    return (rank, ts, end, -1 if stream is None else int(stream), -1 if tid is None else int(tid))


def _columns(table: pa.Table) -> list[list[Any]]:
    """Each column of ``table`` as a Python list, to ``zip`` into rows (a third of the cost of
    ``to_pylist``'s dict per row)."""
    return [column.to_pylist() for column in table.columns]


def _collectives(store: SQLStore, run: str) -> tuple[dict[KEY, Collective], dict[int, int], Unpaired | None]:
    """Every collective event by key, aligned, with sends paired to their recvs per peer
    (:func:`pair_p2p`), each rank's clock correction, and what point-to-point transfers stayed
    unpaired. A collective event without a start time (a hand-edited or cut trace: ingest keeps
    an event whose ``ts`` is missing) has no place on the graph and is left out of it."""
    table = store.sql("SELECT rank, ts_ns, end_ns, stream, tid, host_side, collective, name, bytes "
                      "FROM rank_collectives WHERE run = $run AND ts_ns IS NOT NULL AND end_ns IS NOT NULL", {"run": run})
    out: dict[KEY, Collective] = {}
    # column by column, not a dict per row: a 64-rank run has ~130k collectives
    for rank, ts, end, stream, tid, host_side, collective, name, size in zip(*_columns(table)):
        lane = (0, -1) if host_side else (1, -1 if stream is None else stream)
        out[_key(rank, ts, end, stream, tid)] = Collective(rank, ts, end, lane, bool(host_side),
                                                           collective or name or "?", bytes=size)
    corrections: dict[int, int] = {}
    if out and ranks_with_collectives(store, run) >= 2:
        rows = collective_rows(store, run).select(["rank", "ts_ns", "end_ns", "stream", "tid", "clock_correction_ns",
                                                   "valid", "inst_id"])
        for rank, ts, end, stream, tid, correction, valid, inst in zip(*_columns(rows)):
            c = out.get(_key(rank, ts, end, stream, tid))
            corrections[rank] = int(correction or 0)
            if c is not None and valid:
                c.inst = int(inst)
    unpaired = pair_p2p(store, run, out) if len(corrections) >= 2 else None
    for c in out.values():
        shift = corrections.get(c.rank, 0)
        c.ts, c.end = c.ts - shift, c.end - shift
    return out, corrections, unpaired


P2P = ("send", "recv")
"""Point-to-point transfers: paired per peer (:func:`pair_p2p`), not by the matching's order."""


@dataclass(frozen=True)
class Unpaired:
    """Point-to-point transfers the replay could not pair with their other side, and why: they
    replay as their own measured time (absent from the cross-rank graph, never a 0 wait)."""

    count: int
    reason: str


def pair_p2p(store: SQLStore, run: str, colls: dict[KEY, Collective]) -> Unpaired | None:
    """Pair every send with its recv: the k-th send of rank a to peer b with the k-th recv of
    rank b from peer a, in time order per (pair, direction). The matching's instances pair the
    k-th transfer of each rank of the group whatever its peer, which ties an interleaved or
    multi-peer pipeline's recvs to other sends. A transfer's peer is that of the latest host op
    of its direction (``c10d::send``/``c10d::recv_``, :func:`p2p_transfers`) at or before it on its
    rank (both in the rank's own clock: called before the clocks are aligned). Returns what
    stayed unpaired (None when every transfer paired)."""
    transfers = [c for c in colls.values() if c.name in P2P]
    if not transfers:
        return None
    from stepscope.analysis.pipeline_stages import p2p_transfers

    ops: dict[tuple[int, bool], tuple[list[int], list[int | None]]] = {}
    for r in p2p_transfers(store, run).to_pylist():
        ts, peers = ops.setdefault((r["rank"], bool(r["send"])), ([], []))
        ts.append(r["ts_ns"])
        peers.append(r["peer"])
    lanes: dict[tuple[int, int, str], list[Collective]] = defaultdict(list)
    no_peer = 0
    for c in sorted(transfers, key=lambda c: (c.ts, c.rank)):
        c.inst = None
        ts, peers = ops.get((c.rank, c.name == "send"), ([], []))
        i = bisect_left(ts, c.ts + 1) - 1
        peer = peers[i] if i >= 0 else None
        if peer is None:
            no_peer += 1
            continue
        src, dst = (c.rank, int(peer)) if c.name == "send" else (int(peer), c.rank)
        lanes[(src, dst, c.name)].append(c)
    next_id, leftover = -1, 0
    for (src, dst, name), sends in lanes.items():
        if name != "send":
            continue
        recvs = lanes.get((src, dst, "recv"), [])
        for s, r in zip(sends, recvs):
            s.inst = r.inst = next_id
            next_id -= 1
        leftover += abs(len(sends) - len(recvs))
    leftover += sum(len(v) for (src, dst, name), v in lanes.items() if name == "recv" and (src, dst, "send") not in lanes)
    reasons = []
    if no_peer:
        reasons.append(f"{no_peer} with no c10d::send/c10d::recv_ op naming their peer (Concrete Inputs: "
                       "record_shapes=True) before them")
    if leftover:
        reasons.append(f"{leftover} whose other side is not in the traced ranks or steps")
    return Unpaired(no_peer + leftover, "; ".join(reasons)) if reasons else None


def step_graphs(store: SQLStore, run: str, ranks: Sequence[int] | None, colls: dict[KEY, Collective],
                shift: dict[int, int]) -> dict[int, StepGraph]:
    """Each step's graph (module docs), over ``ranks`` (all when None), from the run's
    collectives and clock corrections (:func:`_collectives`)."""
    wins = store.sql("SELECT rank, step, min(start_ns) AS s, max(end_ns) AS e FROM steps WHERE run = $run "
                     "GROUP BY rank, step", {"run": run}).to_pylist()
    graphs: dict[int, StepGraph] = {}
    chosen = None if ranks is None else set(ranks)
    for w in wins:
        if chosen is not None and w["rank"] not in chosen:
            continue
        d = shift.get(w["rank"], 0)
        g = graphs.setdefault(w["step"], StepGraph(w["step"], {}, defaultdict(list)))
        g.ranks[w["rank"]] = RankStep(w["rank"], w["s"] - d, w["e"] - d)
    edges = store.sql("SELECT rank, step, kind, host_ts_ns, host_end_ns, dep_ts_ns, dep_end_ns, dep_stream, dep_tid "
                      "FROM rank_edges WHERE run = $run ORDER BY rank, host_ts_ns, kind", {"run": run})
    for rank, step, kind, host_ts, host_end, dep_ts, dep_end, dep_stream, dep_tid in zip(*_columns(edges)):
        g = graphs.get(step)
        rs = g.ranks.get(rank) if g else None
        if rs is None:
            continue
        d = shift.get(rank, 0)
        dep = colls.get(_key(rank, dep_ts, dep_end, dep_stream, dep_tid))
        if kind == "issue" and dep is None:
            continue
        rs.marks.append(Mark(kind, host_ts - d, host_end - d, dep, None if dep_end is None else dep_end - d))
    for g in graphs.values():
        for rs in g.ranks.values():
            rs.marks = [m for m in rs.marks if rs.start <= m.t <= rs.end]
            rs.marks.sort(key=lambda m: (m.t, m.kind != "issue"))
            for m in rs.marks:
                if m.kind == "issue" and m.dep is not None and m.dep.name in P2P:
                    m.dep.issued = m.t
                if m.kind == "issue" and m.dep is not None and m.dep.inst is not None:
                    g.instances[m.dep.inst].append(m.dep)
    return graphs


def issue_of(g: StepGraph, c: Collective) -> Mark | None:
    """The issue mark of collective ``c`` on its rank in ``g``."""
    rs = g.ranks.get(c.rank)
    return next((m for m in rs.marks if m.kind == "issue" and m.dep is c), None) if rs else None


def binding_members(g: StepGraph, c: Collective) -> list[Collective]:
    """The members of ``c``'s instance whose arrival ``c``'s end waits for: every member of a
    collective; for a point-to-point transfer, itself and its other side when that side arrived
    before this one ended (a recv waits for its send; a gloo send of a large message waits for
    its recv to be posted, while a small one is buffered and ends before the recv arrives: then
    it waits for nothing). Empty when ``c`` is unmatched or its instance is not all in this step."""
    members = g.instances.get(c.inst) if c.inst is not None else None
    if not members or len(members) < 2:
        return []
    if c.name in P2P:
        other = [m for m in members if m is not c]
        ok = len(members) == 2 and other[0].name != c.name and other[0].arrival <= c.end
        return [c, other[0]] if ok else []
    return members


def transfer_end(g: StepGraph, c: Collective) -> int:
    """When ``c``'s work is known to have ended (aligned): its end, but for a gloo point-to-point
    transfer the earlier of its end and its binding other side's (:func:`binding_members`). A gloo
    send or recv completes, and its annotation closes, only when its host waits for it (a 1F1B
    stage waits for a forward send after computing the next microbatch), so one side's end can
    be its own host's later wait, while the data had moved when the first of the two ended. A
    replay that kept that end would re-impose the host time before the wait after any change."""
    if c.host_side and c.name in P2P:
        members = binding_members(g, c)
        if members:
            return min(m.end for m in members)
    return c.end


def last_arrival(g: StepGraph, c: Collective) -> Collective | None:
    """The binding member of ``c``'s instance that started last (:func:`binding_members`)."""
    members = binding_members(g, c)
    return max(members, key=lambda m: (m.arrival, m.rank)) if len(members) >= 2 else None


def critical_path(g: StepGraph) -> list[Piece]:
    """The critical path of step graph ``g``, first piece first (module docs)."""
    if not g.ranks:
        return []
    rs = max(g.ranks.values(), key=lambda r: (r.end, r.rank))
    pieces: list[Piece] = []
    t = rs.end
    marks = [m for m in rs.marks]
    while True:
        # the latest mark of this rank at or before t that held the host
        nxt = None
        for m in reversed(marks):
            if m.t > t:
                continue
            if m.kind == "wait" and m.dep_end is not None and m.t_end <= t and m.dep_end > m.t:
                nxt = m
                break
        if nxt is None:
            pieces.append(Piece(rs.rank, "host", rs.start, t))
            break
        pieces.append(Piece(rs.rank, "host", nxt.dep_end, t))
        c = nxt.dep
        last = last_arrival(g, c) if c is not None else None
        if c is not None and last is not None:
            label = COMMUNICATION_TRANSFER.name if c.host_side else COMM_TRANSFER.name
            pieces.append(Piece(rs.rank, "transfer", min(last.arrival, nxt.dep_end), nxt.dep_end, label))
            issue = issue_of(g, last)
            rs = g.ranks[last.rank]
            marks = rs.marks
            t0 = min(last.arrival, nxt.dep_end)
            if issue is not None and issue.t <= t0:
                pieces.append(Piece(rs.rank, "issue", issue.t, t0))
                t0 = issue.t
            t = max(t0, rs.start)
            continue
        if c is not None:
            # an unmatched collective: its own time, from when it started (or the wait began)
            t = max(nxt.t, min(c.arrival, nxt.dep_end))
            label = COMMUNICATION_TRANSFER.name if c.host_side else COMM_TRANSFER.name
            pieces.append(Piece(rs.rank, "transfer", t, nxt.dep_end, label))
        else:
            pieces.append(Piece(rs.rank, "gpu", nxt.t, nxt.dep_end))
            t = nxt.t
        marks = [m for m in marks if m.t < t]
    # the path begins at its rank's step start; a rank that started earlier waited for nothing of
    # this step: the path's rank was still in its previous step (thread order), the carried piece
    first = min(r.start for r in g.ranks.values())
    pieces.append(Piece(rs.rank, "carried", first, rs.start))
    pieces.reverse()
    return [p for p in pieces if p.t1 > p.t0]


def cut_pieces(pieces: Sequence[Piece], segments: Segments, shift: dict[int, int]) -> list[dict[str, int]]:
    """Each piece's parts (ns by part name)."""
    out = []
    for p in pieces:
        if p.what == "transfer":
            out.append({p.label: p.t1 - p.t0})
        else:
            out.append(segments.cut(p.rank, "gpu" if p.what == "gpu" else "host", p.t0, p.t1, shift.get(p.rank, 0)))
    return out


@dataclass(frozen=True)
class StepPath:
    """One step's critical path: its length, the measured step it is checked against, its pieces
    with their parts, and its time by part and by rank."""

    step: int
    length_ns: int
    measured_ns: int
    """The step as measured: the latest end minus the earliest start over the ranks (aligned)."""
    pieces: tuple[tuple[Piece, dict[str, int]], ...]
    by_part: dict[str, int]
    by_rank: dict[int, int]

    def text(self) -> str:
        """``step 10: 16.1 ms; rank 7 host 7.5 ms -> ...``."""
        from stepscope.units import duration

        shown = []
        for p, parts in self.pieces:
            top = max(parts.items(), key=lambda kv: kv[1])[0] if parts else p.what
            shown.append(f"rank {p.rank} {p.what} {duration(p.t1 - p.t0)} ({top})")
        return f"step {self.step}: {duration(self.length_ns)}; " + " -> ".join(shown)


@dataclass
class RunGraph:
    """Every step's graph of a run, its ranks' clock corrections and time lines by part: what the
    critical paths and the replays (:mod:`stepscope.analysis.replay`) are computed from (plain
    data: the summary's section result, picklable)."""

    graphs: dict[int, StepGraph]
    shift: dict[int, int]
    segments: Segments
    unpaired: Unpaired | None = None
    """Point-to-point transfers left out of the graph's pairs, and why (None: none)."""

    @property
    def ranks(self) -> list[int]:
        """Every rank with a window in some step, in order."""
        return sorted({r for g in self.graphs.values() for r in g.ranks})


def run_graph(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> RunGraph | None:
    """The run's :class:`RunGraph` (None when no step has a rank window)."""
    colls, shift, unpaired = _collectives(store, run)
    graphs = {s: g for s, g in step_graphs(store, run, ranks, colls, shift).items() if g.ranks}
    if not graphs:
        return None
    return RunGraph(graphs, shift, Segments(store, run, sorted({r for g in graphs.values() for r in g.ranks})),
                    unpaired)


def paths_of(rg: RunGraph) -> list[StepPath]:
    """The critical path of every step of ``rg``."""
    out = []
    for step in sorted(rg.graphs):
        g = rg.graphs[step]
        pieces = critical_path(g)
        parts = cut_pieces(pieces, rg.segments, rg.shift)
        by_part: dict[str, int] = defaultdict(int)
        by_rank: dict[int, int] = defaultdict(int)
        for p, cut in zip(pieces, parts):
            by_rank[p.rank] += p.t1 - p.t0
            for name, ns in cut.items():
                by_part[name] += ns
        measured = max(r.end for r in g.ranks.values()) - min(r.start for r in g.ranks.values())
        out.append(StepPath(step, sum(p.t1 - p.t0 for p in pieces), measured, tuple(zip(pieces, parts)),
                            dict(by_part), dict(by_rank)))
    return out


def step_paths(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> list[StepPath]:
    """The critical path of every step of the run (steps where some rank has a window)."""
    rg = run_graph(store, run, ranks)
    return paths_of(rg) if rg is not None else []


@dataclass(frozen=True)
class CriticalPathResult:
    """The section's result: each step's path, and the graph the findings' replays run on."""

    paths: tuple[StepPath, ...]
    graph: RunGraph


def path_marks(store: SQLStore, run: str, step: int, ranks: Sequence[int] | None = None) -> pa.Table:
    """The critical path of ``step`` as rows for the Overview's cross-rank timeline: ``rank,
    what, t0_ns, t1_ns`` (aligned as the timeline is), ``part`` (the piece's largest part)."""
    rg = run_graph(store, run, None)
    g = rg.graphs.get(int(step)) if rg is not None else None
    pieces = critical_path(g) if g is not None else []
    parts = cut_pieces(pieces, rg.segments, rg.shift) if rg is not None else []
    rows = [{"rank": p.rank, "what": p.what, "t0_ns": p.t0, "t1_ns": p.t1,
             "part": max(cut.items(), key=lambda kv: kv[1])[0] if cut else p.what} for p, cut in zip(pieces, parts)]
    schema = pa.schema([("rank", pa.int64()), ("what", pa.string()), ("t0_ns", pa.int64()), ("t1_ns", pa.int64()),
                        ("part", pa.string())])
    return pa.Table.from_pylist(rows, schema=schema)


def paths_json(result: CriticalPathResult) -> Any:
    """The summary's ``critical_path``: one object per step (docs/SUMMARY_JSON.md)."""
    paths = result.paths
    return [{"step": p.step, "length_ns": p.length_ns, "measured_ns": p.measured_ns,
             "by_part": {k: v for k, v in sorted(p.by_part.items(), key=lambda kv: -kv[1])},
             "by_rank": {str(k): v for k, v in sorted(p.by_rank.items())},
             "path": [{"rank": piece.rank, "what": piece.what, "start_ns": piece.t0, "end_ns": piece.t1,
                       "parts": parts} for piece, parts in p.pieces],
             "text": p.text()} for p in paths]


REPLAYED_RANKS = 64
"""Runs of up to this many ranks have their findings' stakes replayed on the section's graph
(:mod:`stepscope.analysis.stakes`); more ranks keep their rules' estimates: a replay reads every
rank's time line by part (~3k rows a rank on a GPU trace), which on 1,024 ranks would cost the
summary seconds and hundreds of MB (``stepscope whatif`` replays them on demand)."""


@section("critical_path", order=95, to_json=paths_json)
def critical_path_section(store: SQLStore, run: str, ranks: Sequence[int] | None) -> CriticalPathResult | Absent:
    """The critical path of each step across ranks: its pieces, by part and by rank.

    On a run the findings replay (:data:`REPLAYED_RANKS`), every rank's time line is read here in
    one query: the replay reads them all, and read here they are read while the other sections
    run, not after them, and once, not one rank for the path and the rest for the replay (64
    ranks: two scans of 2 M stretches, the second 0.3-0.5 s alone at the end of the summary)."""
    rg = run_graph(store, run, ranks)
    if rg is None:
        return Absent("no step windows: a critical path runs from a step's start to its end")
    if len(rg.ranks) <= REPLAYED_RANKS:
        rg.segments.load(rg.ranks)
    return CriticalPathResult(tuple(paths_of(rg)), rg)
