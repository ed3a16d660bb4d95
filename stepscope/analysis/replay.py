"""Replay a step's graph with changed durations: what the step would take "if".

The graph is :mod:`stepscope.analysis.critical_path`'s. Each rank starts the step when it did
(aligned) and walks its marks in order:

- the host's time between two marks is its measured time cut into the host breakdown's parts,
  each scaled by the changes that name it;
- a collective **arrives** its issue's replayed time plus its measured issue delay; a matched
  instance **ends** on each member at the latest replayed arrival plus that member's measured
  time after the last arrival (its transfer; scaled by ``comm_transfer``/``communication_transfer``);
  an unmatched collective, or a send that ended before its recv arrived (buffered), ends its
  whole (scaled) duration after its arrival; a point-to-point transfer waits for its other side
  only (:func:`~stepscope.analysis.critical_path.binding_members`), and a gloo one ends when the
  first of its two sides did (:func:`~stepscope.analysis.critical_path.transfer_end`: the other
  side's end can be its own host's later wait);
- a **wait** ends at the later of when the host got there and the awaited work's replayed end,
  plus what it measured after that end; work the host waits for on the GPU is the GPU's measured
  time from the wait's start to that end, cut into the GPU breakdown's parts, scaled.

A step's replayed time is the mean over its ranks of (replayed end - start), as the step basis
means windows. Unchanged, the replay gives back each step as measured up to what the model
cannot express (lanes queued behind one another, clocks off by less than the matching corrects,
a collective starting before its issue); that difference, over the run's steps, is the **error
bar** printed with every prediction (docs/ANALYSIS.md, "Critical path and what-if"). Being near 0
by construction, it is printed beside the **held-out error** (:func:`heldout_error`): how far a
step lies from the other steps' replays, the run's own step-to-step variation.

Changes (``--change`` of ``stepscope whatif``, :func:`parse_change`):

- ``PART*F``: scale a part of the catalogue (GPU or host) by ``F`` on every rank; ``rank 3:
  PART*F`` (or ``rank 3,5: ...``) on those ranks only;
- ``rank R: on time``: rank R as busy as its peers: in each step its **excess** (its host time
  outside its waits, :func:`busy_ns`, less the peers' at the same quantile of their steps: its
  least busy step against their least busy, ...; at least its median less theirs;
  :func:`on_time_excess`) is taken off the host
  time that led to the collectives it reached after every other member (since its previous wait
  that held it), in proportion, or off all its host time in a step where it reached none last
  (:func:`_shrinks`). Its steps keep their order and a spread like its peers', which in a run
  where it is on time still delays them as often as theirs delays it
  (:func:`on_time_excess` says why not all of its lateness);
- ``copies hidden``: every exposed copy and memset part scaled to 0 (copies moved under compute);
- ``no launch gaps``: the GPU's idle time scaled to 0 (the host always launched in time);
- ``comm_volume*F`` (or ``rank 3: comm_volume*F``): every collective's message ``F`` times as
  large. A transfer's time is a latency plus its bytes over a bandwidth, so scaling its time
  (``comm_transfer*F``) scales its latency too, which a small message is made of. Instead each
  transfer grows by ``(F - 1) x bytes x`` the run's time per byte for that collective
  (:func:`volume_costs`: fitted over the run's own message sizes; a collective recorded at one
  size only cannot be fitted, and the replay says so).
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from stepscope.analysis.critical_path import (Collective, Mark, RankStep, RunGraph, Segments, StepGraph, Unpaired,
                                              binding_members, last_arrival, run_graph, transfer_end)
from stepscope.analysis.sections import SQLStore
from stepscope.errors import Inconclusive, UsageError
from stepscope.store.rankstats.parts import COMM_TRANSFER, COMMUNICATION_TRANSFER, GPU, HOST, IDLE

_TRANSFERS = (COMM_TRANSFER.name, COMMUNICATION_TRANSFER.name)
_NAMES = {*(p.name for b in (GPU, HOST) for p in b.parts), *_TRANSFERS}
"""What a change can scale: the parts the replay cuts time into (each breakdown's parts, and the
transfer of a collective after its last arrival)."""
_COPIES = tuple(p.name for p in GPU.parts if p.name.startswith(("memcpy_", "memset_")))
VOLUME = "comm_volume"
"""The change's name for the collectives' message size (``comm_volume*2``: twice the bytes)."""


@dataclass(frozen=True)
class Change:
    """One change: scale ``parts`` by ``factor`` on ``ranks`` (all when None), or ``on_time``; with
    ``volume``, the transfers' bytes rather than their time (module docs)."""

    text: str
    parts: tuple[str, ...] = ()
    factor: float = 1.0
    ranks: frozenset[int] | None = None
    on_time: bool = False
    volume: bool = False


