"""Who made whom wait: per step, the ranks that arrived late at the collectives where others
waited, the wait they caused, and where their lateness came from.

Reads the collective members matched across ranks (:mod:`stepscope.analysis.matching`, through
:func:`stepscope.analysis.comm.collective_kernels`' table for each member's exposed wait), the
step windows, and the step parts of each rank up to its arrival (the breakdowns of
:mod:`stepscope.analysis.breakdown` over other windows). Definitions (docs/ANALYSIS.md, "Late
ranks"):

- An instance *caused waiting* when it has late ranks (:mod:`~stepscope.analysis.matching`) and
  some other member waited with an exposed wait (not hidden under compute) above zero.
  Point-to-point transfers are left out: a pipeline makes one side wait by design.
- Per step, instances are grouped by their set of late ranks; the group whose waiting ranks
  waited longest in all (``caused_wait_ns``, summed over the waiting ranks and the group's
  instances) is the step's diagnosis. ``max_wait_ns`` is the longest summed wait of one waiting
  rank: the step time at stake.
- Where the lateness came from, at the group's instance with the most caused wait: for a late
  rank ``l`` and the median over the waiting ranks ``w`` (clock-aligned times),
  ``lateness = arrival_l - arrival_w``, ``entry_gap = step start_l - step start_w`` (the step
  window's start), ``in_step = lateness - entry_gap`` (averaged over the late ranks). When the
  entry gap is at least half the lateness, the ranks entered the step already apart
  (``origin = before_window``: before the profiled window for the first profiled step, the
  previous step otherwise). Else ``origin = inside_step``: the parts of each rank's step from
  its start to its arrival (they tile that time, so the differences sum to ``in_step``) say
  which part grew: the leaf whose time exceeds the waiting ranks' median by the most (GPU parts;
  when that is GPU idle time, the host part that grew most if it grew by at least half as much:
  the host was late to launch), named by :data:`CAUSE_OF_PART`.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from stepscope.analysis._local import local_sql
from stepscope.analysis._sql import sql_list
from stepscope.analysis.absent import Absent, Maybe
from stepscope.analysis.basis import StepBasis, basis_of
from stepscope.analysis.breakdown import parts_over, step_windows
from stepscope.analysis.cache import cached_frame
from stepscope.analysis.findings import MIN_STAKE_NS, Finding, Results, Severity, ranks_phrase, rule
from stepscope.analysis.matching import POINT_TO_POINT
from stepscope.analysis.pipeline import PipelineResult
from stepscope.store.rankstats.parts import (
    COMM_TRANSFER,
    COMM_WAIT,
    COMMUNICATION_TRANSFER,
    COMMUNICATION_WAIT,
    COMPUTE,
    COMPUTE_OPS,
    DATA_LOADING,
    GPU,
    HOST,
    IDLE,
    MEMCPY_D2D_EXPOSED,
    MEMCPY_D2H_EXPOSED,
    MEMCPY_H2D_EXPOSED,
    MEMCPY_OTHER_EXPOSED,
    MEMSET_EXPOSED,
    OPTIMIZER,
    OTHER,
    SYNC_WAIT,
    Breakdown,
    Part,
)
from stepscope.analysis.sections import SQLStore, section
from stepscope.units import duration

CAUSE_OF_PART: dict[Part, str] = {
    COMPUTE: "compute",
    COMM_WAIT: "communication",
    COMM_TRANSFER: "communication",
    MEMCPY_H2D_EXPOSED: "copies",
    MEMCPY_D2H_EXPOSED: "copies",
    MEMCPY_D2D_EXPOSED: "copies",
    MEMCPY_OTHER_EXPOSED: "copies",
    MEMSET_EXPOSED: "copies",
    **{p: "idle" for p in IDLE.sub_parts},
    DATA_LOADING: "data loading",
    OPTIMIZER: "optimizer",
    SYNC_WAIT: "sync",
    COMPUTE_OPS: "host",
    COMMUNICATION_WAIT: "communication",
    COMMUNICATION_TRANSFER: "communication",
    OTHER: "host",
}
"""What a part that grew on a late rank says about the cause (``cause`` in the evidence). On a
CPU-only run, host compute ops are the compute (:func:`_cause`)."""

CAUSE_PHRASE = {
    "compute": "computing", "host": "on the host", "data loading": "loading data",
    "sync": "blocked in a device synchronisation", "copies": "copying", "communication": "in earlier communication",
    "optimizer": "in the optimizer", "idle": "with its GPU idle (no host part grew as much)",
}
"""How a finding's message says each cause."""

