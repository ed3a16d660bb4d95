"""Pipeline parallelism: each microbatch's forward and backward spans, and each stage's bubbles.

Definitions (docs/ANALYSIS.md, "Pipeline parallelism"), per stage (a rank) and step; the stages
and their order come from :mod:`stepscope.analysis.pipeline_stages`.

- **Work items**: on a CPU-only rank its compute ops (CPU ops that are not communication), on a
  GPU rank its compute kernels; each is *issued* at its start (an op) or at its launch (a
  kernel), and its phase is that of the markers around the issue (:mod:`stepscope.store.rankstats.phase`).
  Items are taken into a step by their issue time in its CPU window.
- **Chunks**: where torch's runtime schedules annotate each action (``PP:<stage>F<mb>``), a
  chunk is the items issued inside one compute action, which names its stage, kind and
  microbatch. Elsewhere, the step's items in issue order cut wherever a point-to-point op is
  issued or the phase changes; a backward chunk preceded by a backward receive or followed by a
  backward send is a microbatch's **backward**, any other (non-optimizer) chunk preceded by a
  forward receive or followed by a forward send is a microbatch's **forward** (forward traffic:
  to the next stage, from the previous one); forwards and backwards are numbered in order. The
  rest is other work (data preparation, gradient clipping, the optimizer).
- A chunk's **span** runs from its first item's start to its last item's end. It is busy where
  items run and in the gaps between them shorter than 1 ms (Python on the host, launch gaps on
  the GPU), not in longer ones (the host was blocked on a transfer).
- **busy** = the part of the step window covered by work (every chunk's busy time); **bubble**
  = the rest, ``step_ns - busy_ns``, split at the first forward's start and the last backward's
  end into **fill** (before), **wait** (between: blocked on a neighbour) and **drain** (after);
  ``bubble_fraction = bubble_ns / step_ns``.
- **Schedule**: GPipe when every stage runs all its forwards before its first backward; 1F1B
  when stage ``s`` of ``p`` runs ``min(m, p - s)`` forwards, then alternates backward and
  forward, then the remaining backwards; interleaved when a rank runs the actions of ``v > 1``
  stages; zero-bubble when backwards are split (``I``/``W`` actions). ``ideal_fraction = (p - 1)
  / (v m + p - 1)`` (``v = 1`` but interleaved); none for zero-bubble and unknown orders.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from stepscope.analysis._sql import rank_filter
from stepscope.analysis.absent import Absent, Maybe
from stepscope.analysis.breakdown import step_windows
from stepscope.analysis.cache import cached_frame
from stepscope.analysis.findings import Finding, Results, Severity, rule
from stepscope.analysis.pipeline_stages import Pipeline, p2p_transfers, pipelines, schedule_actions
from stepscope.analysis.quantiles import median
from stepscope.analysis.sections import SQLStore, section

GPIPE, ONE_F_ONE_B, INTERLEAVED, ZERO_BUBBLE, UNKNOWN = "gpipe", "1f1b", "interleaved", "zero_bubble", "unknown"
"""Values of ``pipeline.schedule``."""

Item = tuple[int, int, int, str]
"""A work item: (issue_ns, start_ns, end_ns, phase)."""


# ---- work items and their phase ----


@cached_frame("pipeline_items")
def work_items(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """The work items of every pipeline rank (module docs): ``rank, issue_ns, start_ns, end_ns,
    phase``, from ``rank_pipeline_work`` (each trace's items, stored at ingest). A rank with kernel
    items in any of its traces counts only those: its CPU ops are not its stage's work (before the
    table, a rank with any kernel at all; the two differ only for a rank with one trace whose
    kernels were never launched in it and another trace with no kernel)."""
    rf, extra = rank_filter(ranks, "w.rank")
    return store.sql(f"""
        SELECT w.rank, w.issue_ns, w.start_ns, w.end_ns, w.phase
        FROM rank_pipeline_work w
        WHERE w.run = $run AND {rf}
          AND (w.on_gpu OR w.rank NOT IN (SELECT rank FROM rank_pipeline_work WHERE run = $run AND on_gpu))
        ORDER BY w.rank, w.issue_ns, w.start_ns, w.end_ns
    """, {"run": run, **extra})


# ---- chunks, spans and bubbles of one stage in one step ----


@dataclass(frozen=True)
class Transfer:
    """A point-to-point op on a stage: when it was issued and whether it carries forward traffic
    (activations: to the next stage, from the previous one) or backward traffic (gradients)."""

    ts_ns: int
    send: bool
    forward: bool


GAP_NS = 1_000_000
"""Consecutive items of a chunk further apart than this (1 ms) leave a gap that is not work: the
host was blocked (waiting for a transfer to complete, or not scheduled), not computing."""


@dataclass
class Chunk:
    """Consecutive work items of one phase with no transfer issued between them; ``segments``:
    their time covered, merging gaps shorter than :data:`GAP_NS`."""

    phase: str
    first_issue: int
    last_issue: int
    segments: list[tuple[int, int]]
    kind: str | None = None
    """``forward``, ``backward`` (or ``weight``, a split backward's second half) when the chunk is a
    microbatch's, else None (other work)."""
    stage: int | None = None
    microbatch: int | None = None
    """Named by a schedule action; else the stage is the rank's and microbatches count in order."""

    @property
    def start_ns(self) -> int:
        return min(s for s, _ in self.segments)

    @property
    def end_ns(self) -> int:
        return max(e for _, e in self.segments)

    def add(self, issue: int, start: int, end: int) -> None:
        self.last_issue = issue
        seg_start, seg_end = self.segments[-1]
        if start <= seg_end + GAP_NS:
            self.segments[-1] = (min(seg_start, start), max(seg_end, end))
        else:
            self.segments.append((start, end))


def chunks(items: Sequence[Item], cuts: Sequence[int]) -> list[Chunk]:
    """``items`` (issue, start, end, phase) in issue order, cut at the ``cuts`` (sorted issue times
    of transfers) and where the phase changes."""
    out: list[Chunk] = []
    for issue, start, end, phase in items:
        current = out[-1] if out else None
        if (current is None or current.phase != phase
                or bisect.bisect_right(cuts, current.last_issue) != bisect.bisect_right(cuts, issue)):
            out.append(Chunk(phase, issue, issue, [(start, end)]))
        else:
            current.add(issue, start, end)
    return out


def label(parts: list[Chunk], transfers: Sequence[Transfer], step_end: int) -> None:
    """Mark each chunk forward, backward or other work (module docs), in place."""
    times = [t.ts_ns for t in transfers]
    for i, chunk in enumerate(parts):
        lo = parts[i - 1].last_issue if i else -(2**63)
        hi = parts[i + 1].first_issue if i + 1 < len(parts) else step_end
        before = transfers[bisect.bisect_right(times, lo):bisect.bisect_left(times, chunk.first_issue)]
        after = transfers[bisect.bisect_right(times, chunk.last_issue):bisect.bisect_left(times, hi)]
        if chunk.phase == "optimizer":
            continue
        backward = chunk.phase == "backward"
        if any(not t.send and t.forward != backward for t in before) or any(t.send and t.forward != backward for t in after):
            chunk.kind = "backward" if backward else "forward"


@dataclass(frozen=True)
class Action:
    """A compute action of a runtime schedule on one rank: when, which stage, kind, microbatch."""

    ts_ns: int
    end_ns: int
    stage: int
    kind: str
    microbatch: int


def annotated_chunks(items: Sequence[Item], actions: Sequence[Action], cuts: Sequence[int]) -> list[Chunk]:
    """One chunk per action (its items issued inside it), the other items as other work."""
    starts = [a.ts_ns for a in actions]
    inside: dict[int, list[Item]] = {}
    rest: list[Item] = []
    for item in items:
        i = bisect.bisect_right(starts, item[0]) - 1
        if i >= 0 and item[0] < actions[i].end_ns:
            inside.setdefault(i, []).append(item)
        else:
            rest.append(item)
    out = chunks(rest, cuts)
    for i, mine in inside.items():
        action = actions[i]
        chunk = chunks([(issue, start, end, "action") for issue, start, end, _ in mine], [])[0]
        chunk.kind, chunk.stage, chunk.microbatch = action.kind, action.stage, action.microbatch
        out.append(chunk)
    return sorted(out, key=lambda c: c.first_issue)


def _union_length(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of ``intervals`` clipped to ``[lo, hi)``."""
    total, reach = 0, lo
    for start, end in sorted(intervals):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total += end - start
            reach = end
    return total


@dataclass(frozen=True)
class StageStep:
    """One stage in one step: its spans, busy time and bubble split (module docs)."""

    rank: int
    stage: int
    step: int
    start_ns: int
    end_ns: int
    busy_ns: int
    fill_ns: int | None
    wait_ns: int | None
    drain_ns: int | None
    order: str
    """The kinds of its microbatch chunks in order: F forward, B backward, W weight backward."""
    spans: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    virtual_stages: tuple[int, ...] = ()

    @property
    def step_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def bubble_ns(self) -> int:
        return self.step_ns - self.busy_ns

    @property
    def microbatches(self) -> int:
        return len({s["microbatch"] for s in self.spans if s["kind"] == "forward"})


_KIND_LETTER = {"forward": "F", "backward": "B", "weight": "W"}
_ACTION_KIND = {"F": "forward", "B": "backward", "I": "backward", "W": "weight"}


def stage_step(rank: int, stage: int, step: int, window: tuple[int, int, int, int], items: Sequence[Item],
               transfers: Sequence[Transfer], actions: Sequence[Action] = ()) -> StageStep:
    """Spans and bubbles of ``rank`` (stage ``stage``) in ``step``. ``window``: the step window
    ``(start, end)`` and the CPU window ``(cpu_start, cpu_end)`` that items, transfers and
    actions are taken from by issue time."""
    w0, w1, c0, c1 = window
    mine = [it for it in items if c0 <= it[0] < c1]
    moves = [t for t in transfers if c0 <= t.ts_ns < c1]
    acts = [a for a in actions if c0 <= a.ts_ns < c1]
    cuts = [t.ts_ns for t in moves]
    if acts:
        parts = annotated_chunks(mine, acts, cuts)
    else:
        parts = chunks(mine, cuts)
        label(parts, moves, c1)
    intervals = [segment for c in parts for segment in c.segments]
    busy = _union_length(intervals, w0, w1)
    counters: Counter[str] = Counter()
    spans = []
    for c in parts:
        if c.kind is None:
            continue
        index = c.microbatch if c.microbatch is not None else counters[c.kind]
        counters[c.kind] += 1
        spans.append({"microbatch": index, "kind": c.kind, "stage": c.stage if c.stage is not None else stage,
                      "start_ns": c.start_ns, "end_ns": c.end_ns,
                      "busy_ns": _union_length(c.segments, c.start_ns, c.end_ns)})
    order = "".join(_KIND_LETTER[s["kind"]] for s in spans)
    virtual = tuple(sorted({a.stage for a in acts}))
    forwards = [s for s in spans if s["kind"] == "forward"]
    backwards = [s for s in spans if s["kind"] != "forward"]
    if not forwards or not backwards:
        return StageStep(rank, stage, step, w0, w1, busy, None, None, None, order, tuple(spans), virtual)
    first, last = max(w0, forwards[0]["start_ns"]), min(w1, max(s["end_ns"] for s in backwards))
    fill = (first - w0) - _union_length(intervals, w0, first)
    drain = (w1 - last) - _union_length(intervals, last, w1)
    wait = (w1 - w0) - busy - fill - drain
    return StageStep(rank, stage, step, w0, w1, busy, fill, wait, drain, order, tuple(spans), virtual)


# ---- the schedule ----


def one_f_one_b(stage: int, stages: int, microbatches: int) -> str:
    """The order of forwards (F) and backwards (B) of stage ``stage`` under 1F1B."""
    warmup = min(microbatches, stages - stage)
    return "F" * warmup + "BF" * (microbatches - warmup) + "B" * warmup


def schedule_of(rows: Sequence[StageStep], stages: int, microbatches: int) -> str:
    """The schedule of one step from its stages' rows (module docs)."""
    if any(len(r.virtual_stages) > 1 for r in rows):
        return INTERLEAVED
    if any("W" in r.order for r in rows):
        return ZERO_BUBBLE
    if all(r.order == "F" * microbatches + "B" * microbatches for r in rows):
        return GPIPE
    if all(r.order == one_f_one_b(r.stage, stages, microbatches) for r in rows):
        return ONE_F_ONE_B
    return UNKNOWN


def ideal_fraction(schedule: str, stages: int, microbatches: int, per_rank: int = 1) -> Maybe[float]:
    """``(p - 1) / (v m + p - 1)`` for GPipe, 1F1B and interleaved 1F1B (uniform stages, free transfers)."""
    if schedule in (GPIPE, ONE_F_ONE_B, INTERLEAVED):
        return (stages - 1) / (per_rank * microbatches + stages - 1)
    if schedule == ZERO_BUBBLE:
        return Absent("zero-bubble schedule: its ideal depends on how the backward splits (no formula here)")
    return Absent("schedule not recognised from the order of forwards and backwards: no ideal to compare with")


# ---- the analysis ----

STAGE_SCHEMA = pa.schema([
    ("rank", pa.int64()), ("stage", pa.int64()), ("step", pa.int64()), ("start_ns", pa.int64()),
    ("end_ns", pa.int64()), ("step_ns", pa.int64()), ("busy_ns", pa.int64()), ("fill_ns", pa.int64()),
    ("wait_ns", pa.int64()), ("drain_ns", pa.int64()), ("bubble_ns", pa.int64()), ("bubble_fraction", pa.float64()),
    ("order", pa.string()),
])
SPAN_SCHEMA = pa.schema([
    ("rank", pa.int64()), ("step", pa.int64()), ("microbatch", pa.int64()), ("kind", pa.string()),
    ("stage", pa.int64()), ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("busy_ns", pa.int64()),
    ("offset_ns", pa.int64()),
])


@dataclass(frozen=True)
class PipelineResult:
    """The ``pipeline`` section: the schedule, the stage order and every stage's steps."""

    schedule: str
    stages_count: int
    microbatches: Maybe[int]
    ideal_fraction: Maybe[float]
    pipelines: tuple[Pipeline, ...]
    stages: tuple[StageStep, ...]
    stages_per_rank: int = 1

    @property
    def measured_fraction(self) -> float | None:
        """Bubble over step time, summed over every stage and step."""
        total = sum(s.step_ns for s in self.stages)
        return sum(s.bubble_ns for s in self.stages) / total if total else None

    def stage_table(self) -> pa.Table:
        """One row per stage and step: ``rank, stage, step, start_ns, end_ns, step_ns, busy_ns,
        fill_ns, wait_ns, drain_ns, bubble_ns, bubble_fraction, order``."""
        return pa.Table.from_pylist([
            {"rank": s.rank, "stage": s.stage, "step": s.step, "start_ns": s.start_ns, "end_ns": s.end_ns,
             "step_ns": s.step_ns, "busy_ns": s.busy_ns, "fill_ns": s.fill_ns, "wait_ns": s.wait_ns,
             "drain_ns": s.drain_ns, "bubble_ns": s.bubble_ns,
             "bubble_fraction": s.bubble_ns / s.step_ns if s.step_ns else None, "order": s.order}
            for s in self.stages], schema=STAGE_SCHEMA)

    def span_table(self) -> pa.Table:
        """One row per microbatch span: ``rank, step, microbatch, kind, stage, start_ns, end_ns,
        busy_ns, offset_ns`` (``start_ns`` minus the step's earliest window start over the
        pipeline's stages: a common time origin for a timeline)."""
        origin: dict[tuple[int, int], int] = {}
        for pipe in self.pipelines:
            for s in self.stages:
                if s.rank in pipe.ranks:
                    key = (pipe.ranks[0], s.step)
                    origin[key] = min(origin.get(key, s.start_ns), s.start_ns)
        head = {r: p.ranks[0] for p in self.pipelines for r in p.ranks}
        return pa.Table.from_pylist([
            {"rank": s.rank, "step": s.step, **span, "offset_ns": span["start_ns"] - origin[(head[s.rank], s.step)]}
            for s in self.stages for span in s.spans], schema=SPAN_SCHEMA)


def pipeline_analysis(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[PipelineResult]:
    """Stages, spans and bubbles of every pipeline of ``run`` (module docs); the stage order is
    found over all ranks, the rows are those of ``ranks``."""
    traced = [r["rank"] for r in store.sql("SELECT DISTINCT rank FROM sources WHERE run = $run ORDER BY rank",
                                           {"run": run}).to_pylist()]
    actions = _actions_by_rank(schedule_actions(store, run))
    transfers_table = p2p_transfers(store, run)
    found = pipelines(transfers_table, traced, {r: min(a.stage for a in acts) for r, acts in actions.items()})
    if isinstance(found, Absent):
        return found
    if len({len(x.ranks) for x in found}) > 1:
        return Absent("pipelines of different depths in one run: " + ", ".join(str(len(x.ranks)) for x in found))
    wanted = set(traced if ranks is None else ranks)
    stage_of = {r: p.stage_of(r) for p in found for r in p.ranks}
    windows = [w for w in step_windows(store, run).to_pylist() if w["rank"] in stage_of and w["rank"] in wanted]
    if not windows:
        return Absent("no ProfilerStep#N annotations in the traces of the pipeline's ranks")
    transfers = _transfers_by_rank(transfers_table, stage_of)
    items = _items_by_rank(work_items(store, run))
    rows = tuple(
        stage_step(w["rank"], stage_of[w["rank"]], w["step"],
                   (w["start_ns"], w["end_ns"], w["cpu_start_ns"], w["cpu_end_ns"]),
                   items.get(w["rank"], []), transfers.get(w["rank"], []), actions.get(w["rank"], []))
        for w in windows
    )
    p = len(found[0].ranks)
    per_rank = max((len(r.virtual_stages) for r in rows), default=1) or 1
    counts = Counter(r.microbatches for r in rows)
    m = counts.most_common(1)[0][0]
    steps = sorted({r.step for r in rows})
    schedules = {schedule_of([r for r in rows if r.step == st], p, m) for st in steps}
    schedule = schedules.pop() if len(schedules) == 1 else UNKNOWN
    microbatches: Maybe[int]
    if not m:
        microbatches = Absent("no microbatch forward found between the transfers")
    elif len(counts) > 1:
        microbatches = Absent(f"stages ran different numbers of microbatches: {dict(sorted(counts.items()))}")
    else:
        microbatches = m
    ideal = microbatches if isinstance(microbatches, Absent) else ideal_fraction(schedule, p, m, per_rank)
    return PipelineResult(schedule, p, microbatches, ideal, tuple(found), rows, per_rank)


def _transfers_by_rank(table: pa.Table, stage_of: dict[int, int]) -> dict[int, list[Transfer]]:
    out: dict[int, list[Transfer]] = {}
    for r in table.to_pylist():
        if r["peer"] is None or r["rank"] not in stage_of or r["peer"] not in stage_of:
            continue
        mine, theirs = stage_of[r["rank"]], stage_of[r["peer"]]
        forward = (theirs > mine) if r["send"] else (theirs < mine)
        out.setdefault(r["rank"], []).append(Transfer(r["ts_ns"], r["send"], forward))
    return out


CHUNK_PHASE = {"backward": "backward", "optimizer": "optimizer"}
"""Phases that cut chunks; the rest (forward, other, unknown) is one: forward code runs without
markers (an op named ``..._forward`` is a marker of its own, and must not split a forward)."""


def _items_by_rank(table: pa.Table) -> dict[int, list[Item]]:
    out: dict[int, list[Item]] = {}
    columns = [table.column(c).to_pylist() for c in ("rank", "issue_ns", "start_ns", "end_ns", "phase")]
    for rank, issue, start, end, phase in zip(*columns):
        out.setdefault(rank, []).append((issue, start, end, CHUNK_PHASE.get(phase, "forward")))
    return out


def _actions_by_rank(table: pa.Table) -> dict[int, list[Action]]:
    out: dict[int, list[Action]] = {}
    for r in table.to_pylist():
        out.setdefault(r["rank"], []).append(
            Action(r["ts_ns"], r["end_ns"], r["stage"], _ACTION_KIND[r["action"]], r["microbatch"]))
    return out


# ---- summary section ----


def stage_json(s: StageStep) -> dict[str, Any]:
    """One item of ``pipeline.stages`` (docs/SUMMARY_JSON.md)."""
    split = "no microbatch forward and backward both found in this step"
    return {
        "rank": s.rank, "stage": s.stage, "step": s.step, "busy_ns": s.busy_ns, "bubble_ns": s.bubble_ns,
        "fill_ns": s.fill_ns if s.fill_ns is not None else Absent(split),
        "drain_ns": s.drain_ns if s.drain_ns is not None else Absent(split),
        "wait_ns": s.wait_ns if s.wait_ns is not None else Absent(split),
        "bubble_fraction": s.bubble_ns / s.step_ns if s.step_ns else Absent("empty step window"),
        "step_ns": s.step_ns, "start_ns": s.start_ns, "end_ns": s.end_ns, "order": s.order,
        "virtual_stages": list(s.virtual_stages) or [s.stage], "microbatches": list(s.spans),
    }


def pipeline_json(result: PipelineResult) -> dict[str, Any]:
    return {
        "schedule": result.schedule, "stages_count": result.stages_count, "microbatches": result.microbatches,
        "ideal_fraction": result.ideal_fraction, "measured_fraction": result.measured_fraction,
        "stages_per_rank": result.stages_per_rank, "pipelines": [list(p.ranks) for p in result.pipelines],
        "stages": [stage_json(s) for s in result.stages],
    }


@section("pipeline", order=57, to_json=pipeline_json)
def pipeline_section(store: SQLStore, run: str, ranks: Sequence[int] | None) -> Maybe[PipelineResult]:
    """Pipeline parallelism: stage order, schedule, each microbatch's forward and backward spans,
    each stage's busy time and bubble (fill, wait, drain) against the schedule's ideal."""
    return pipeline_analysis(store, run, ranks)


# ---- the finding ----

BUBBLE_MARGIN = 0.10
"""The measured bubble fraction must exceed the schedule's ideal by this much (10 points)."""
SLOW_STAGE_RATIO = 1.5
"""A stage busy this many times the median of the other stages' busy time is a slow stage..."""
SLOW_STAGE_SHARE = 0.5
"""... when its extra busy time accounts for this share of the other stages' bubble above ideal."""
MIN_STAKE_NS = 1_000_000
"""Less than 1 ms per step at stake is not a finding, whatever the fractions."""


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _per_rank(rows: Sequence[StageStep]) -> dict[int, dict[str, float]]:
    grouped: dict[int, list[StageStep]] = {}
    for r in rows:
        grouped.setdefault(r.rank, []).append(r)
    return {rank: {"stage": rs[0].stage, "busy": _mean([r.busy_ns for r in rs]), "step": _mean([r.step_ns for r in rs]),
                   "bubble": _mean([r.bubble_ns for r in rs])} for rank, rs in grouped.items()}


def bubble_findings(result: PipelineResult) -> Iterator[Finding]:
    """Per pipeline whose bubble exceeds the ideal by :data:`BUBBLE_MARGIN`: the slow stage that
    makes the others wait (:data:`SLOW_STAGE_RATIO`, :data:`SLOW_STAGE_SHARE`), or that the
    stages are balanced and the excess lies between the microbatches."""
    if isinstance(result.ideal_fraction, Absent):
        return
    ideal = result.ideal_fraction
    for pipe in result.pipelines:
        rows = [r for r in result.stages if r.rank in pipe.ranks]
        stats = _per_rank(rows)
        if len(stats) < 2:
            continue
        measured = sum(r.bubble_ns for r in rows) / sum(r.step_ns for r in rows)
        if measured - ideal < BUBBLE_MARGIN:
            continue
        slow = max(stats, key=lambda r: stats[r]["busy"])
        others = [s for r, s in stats.items() if r != slow]
        typical = median([s["busy"] for s in others])
        extra = stats[slow]["busy"] - typical
        excess = _mean([s["bubble"] - ideal * s["step"] for s in others])
        evidence = {
            "schedule": result.schedule, "stages": result.stages_count, "microbatches": result.microbatches,
            "ideal_fraction": round(ideal, 4), "measured_fraction": round(measured, 4),
            "busy_ns": {str(r): round(s["busy"]) for r, s in sorted(stats.items())},
            "bubble_fraction": {str(r): round(s["bubble"] / s["step"], 4) for r, s in sorted(stats.items())},
        }
        head = (f"pipeline bubble {measured:.0%} of the step against {ideal:.0%} ideal "
                f"({_schedule_name(result)}, {result.microbatches} microbatches)")
        if stats[slow]["busy"] >= SLOW_STAGE_RATIO * typical and extra >= SLOW_STAGE_SHARE * excess and extra >= MIN_STAKE_NS:
            stage = int(stats[slow]["stage"])
            yield _finding(
                f"{head}: stage {stage} (rank {slow}) is busy {stats[slow]['busy'] / 1e6:.1f} ms per step, "
                f"{stats[slow]['busy'] / typical:.1f}x the other stages' median ({typical / 1e6:.1f} ms); the others wait "
                f"for it: balance the layers across stages",
                {**evidence, "slow_rank": slow, "slow_stage": stage, "extra_busy_ns": round(extra)}, (slow,), round(extra))
            continue
        stake = round(_mean([s["step"] for s in stats.values()]) * (measured - ideal))
        if stake < MIN_STAKE_NS:
            continue
        yield _finding(
            f"{head}: no stage is much slower than the others (busiest: rank {slow}, {stats[slow]['busy'] / 1e6:.1f} ms "
            f"of work per step; the others' median {typical / 1e6:.1f} ms): the excess is spent between microbatches, "
            "in transfers between stages or the schedule's own overhead",
            evidence, tuple(sorted(stats)), stake)


def _schedule_name(result: PipelineResult) -> str:
    """``1F1B, 3 stages`` or ``interleaved 1F1B, 2 ranks x 2 stages``."""
    if result.schedule == INTERLEAVED:
        return f"interleaved 1F1B, {result.stages_count} ranks x {result.stages_per_rank} stages"
    return f"{ {GPIPE: 'GPipe', ONE_F_ONE_B: '1F1B'}.get(result.schedule, result.schedule)}, {result.stages_count} stages"


def _finding(message: str, evidence: dict[str, Any], ranks: tuple[int, ...], stake: int) -> Finding:
    return Finding(Severity.WARNING, "pipeline.bubble", message, {**evidence, "ranks": list(ranks)},
                   ranks=ranks, time_at_stake_ns=stake)


@rule("pipeline.bubble", needs=("pipeline",))
def pipeline_bubble(results: Results) -> Iterator[Finding]:
    """The pipeline's bubble exceeds its schedule's ideal (p - 1) / (v m + p - 1) by 10 points or
    more: names the slow stage the others wait for, or says the stages are balanced."""
    result = results["pipeline"]
    assert isinstance(result, PipelineResult)
    yield from bubble_findings(result)