_RANKS = re.compile(r"^\s*rank\s+([\d,\s]+):\s*(.*)$", re.I)
_SCALE = re.compile(r"^([a-z0-9_]+)\s*\*\s*([0-9]*\.?[0-9]+)$", re.I)


def parse_change(text: str) -> Change:
    """A change from its text (module docs); a :class:`UsageError` names what is wrong."""
    ranks: frozenset[int] | None = None
    body = text.strip()
    m = _RANKS.match(body)
    if m:
        ranks = frozenset(int(r) for r in re.split(r"[,\s]+", m.group(1).strip()) if r)
        body = m.group(2).strip()
    low = body.lower()
    if low == "on time":
        if ranks is None:
            raise UsageError(f"change {text!r}: 'on time' needs the ranks it is about ('rank 7: on time')")
        return Change(text, ranks=ranks, on_time=True)
    if low == "copies hidden":
        return Change(text, _COPIES, 0.0, ranks)
    if low == "no launch gaps":
        return Change(text, (IDLE.name,), 0.0, ranks)
    s = _SCALE.match(body)
    if not s:
        raise UsageError(f"change {text!r}: expected PART*FACTOR, {VOLUME}*FACTOR, 'rank R: on time', "
                         "'copies hidden' or 'no launch gaps'")
    part = s.group(1).lower()
    if part == VOLUME:
        return Change(text, _TRANSFERS, float(s.group(2)), ranks, volume=True)
    if part not in _NAMES:
        raise UsageError(f"change {text!r}: {part!r} is not a part of the catalogue ({', '.join(sorted(_NAMES))})")
    parts = _TRANSFERS if part in _TRANSFERS else (part,)
    return Change(text, parts, float(s.group(2)), ranks)


@dataclass
class _Factors:
    """Each (rank, part)'s factor, and each rank's on-time windows."""

    changes: Sequence[Change]

    def of(self, rank: int, part: str, volume: bool = False) -> float:
        """The time factor of ``part`` on ``rank``; with ``volume``, its bytes' factor."""
        f = 1.0
        for c in self.changes:
            if (not c.on_time and c.volume == volume and part in c.parts
                    and (c.ranks is None or rank in c.ranks)):
                f *= c.factor
        return f

    def on_time(self) -> frozenset[int]:
        """The ranks a change brings on time."""
        return frozenset(r for c in self.changes if c.on_time for r in c.ranks or ())


@dataclass
class _RankState:
    rs: RankStep
    i: int = 0
    t: float = 0.0
    """Replayed time of the host at its measured time ``at``."""
    at: int = 0
    shrink: dict[int, float] = field(default_factory=dict)
    """Mark index -> factor of the host time before it (a rank brought on time, :func:`_shrinks`)."""
    done: bool = False


def _scaled(seg: Segments, f: _Factors, rank: int, breakdown: str, t0: int, t1: int, shift: int) -> float:
    if t1 <= t0:
        return 0.0
    return sum(ns * f.of(rank, part) for part, ns in seg.cut(rank, breakdown, t0, t1, shift).items())