ORIGINS = ("before_window", "inside_step")

LATE_WAIT_PCT = 5.0
"""A step's diagnosis is a finding when its longest wait is at least this share of the step
(and at least :data:`stepscope.analysis.findings.MIN_STAKE_NS`)."""

NO_LATE = "no collective matched across ranks had a late rank that others waited for (exposed)"


def _cause(part: Part, host_only: bool) -> str:
    if host_only and part is COMPUTE_OPS:
        return "compute"
    return CAUSE_OF_PART[part]


_CAUSED_WAITING = f"""
WITH k AS (
  SELECT * FROM kernels
  WHERE late IS NOT NULL AND step IS NOT NULL AND (collective IS NULL OR collective NOT IN {sql_list(POINT_TO_POINT)})
),
caused AS (
  SELECT inst_id FROM k GROUP BY inst_id
  HAVING bool_or(late) AND sum(greatest(coalesce(exposed_wait_ns, wait_ns, 0), 0)) FILTER (WHERE NOT late) > 0
)
SELECT * EXCLUDE (_row) FROM k SEMI JOIN caused USING (inst_id) ORDER BY _row
"""
"""The members of the instances that caused waiting (valid, not point-to-point, in a step, a
late member and an exposed wait above zero among the others: what :func:`_diagnoses` keeps), in
the order of the kernels' table (``_row``): the grouping is SQL, over every rank at once."""


def _instances(kernels: pa.Table) -> dict[int, list[dict[str, Any]]]:
    """Members of every instance that caused waiting (:data:`_CAUSED_WAITING`), by instance id,
    in the kernels' order."""
    numbered = kernels.append_column("_row", pa.array(range(kernels.num_rows), pa.int64()))
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in local_sql(_CAUSED_WAITING, kernels=numbered).to_pylist():
        out[row["inst_id"]].append(row)
    return out


def _exposed_wait(row: dict[str, Any]) -> int:
    return max(0, row["exposed_wait_ns"] if row["exposed_wait_ns"] is not None else row["wait_ns"] or 0)


def _excess(parts: dict[int, dict[str, int]], late: Sequence[int], waiting: Sequence[int],
            leaves: Sequence[Part]) -> list[tuple[int, Part]]:
    """Per leaf: mean over the late ranks minus the median over the waiting ranks, largest first."""
    out = []
    for leaf in leaves:
        mine = statistics.fmean(parts[r][leaf.column] for r in late)
        theirs = statistics.median(parts[r][leaf.column] for r in waiting)
        out.append((round(mine - theirs), leaf))
    return sorted(out, key=lambda item: -item[0])


@dataclass(frozen=True)
class _Diagnosis:
    step: int
    late: tuple[int, ...]
    waiting: tuple[int, ...]
    instances: list[int]
    key: list[dict[str, Any]]


def _diagnoses(instances: dict[int, list[dict[str, Any]]]) -> list[_Diagnosis]:
    """Per step: the group of instances (by late ranks) whose waiting ranks waited longest."""
    by_step: dict[int, dict[tuple[int, ...], list[int]]] = defaultdict(lambda: defaultdict(list))
    caused: dict[int, int] = {}
    for inst_id, members in instances.items():
        late = tuple(sorted(m["rank"] for m in members if m["late"]))
        total = sum(_exposed_wait(m) for m in members if not m["late"])
        if not late or total <= 0:
            continue
        caused[inst_id] = total
        by_step[min(m["step"] for m in members)][late].append(inst_id)
    out = []
    for step, groups in sorted(by_step.items()):
        late, ids = max(groups.items(), key=lambda kv: sum(caused[i] for i in kv[1]))
        key = instances[max(ids, key=lambda i: caused[i])]
        waiting = tuple(sorted({m["rank"] for i in ids for m in instances[i] if not m["late"]}))
        out.append(_Diagnosis(step, late, waiting, ids, key))
    return out


