"""A run holds one job: a trace of another job is not one of its ranks.

``stepscope ingest`` of HTA's ``trace_diff/control`` (world size 8, recorded in August 2022)
into a run holding two ``trace_filter`` ranks (world size 128, April 2023) stored it as rank 3
of that run: no rank rule saw a problem (another rank, no overlap), and every cross-rank figure
then mixed two jobs. A trace is therefore of another job than the run's ranks when, both sides
knowing it:

- its world size (``distributedInfo.world_size``) differs from theirs;
- its device model (``gpu_name``) differs from theirs;
- it was recorded further from them than the run's own span plus a day (``DAY_NS``): its time
  range and the run's (earliest start to latest end) are more than that apart. Only times on
  the Unix epoch clock are dates (``DATED_FROM_NS``); a trace whose clock starts elsewhere (no
  ``baseTimeNanoseconds``, relative ``ts``) has no date to compare.

Such a trace is placed like another session (``sessions.place``: a run of its own, or refused
with ``--on-conflict refuse``).

What the run's ranks agree on is kept beside its content index, in
``<store>/.content/run=<run>/job.json`` (written under the commit lock after each commit that
changes it), so the check costs one small file, not a read of every rank: a 1,024-rank job
commits 1,024 traces. Each fact names the trace it comes from, and is believed only while that
trace is committed; a run without the file (stored before it existed, or copied without its
index) has it rebuilt from its ``sources`` rows.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from stepscope.store.atomic import write_text_atomic
from stepscope.store.dedupe import INDEX_NAME
from stepscope.store.engine import scratch
from stepscope.store.writer import part_path

DAY_NS = 86_400 * 10**9
"""How much further than the run's own span a trace of the run may have been recorded."""
DATED_FROM_NS = 946_684_800 * 10**9
"""2000-01-01 on the epoch clock: a trace starting earlier has a clock that is not a date."""
JOB_FILE = "job.json"
"""The run's job record, in its folder of the content index (whose names are sha256s)."""
FACTS = ("world_size", "gpu_name", "first", "last")


@dataclass(frozen=True)
class Fact:
    """One thing the run's ranks agree on, and the committed trace it comes from. ``value`` is
    the world size, the device model, or (``first``/``last``) the earliest dated start and the
    latest dated end, in ns."""

    value: int | str
    rank: int
    source: str
    path: str | None


@dataclass(frozen=True)
class Job:
    """What the run's ranks agree on; None where none of them knows it."""

    world_size: Fact | None = None
    gpu_name: Fact | None = None
    first: Fact | None = None
    last: Fact | None = None


@dataclass(frozen=True)
class Candidate:
    """The trace being committed, as the job rules see it."""

    rank: int
    source: str
    path: str | None
    world_size: int | None
    gpu_name: str | None
    start_ns: int | None
    end_ns: int | None


def dated(start_ns: int | None, end_ns: int | None) -> bool:
    """Are these times dates (the epoch clock), not a clock that starts elsewhere?"""
    return None not in (start_ns, end_ns) and start_ns >= DATED_FROM_NS


def with_trace(job: Job, new: Candidate) -> Job:
    """``job`` once ``new`` (of that job) is committed: facts it adds, its dates widening the run's."""
    def fact(value: int | str) -> Fact:
        return Fact(value, new.rank, new.source, new.path)

    changes: dict[str, Fact] = {}
    if job.world_size is None and new.world_size is not None:
        changes["world_size"] = fact(new.world_size)
    if job.gpu_name is None and new.gpu_name is not None:
        changes["gpu_name"] = fact(new.gpu_name)
    if dated(new.start_ns, new.end_ns):
        if job.first is None or new.start_ns < job.first.value:
            changes["first"] = fact(new.start_ns)
        if job.last is None or new.end_ns > job.last.value:
            changes["last"] = fact(new.end_ns)
    return replace(job, **changes)