def _held(g: StepGraph, m: Mark) -> bool:
    """Whether wait ``m`` held the host: the work it waits for ended after the host got there (a
    gloo send waited for long after its data moved did not; :func:`transfer_end`)."""
    done = transfer_end(g, m.dep) if m.dep is not None else m.dep_end
    return done is not None and done > m.t


def _stretches(rs: RankStep) -> list[int]:
    """The host time before each of the rank's marks and, last, before its step's end (ns): what
    the replay walks between marks (a wait's own time is not host time)."""
    out: list[int] = []
    at = rs.start
    for m in rs.marks:
        out.append(max(m.t - at, 0))
        at = max(at, m.t) if m.kind == "issue" else m.t_end
    out.append(max(rs.end - at, 0))
    return out


def busy_ns(rs: RankStep) -> int:
    """The rank's host time in its step outside its waits: the time the replay scales, what ``on
    time`` compares across ranks (:func:`on_time_excess`)."""
    return sum(_stretches(rs))


def _late_stretches(g: StepGraph, rs: RankStep) -> list[int]:
    """The indices of the rank's host stretches (:func:`_stretches`) that led to a collective it
    reached after every other member: from its previous wait that held it (:func:`_held`; before
    it, others held the rank) to that issue."""
    out: list[int] = []
    first = 0
    for i, m in enumerate(rs.marks):
        if m.kind == "wait":
            if _held(g, m):
                first = i + 1
            continue
        others = ([c.arrival for c in g.instances.get(m.dep.inst, []) if c.rank != rs.rank]
                  if m.dep is not None and m.dep.inst is not None else [])
        if others and m.dep.arrival > max(others):
            out.extend(range(first, i + 1))
            first = i + 1
    return out