@cached_frame("late_arrivals")
def late_arrivals(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[pa.Table]:
    """One row per step in which late ranks made others wait (module docs): ``run, step,
    late_ranks, waiting_ranks, collective, pg_name, instances, caused_wait_ns, max_wait_ns,
    min_wait_ns`` (per waiting rank, summed over the step's instances of the group),
    ``waiting_step_ns`` (the waiting ranks' step windows, summed), ``step_ns`` (median step
    window of the members), ``late_arrival_ns, first_arrival_ns`` (aligned starts at the key
    instance), ``lateness_ns, entry_gap_ns, in_step_ns, origin, cause, cause_part,
    cause_excess_ns, first_step`` (the rank's first profiled step), ``traced_ranks,
    group_size``. ``ranks`` keeps the steps whose late or waiting ranks include one of them."""
    from stepscope.analysis.comm import collective_kernels

    instances = _instances(collective_kernels(store, run))
    diagnoses = _diagnoses(instances)
    if ranks is not None:
        wanted = {int(r) for r in ranks}
        diagnoses = [d for d in diagnoses if wanted & {*d.late, *d.waiting}]
    if not diagnoses:
        return Absent(NO_LATE)
    windows = {(r["rank"], r["step"]): r for r in step_windows(store, run).to_pylist()}
    first_step = {}
    for rank, step in windows:
        first_step[rank] = min(step, first_step.get(rank, step))
    host_only = all(m["host_side"] for d in diagnoses for m in d.key)
    # Each rank's parts from its step's start to its arrival at the key instance (one window
    # per rank and step: disjoint).
    spans = [(m["rank"], i, windows[(m["rank"], d.step)]["start_ns"],
              max(windows[(m["rank"], d.step)]["start_ns"], m["ts_ns"]))
             for i, d in enumerate(diagnoses) for m in d.key if (m["rank"], d.step) in windows]
    tables = {b: parts_over(store, run, b, spans) for b in ((HOST,) if host_only else (GPU, HOST))}
    parts: dict[Breakdown, dict[tuple[int, int], dict[str, int]]] = {
        b: {(row["key"], row["rank"]): row for row in t.to_pylist()} for b, t in tables.items()}
    rows = []
    for i, d in enumerate(diagnoses):
        members = {m["rank"]: m for m in d.key}
        late = [r for r in d.late if (r, d.step) in windows]
        waiting = [r for r in members if r not in d.late and (r, d.step) in windows]
        if not late or not waiting:
            continue
        entry = {r: windows[(r, d.step)]["start_ns"] - members[r]["clock_correction_ns"] for r in members
                 if (r, d.step) in windows}
        arrive_w = statistics.median(members[r]["aligned_ts_ns"] for r in waiting)
        entry_w = statistics.median(entry[r] for r in waiting)
        lateness = statistics.fmean(members[r]["aligned_ts_ns"] - arrive_w for r in late)
        gap = statistics.fmean(entry[r] - entry_w for r in late)
        origin = "before_window" if gap >= lateness / 2 else "inside_step"
        cause = cause_part = excess = None
        if origin == "inside_step":
            by_rank = {b: {r: parts[b][(i, r)] for r in members if (i, r) in parts[b]} for b in parts}
            breakdown = HOST if host_only else GPU
            ranked = _excess(by_rank[breakdown], late, waiting, list(breakdown.leaves()))
            excess, part = ranked[0]
            cause = "idle" if part in IDLE.sub_parts else _cause(part, host_only)
            if not host_only and part in IDLE.sub_parts:
                host_excess, host_part = _excess(by_rank[HOST], late, waiting, list(HOST.leaves()))[0]
                if 2 * host_excess >= excess:  # the host was busy longer: it launched late
                    excess, part, cause = host_excess, host_part, _cause(host_part, host_only)
            cause_part = part.name
        waits: dict[int, int] = defaultdict(int)
        for inst_id in d.instances:
            for m in instances[inst_id]:
                if not m["late"]:
                    waits[m["rank"]] += _exposed_wait(m)
        durations = [windows[(r, d.step)]["dur_ns"] for r in members if (r, d.step) in windows]
        rows.append({
            "run": run, "step": d.step, "late_ranks": list(d.late), "waiting_ranks": sorted(waits),
            "collective": d.key[0]["collective"], "pg_name": d.key[0]["pg_name"], "instances": len(d.instances),
            "caused_wait_ns": sum(waits.values()), "max_wait_ns": max(waits.values()),
            "min_wait_ns": min(waits.values()),
            "waiting_step_ns": sum(windows[(r, d.step)]["dur_ns"] for r in waits if (r, d.step) in windows),
            "step_ns": round(statistics.median(durations)),
            "late_arrival_ns": max(members[r]["aligned_ts_ns"] for r in late),
            "first_arrival_ns": min(m["aligned_ts_ns"] for m in d.key),
            "lateness_ns": round(lateness), "entry_gap_ns": round(gap), "in_step_ns": round(lateness - gap),
            "origin": origin, "cause": cause, "cause_part": cause_part, "cause_excess_ns": excess,
            "first_step": all(d.step == first_step.get(r) for r in late),
            "traced_ranks": len(members), "group_size": d.key[0]["inst_group_size"],
        })
    if not rows:
        return Absent(NO_LATE)
    return pa.Table.from_pylist(rows)


@dataclass(frozen=True)
class LateResult:
    """The ``late`` section: the per-step diagnoses, the profiled steps per rank and the run's start."""

    steps: pa.Table
    profiled_steps: int
    run_start_ns: int


@section("late", order=45, to_json=lambda r: {"steps": r.steps.to_pylist(), "profiled_steps": r.profiled_steps})
def late_section(store: SQLStore, run: str, ranks: Sequence[int] | None) -> Maybe[LateResult]:
    """Per step: the ranks that arrived late at collectives where others waited, the wait they
    caused and where their lateness came from."""
    table = late_arrivals(store, run, ranks)
    if isinstance(table, Absent):
        return table
    windows = step_windows(store, run)
    per_rank: dict[int, int] = defaultdict(int)
    for rank in windows.column("rank").to_pylist():
        per_rank[rank] += 1
    start = min(windows.column("start_ns").to_pylist())
    return LateResult(table, max(per_rank.values()), start)


def _where(row: dict[str, Any], late: str) -> str:
    """Where the lateness came from, in words (``late``: the late ranks, as a phrase)."""
    their = "their" if late.startswith("ranks") else "its"
    if row["origin"] == "before_window":
        if row["first_step"]:
            return (f"{late} entered the step already {duration(row['entry_gap_ns'])} behind: the lateness comes from "
                    f"before the profiled window (profile one more step to see it)")
        return (f"{late} entered step {row['step']} already {duration(row['entry_gap_ns'])} behind "
                f"(carried over from step {row['step'] - 1})")
    part = next(p for b in (GPU, HOST) for p in b.leaves() if p.name == row["cause_part"])
    return (f"inside the step: before it, {late} spent {duration(row['cause_excess_ns'])} more than {their} peers "
            f"{CAUSE_PHRASE[row['cause']]} ({part.label})")


def _range(low: float, high: float) -> str:
    """``30.1-32.2 ms``, ``950 us to 1.20 ms``, or one duration when both ends read the same."""
    a, b = duration(low), duration(high)
    if a == b:
        return a
    (va, ua), (vb, ub) = a.split(" "), b.split(" ")
    return f"{va}-{b}" if ua == ub else f"{a} to {b}"


def _of_their_steps(basis: StepBasis | None, wait_ns: float, waiting: int) -> str:
    """A wait summed over ``waiting`` ranks as a share of as many basis steps: ``12% of their mean step``."""
    return basis.of_step(wait_ns / waiting).replace("of the", "of their") if basis and waiting else "share unknown"


def _recurs(steps: int, profiled: int) -> bool:
    """A late set seen in more than half the profiled steps (every step of a one-step trace)."""
    return 2 * steps > profiled or profiled <= 1


@rule("comm.late_rank", needs=("late",))
def late_rank_rule(results: Results) -> Iterator[Finding]:
    """Ranks arrive late at collectives and make the others wait: the longest wait is at least 5%
    of the step and 1 ms, in more than half of the profiled steps (a late rank that changes from
    step to step is jitter; a one-off stall is ``steps.unstable``'s). Names the late ranks, the
    wait they caused (summed over the waiting ranks) and where the lateness came from (before
    the step, or which part of their step grew). One finding per set of late ranks. A collective
    among the stages of one pipeline (a gradient-norm all-reduce over the stages) is left out:
    its arrivals follow the schedule's drain (the last stage finishes first), which is the
    pipeline's bubble (``pipeline.bubble``)."""
    result = results["late"]
    assert isinstance(result, LateResult)
    pipe = results.get("pipeline")
    pipelines = [set(p.ranks) for p in pipe.pipelines] if isinstance(pipe, PipelineResult) else []
    groups: dict[tuple[int, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in result.steps.to_pylist():
        if row["max_wait_ns"] < MIN_STAKE_NS or 100 * row["max_wait_ns"] < LATE_WAIT_PCT * row["step_ns"]:
            continue
        if any({*row["late_ranks"], *row["waiting_ranks"]} <= stages for stages in pipelines):
            continue  # the stages of one pipeline arrive in the order of its drain: pipeline.bubble's
        groups[tuple(row["late_ranks"])].append(row)
    for late, rows in groups.items():
        if not _recurs(len(rows), result.profiled_steps):
            continue
        worst = max(rows, key=lambda r: r["caused_wait_ns"])
        late_text = ranks_phrase(late)
        partial = worst["traced_ranks"] < (worst["group_size"] or worst["traced_ranks"])
        steps = sorted(r["step"] for r in rows)
        at = (f"at +{duration(worst['late_arrival_ns'] - result.run_start_ns)} from the run's start, "
              f"{duration(worst['late_arrival_ns'] - worst['first_arrival_ns'])} after the first rank")
        when = f"step {steps[0]} ({at})" if len(steps) == 1 else \
            f"{len(steps)} of {result.profiled_steps} steps (worst: step {worst['step']}, {at})"
        what = f"the {worst['collective'] or 'collective'}" if worst["instances"] == 1 else \
            f"{worst['instances']} collectives ({worst['collective'] or 'collective'} and others)"
        spread = _range(worst["min_wait_ns"], worst["max_wait_ns"])
        message = (
            f"{late_text} arrived late at {what} in {when}: {ranks_phrase(worst['waiting_ranks'])} waited "
            f"{spread} for {'them' if len(late) > 1 else 'it'} ({duration(worst['caused_wait_ns'])} in all, "
            f"{_of_their_steps(basis_of(results), worst['caused_wait_ns'], len(worst['waiting_ranks']))}); "
            + _where(worst, late_text))
        if partial:
            message += (f". Only {worst['traced_ranks']} of the group's {worst['group_size']} ranks were traced: "
                        "the rank everyone waited for may be one that was not")
        stake = round(sum(r["max_wait_ns"] for r in rows) / max(result.profiled_steps, 1))
        yield Finding(
            Severity.INFO if partial else Severity.WARNING,
            "comm.late_rank",
            message,
            {"late_ranks": list(late), "waiting_ranks": worst["waiting_ranks"], "steps": steps, "step": worst["step"],
             "collective": worst["collective"], "pg_name": worst["pg_name"], "instances": worst["instances"],
             "caused_wait_ns": worst["caused_wait_ns"], "max_wait_ns": worst["max_wait_ns"],
             "min_wait_ns": worst["min_wait_ns"],
             "caused_wait_pct": round(100 * worst["caused_wait_ns"] / worst["waiting_step_ns"], 2),
             "late_arrival_ms": round((worst["late_arrival_ns"] - result.run_start_ns) / 1e6, 3),
             "first_arrival_ms": round((worst["first_arrival_ns"] - result.run_start_ns) / 1e6, 3),
             "lateness_ns": worst["lateness_ns"], "entry_gap_ns": worst["entry_gap_ns"],
             "in_step_ns": worst["in_step_ns"], "origin": worst["origin"], "cause": worst["cause"],
             "cause_part": worst["cause_part"], "cause_excess_ns": worst["cause_excess_ns"],
             "origins": [r["origin"] for r in sorted(rows, key=lambda r: r["step"])],
             "traced_ranks": worst["traced_ranks"], "group_size": worst["group_size"]},
            ranks=late,
            time_at_stake_ns=stake,
        )