def _date(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _duration(ns: int) -> str:
    days = ns / DAY_NS
    return f"{days:.1f} days" if days >= 1 else f"{ns / 3.6e12:.1f} h" if ns >= 3.6e12 else f"{ns / 1e9:.1f} s"


def differences(job: Job, new: Candidate) -> list[tuple[Fact, str]]:
    """How ``new`` differs from the run's job: each fact it contradicts, with the words that say so."""
    found = []
    if job.world_size is not None and new.world_size is not None and new.world_size != job.world_size.value:
        found.append((job.world_size, f"world size {new.world_size}, the run's {job.world_size.value} "
                                      f"({job.world_size.path})"))
    if job.gpu_name is not None and new.gpu_name is not None and new.gpu_name != job.gpu_name.value:
        found.append((job.gpu_name, f"device {new.gpu_name}, the run's {job.gpu_name.value} ({job.gpu_name.path})"))
    if job.first is not None and job.last is not None and dated(new.start_ns, new.end_ns):
        span = int(job.last.value) - int(job.first.value)
        before, after = int(job.first.value) - new.end_ns, new.start_ns - int(job.last.value)
        if max(before, after) > span + DAY_NS:
            fact, gap = (job.first, before) if before > after else (job.last, after)
            found.append((fact, f"recorded {_date(new.start_ns)}, {_duration(gap)} "
                                f"{'before' if fact is job.first else 'after'} the run's ranks "
                                f"({fact.path}, {_date(int(fact.value))}; the run spans {_duration(span)})"))
    return found


def _record_path(root: Path, run: str) -> Path:
    return root / INDEX_NAME / f"run={run}" / JOB_FILE


def _committed(root: Path, run: str, fact: Fact) -> bool:
    return part_path(root, "sources", run, fact.rank, fact.source).is_file()


def _scan(root: Path, run: str) -> Job:
    """The run's job from its ``sources`` rows (every rank's: only when it has no record)."""
    parts = sorted(str(p) for p in (root / "sources" / f"run={run}").glob("rank=*/part-*.parquet"))
    if not parts:
        return Job()
    cursor = scratch()
    try:
        cursor.execute("SELECT * FROM read_parquet(?, union_by_name = true, filename = true)", [parts])
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, row)) for row in cursor.fetchall()]
    finally:
        cursor.close()
    job = Job()
    for r in sorted(rows, key=lambda r: r["filename"]):
        rank = int(Path(r["filename"]).parent.name.removeprefix("rank="))
        job = with_trace(job, Candidate(rank, r["source"], r.get("path"), r.get("world_size"), r.get("gpu_name"),
                                        r.get("trace_start_ns"), r.get("trace_end_ns")))
    return job


def _decode(text: str) -> Job:
    data: dict[str, Any] = json.loads(text)
    return Job(**{name: Fact(**data[name]) if data.get(name) else None for name in FACTS})


def run_job(root: Path, run: str, *, rebuild: bool = False) -> Job:
    """What the ranks of ``run`` agree on: its record, else (or with ``rebuild``) its ``sources`` rows."""
    if not rebuild:
        try:
            return _decode(_record_path(root, run).read_text())
        except (OSError, ValueError, TypeError, KeyError):  # none (or torn): rebuilt below
            pass
    return _scan(root, run)


def conflict(root: Path, run: str, new: Candidate) -> tuple[Fact, str] | None:
    """The fact of ``run``'s job that ``new`` contradicts (the first) and every difference in
    words, or None when ``new`` may be one of its ranks. A record naming a trace that is no
    longer committed is rebuilt before it refuses anything."""
    found = differences(run_job(root, run), new)
    if found and not all(_committed(root, run, fact) for fact, _ in found):
        found = differences(run_job(root, run, rebuild=True), new)
    if not found:
        return None
    return found[0][0], "; ".join(words for _, words in found)


def record_job(root: Path, run: str, new: Candidate) -> None:
    """Enter a just committed trace in its run's job record, when it changes it (call under the
    commit lock, after the ``sources`` row)."""
    job = run_job(root, run)
    updated = with_trace(job, new)
    path = _record_path(root, run)
    if updated != job or not path.is_file():
        facts = {name: getattr(updated, name) for name in FACTS}
        write_text_atomic(path, json.dumps({name: asdict(f) if f else None for name, f in facts.items()},
                                           sort_keys=True) + "\n")