def _shrinks(g: StepGraph, rs: RankStep, excess: float) -> dict[int, float]:
    """Stretch index -> the factor that takes ``excess`` ns off the rank's host time in step ``g``:
    off the stretches that led to collectives it reached last (:func:`_late_stretches`), in
    proportion to their time, or off all of its host time when it reached none last (at least
    0: a stretch never runs backwards)."""
    times = _stretches(rs)
    chosen = _late_stretches(g, rs) or list(range(len(times)))
    total = sum(times[i] for i in chosen)
    if excess <= 0 or total <= 0:
        return {}
    return dict.fromkeys(chosen, max(0.0, 1 - excess / total))


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``ordered`` (sorted), interpolated between its neighbours."""
    x = q * (len(ordered) - 1)
    i = int(x)
    if i + 1 >= len(ordered):
        return ordered[-1]
    return ordered[i] + (ordered[i + 1] - ordered[i]) * (x - i)


def on_time_excess(graphs: Iterable[StepGraph], ranks: frozenset[int]) -> dict[tuple[int, int], float]:
    """(rank, step) -> how much busier each of ``ranks`` was in that step than its peers (every
    rank not in ``ranks``) are in a step of the same rank: its k-th least busy step
    (:func:`busy_ns`) against the same quantile of the peers' steps (one step: their median), and
    at least its typical excess (its median less theirs) and 0 (ns); empty when no peer is
    traced. So the rank brought on time is as busy as its peers, step by step in the same order:
    its busiest steps stay its busiest, and its step-to-step variation becomes theirs.

    Why not all of each step's lateness (the rank's arrival at each collective moved to its last
    peer's): that also removes the rank's share of the run's random delays, which in a run where it
    is on time still delay its peers as often as theirs delay it (2-rank late pairs were
    predicted 0.81-0.98 of the even run's step that way; docs/ANALYSIS.md, Validation). Why busy
    time and not the lateness at each collective: in a pipeline a stage is late at its
    neighbour's receive by its own backward even when balanced (the first stage waits for the
    last stage's gradients in any 1F1B), and removing that lateness removes work the balanced
    run does too (tests/test_critical_path.py, ``test_a_balanced_pipeline_is_on_time``). Why a
    quantile and not one median excess: a rank late in a few steps only (a hiccup every tenth
    step) has a median excess of 0, while its late steps, mapped to its peers' busiest, lose
    their hiccups. Why at least the median excess: on a loaded machine the peers' busiest steps
    can be as busy as the late rank's (a peer descheduled for 40 ms), and the late rank's steps
    mapped to them kept all their lateness (rank 1 kept 30 ms of sleep in 5 of 40 steps at
    load 15-23)."""
    mine: dict[int, list[tuple[int, int]]] = defaultdict(list)
    peers: list[int] = []
    for g in graphs:
        for r, rs in g.ranks.items():
            if r in ranks:
                mine[r].append((busy_ns(rs), g.step))
            else:
                peers.append(busy_ns(rs))
    if not peers:
        return {}
    peers.sort()
    out: dict[tuple[int, int], float] = {}
    for r, steps in mine.items():
        steps.sort()
        typical = _quantile([b for b, _ in steps], 0.5) - _quantile(peers, 0.5)
        for k, (busy, step) in enumerate(steps):
            q = k / (len(steps) - 1) if len(steps) > 1 else 0.5
            out[(r, step)] = max(busy - _quantile(peers, q), typical, 0.0)
    return out


def volume_costs(graphs: Iterable[StepGraph]) -> dict[str, float | None]:
    """Each collective name's time per byte (ns) over ``graphs``: the least-squares slope of its
    transfer time (after its last arrival; an unmatched one's whole time) against its bytes, over
    the median transfer of each size recorded (clipped at 0: a larger message never took less).
    None where the run recorded one size only (a latency and a bandwidth need two)."""
    by: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for g in graphs:
        for rs in g.ranks.values():
            for m in rs.marks:
                c = m.dep
                if m.kind != "issue" or c is None or c.bytes is None:
                    continue
                last = last_arrival(g, c)
                took = c.end - c.arrival if last is None else max(transfer_end(g, c) - last.arrival, 0)
                by[c.name][c.bytes].append(took)
    out: dict[str, float | None] = {}
    for name, sizes in by.items():
        points = [(float(b), float(statistics.median(v))) for b, v in sizes.items()]
        if len(points) < 2:
            out[name] = None
            continue
        mx = statistics.fmean(b for b, _ in points)
        my = statistics.fmean(t for _, t in points)
        slope = sum((b - mx) * (t - my) for b, t in points) / sum((b - mx) ** 2 for b, _ in points)
        out[name] = max(slope, 0.0)
    return out


def replay_step(g: StepGraph, seg: Segments, shift: dict[int, int], changes: Sequence[Change],
                per_byte: Mapping[str, float | None] | None = None,
                excess: Mapping[tuple[int, int], float] | None = None) -> float:
    """The replayed step of graph ``g`` (mean over ranks of replayed end - start, ns); ``per_byte``
    (:func:`volume_costs`) when a change scales the volume; ``excess`` (:func:`on_time_excess`
    over the run's steps) when a change brings ranks on time (None: over this step alone)."""
    f = _Factors(changes)
    states = {r: _RankState(rs, t=float(rs.start), at=rs.start) for r, rs in g.ranks.items()}
    late = f.on_time()
    if late:
        excess = on_time_excess([g], late) if excess is None else excess
        for r in late & g.ranks.keys():
            states[r].shrink = _shrinks(g, g.ranks[r], excess.get((r, g.step), 0.0))
    arrive: dict[int, float] = {}
    ends: dict[int, float] = {}

    def host(st: _RankState, upto: int) -> None:
        r = st.rs.rank
        st.t += st.shrink.get(st.i, 1.0) * _scaled(seg, f, r, "host", st.at, upto, shift.get(r, 0))
        st.at = max(st.at, upto)

    def end_of(c: Collective, force: bool) -> float | None:
        if id(c) in ends:
            return ends[id(c)]
        last = last_arrival(g, c)
        part = COMMUNICATION_TRANSFER.name if c.host_side else COMM_TRANSFER.name
        tf = f.of(c.rank, part)
        grown = (f.of(c.rank, part, volume=True) - 1) * (c.bytes or 0) * ((per_byte or {}).get(c.name) or 0.0)
        a = arrive.get(id(c), float(c.arrival))
        if last is None:
            value = a + (c.end - c.arrival) * tf + grown
        else:
            members = binding_members(g, c)
            if not force and any(id(m) not in arrive for m in members):
                return None
            latest = max(arrive.get(id(m), float(m.arrival)) for m in members)
            value = latest + max(transfer_end(g, c) - last.arrival, 0) * tf + grown
        ends[id(c)] = value
        return value

    def advance(st: _RankState, force: bool) -> bool:
        moved = False
        marks = st.rs.marks
        while st.i < len(marks):
            m: Mark = marks[st.i]
            r = st.rs.rank
            if m.kind == "issue":
                host(st, m.t)
                if m.dep is not None:
                    arrive[id(m.dep)] = st.t + max(m.dep.arrival - m.t, 0)
            else:
                host(st, m.t)
                dep_end = m.dep_end if m.dep_end is not None else m.t
                if m.dep is not None:
                    e = end_of(m.dep, force)
                    if e is None:
                        return moved
                    st.t = max(st.t, e) + max(m.t_end - max(transfer_end(g, m.dep), st.at), 0)
                else:
                    st.t += (_scaled(seg, f, r, "gpu", m.t, dep_end, shift.get(r, 0))
                             + max(m.t_end - max(dep_end, m.t), 0))
                st.at = m.t_end
            st.i += 1
            moved = True
        host(st, st.rs.end)
        st.done = True
        return True

    while not all(s.done for s in states.values()):
        progress = False
        for st in states.values():
            if not st.done:
                progress |= advance(st, force=False)
        if not progress:
            stuck = next(s for s in states.values() if not s.done)
            advance(stuck, force=True)
    return sum(s.t - s.rs.start for s in states.values()) / len(states)


@dataclass(frozen=True)
class StepPrediction:
    """One step: measured (mean window over ranks), replayed unchanged, replayed with the changes."""

    step: int
    measured_ns: float
    unchanged_ns: float
    predicted_ns: float


@dataclass(frozen=True)
class WhatIf:
    """A what-if over a run: its steps, the means, and the error bar (the unchanged replay's mean
    absolute difference to the measured steps, ns; also as a fraction of the measured mean).

    ``heldout_error_ns``: the prediction error on held-out steps: each step predicted by the
    median of the *other* steps' unchanged replays, the mean absolute difference to its measured
    time (None with fewer than two steps). The replay keeps every measured gap, so its own error
    is near 0 by construction; a typical step predicted from the others is off by the run's
    step-to-step variation, which bounds how close any prediction of another run can come.
    ``unpaired``: the point-to-point transfers the graph could not pair, and why (None: none)."""

    run: str
    changes: tuple[str, ...]
    steps: tuple[StepPrediction, ...]
    measured_ns: float
    unchanged_ns: float
    predicted_ns: float
    error_ns: float
    heldout_error_ns: float | None = None
    unpaired: Unpaired | None = None

    @property
    def error_share(self) -> float:
        return self.error_ns / self.measured_ns if self.measured_ns else 0.0

    @property
    def saving_ns(self) -> float:
        """What the changes save per step (unchanged replay minus changed replay)."""
        return self.unchanged_ns - self.predicted_ns

    def to_json(self) -> dict[str, object]:
        return {"run": self.run, "changes": list(self.changes), "measured_ns": round(self.measured_ns),
                "unchanged_ns": round(self.unchanged_ns), "predicted_ns": round(self.predicted_ns),
                "saving_ns": round(self.saving_ns), "error_ns": round(self.error_ns),
                "heldout_error_ns": None if self.heldout_error_ns is None else round(self.heldout_error_ns),
                "unpaired": None if self.unpaired is None else {"count": self.unpaired.count,
                                                                "reason": self.unpaired.reason},
                "steps": [{"step": s.step, "measured_ns": round(s.measured_ns), "unchanged_ns": round(s.unchanged_ns),
                           "predicted_ns": round(s.predicted_ns)} for s in self.steps]}


def what_if(store: SQLStore, run: str, changes: Sequence[str | Change] = (),
            ranks: Sequence[int] | None = None, steps: Collection[int] | None = None) -> WhatIf | None:
    """Replay ``run``'s steps with ``changes`` (texts as ``--change`` takes them, or
    :class:`Change`); only ``steps`` when given: the excess of ``on time`` and the time per byte
    of ``comm_volume`` are then the chosen steps' own (a run recorded with two configurations in
    alternate steps answers for each from its own steps). None when no chosen step has a rank
    window."""
    parsed = [c if isinstance(c, Change) else parse_change(c) for c in changes]
    rg = run_graph(store, run, ranks)
    if rg is not None and steps is not None:
        rg = replace(rg, graphs={s: g for s, g in rg.graphs.items() if s in steps})
    return replay(rg, run, parsed) if rg is not None and rg.graphs else None


def replay(rg: RunGraph, run: str, changes: Sequence[Change]) -> WhatIf:
    """Replay every step of ``rg`` unchanged and with ``changes`` (module docs)."""
    rg.segments.load(rg.ranks)
    per_byte = _fitted(rg, changes)
    late = _Factors(changes).on_time()
    excess = on_time_excess(rg.graphs.values(), late) if late else None
    steps = []
    for s in sorted(rg.graphs):
        g = rg.graphs[s]
        measured = sum(r.end - r.start for r in g.ranks.values()) / len(g.ranks)
        steps.append(StepPrediction(s, measured, replay_step(g, rg.segments, rg.shift, ()),
                                    replay_step(g, rg.segments, rg.shift, changes, per_byte, excess)))
    n = len(steps)
    by: dict[str, float] = defaultdict(float)
    for p in steps:
        by["m"] += p.measured_ns / n
        by["u"] += p.unchanged_ns / n
        by["p"] += p.predicted_ns / n
        by["e"] += abs(p.unchanged_ns - p.measured_ns) / n
    return WhatIf(run, tuple(c.text for c in changes), tuple(steps), by["m"], by["u"], by["p"], by["e"],
                  heldout_error(steps), rg.unpaired)


def _fitted(rg: RunGraph, changes: Sequence[Change]) -> dict[str, float | None] | None:
    """The run's time per byte by collective when a change scales the volume (None when none
    does); :class:`Inconclusive` when a collective that moved bytes cannot be fitted: its
    prediction would keep its time unchanged without saying so."""
    if not any(c.volume for c in changes):
        return None
    costs = volume_costs(rg.graphs.values())
    unfit = sorted(name for name, slope in costs.items() if slope is None)
    if unfit or not costs:
        raise Inconclusive(f"{VOLUME}: {', '.join(unfit) or 'no collective'} recorded with one message size only "
                           "(or none): a time per byte needs two sizes; scale the time instead "
                           f"({COMMUNICATION_TRANSFER.name}*F)")
    return costs


def heldout_error(steps: Sequence[StepPrediction]) -> float | None:
    """Each step predicted by the median of the other steps' unchanged replays: the mean absolute
    difference to its measured time (None with fewer than two steps)."""
    if len(steps) < 2:
        return None
    return sum(abs(statistics.median(o.unchanged_ns for o in steps if o is not p) - p.measured_ns)
               for p in steps) / len(steps)
