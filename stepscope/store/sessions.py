"""Two recordings of one rank are two sessions: they go to two runs, never pooled into one.

The kineto ResNet-50 samples hold two ``worker0`` files recorded 4.5 minutes apart by two
processes; ingested as one run they became one rank whose GPU span covered both recordings and
the gap between them (99.7% "idle"), with the steps of both pooled. A collector writing several
profiling cycles of one process into one run is the legitimate case that must stay one run.

Two traces of one rank (however its rank was decided) are **one session** unless one of these
says otherwise, checked in this order:

- they share a ``ProfilerStep`` number (one process numbers its steps once: a repeated number
  is a new profiler, a new process, a rerun);
- both name their process (``sources.process_id``, the pid most host events carry) and the pids
  differ (one rank is one process);
- neither names its process and they are far apart in time: the gap between them exceeds both
  ``FAR_APART_NS`` and ``FAR_APART_SPANS`` times the longer trace.

(Traces that overlap in time are not two sessions but a conflict, refused in ``ingest``.)

A trace of another job than the run's ranks (another world size, device model, or recorded
further from them than the run's span plus a day: ``jobs``) is placed the same way, before any
rank is compared: a run holds one job.

A trace that is another session of a rank the run holds goes to the first of the runs
``<run>-session2``, ``<run>-session3``, ... whose trace of that rank (if any) is of its session,
so the ranks of a second recording of a whole job gather in one run of their own. That run's job
must be the trace's too.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from stepscope.store import dedupe, jobs

FAR_APART_NS = 60 * 10**9
"""Traces of one rank with unknown processes this far apart (and ``FAR_APART_SPANS`` times their
length) are two recordings."""
FAR_APART_SPANS = 10
SESSION_SUFFIX = "-session"


@dataclass(frozen=True)
class NewTrace:
    """What the rules compare of the trace being committed."""

    rank: int
    source: str
    start_ns: int | None
    end_ns: int | None
    process_id: int | None
    steps: frozenset[int]
    path: str | None = None
    world_size: int | None = None
    gpu_name: str | None = None

    @property
    def job_facts(self) -> jobs.Candidate:
        """What the job rules compare of it."""
        return jobs.Candidate(self.rank, self.source, self.path, self.world_size, self.gpu_name,
                              self.start_ns, self.end_ns)


@dataclass(frozen=True)
class Placement:
    """Where a trace goes: ``run`` (the run asked for, or a session run of it); ``same`` is the
    stored copy when it is already there; ``clash`` a trace of its rank it overlaps in the run
    asked for; ``other``/``reason`` the trace that made it another session (``kind``
    "session") or another job ("job"), and why."""

    run: str
    same: dedupe.StoredTrace | None = None
    clash: dedupe.StoredTrace | None = None
    other: dedupe.StoredTrace | None = None
    reason: str | None = None
    kind: str = "session"


def session_run(run: str, number: int) -> str:
    """The run id of session ``number`` of ``run`` (1 is the run itself)."""
    return run if number == 1 else f"{run}{SESSION_SUFFIX}{number}"


def _steps_text(steps: frozenset[int]) -> str:
    ordered = sorted(steps)
    return ", ".join(map(str, ordered[:5])) + (", ..." if len(ordered) > 5 else "")


def _gap_ns(a_start: int, a_end: int, b_start: int, b_end: int) -> int:
    return max(b_start - a_end, a_start - b_end, 0)


def other_session(root: Path, new: NewTrace, stored: dedupe.StoredTrace) -> str | None:
    """Why ``new`` and ``stored`` (one rank) are two recordings; None when they are one session."""
    shared = new.steps & dedupe.stored_steps(root, stored)
    if shared:
        return f"both hold step {_steps_text(shared)}"
    if new.process_id is not None and stored.process_id is not None:
        if new.process_id != stored.process_id:
            return f"recorded by another process (pid {new.process_id}, the stored one pid {stored.process_id})"
        return None
    if None in (new.start_ns, new.end_ns, stored.start_ns, stored.end_ns):
        return None
    gap = _gap_ns(new.start_ns, new.end_ns, stored.start_ns, stored.end_ns)
    longest = max(new.end_ns - new.start_ns, stored.end_ns - stored.start_ns)
    if gap > FAR_APART_NS and gap > FAR_APART_SPANS * longest:
        return f"recorded {gap / 60e9:.1f} min apart"
    return None


def place(root: Path, run: str, content: str, new: NewTrace) -> Placement:
    """Decide which run ``new`` is committed to (call under the commit lock)."""
    first_other: tuple[dedupe.StoredTrace, str, str] | None = None
    for number in itertools.count(1):
        candidate = session_run(run, number)
        same = dedupe.same_trace(root, candidate, new.source, content)
        if same is not None:
            return Placement(candidate, same=same)
        if number > 1 and not (root / "sources" / f"run={candidate}").is_dir():
            other, reason, kind = first_other if first_other else (None, None, "session")
            return Placement(candidate, other=other, reason=reason, kind=kind)
        foreign = jobs.conflict(root, candidate, new.job_facts)
        if foreign is not None:
            fact, reason = foreign
            first_other = first_other or (dedupe.StoredTrace(fact.source, fact.rank, fact.path, None, None,
                                                             run=candidate), reason, "job")
            continue
        fits = True
        for stored in dedupe.rank_traces(root, candidate, new.rank):
            if stored.source == new.source:
                continue
            if dedupe.overlaps(stored, new.start_ns, new.end_ns):
                if number == 1:
                    return Placement(candidate, clash=stored)
                fits = False
                break
            reason = other_session(root, new, stored)
            if reason is not None:
                first_other = first_other or (stored, reason, "session")
                fits = False
                break
        if fits:
            other, reason, kind = first_other if number > 1 and first_other else (None, None, "session")
            return Placement(candidate, other=other, reason=reason, kind=kind)
    raise AssertionError("unreachable")
