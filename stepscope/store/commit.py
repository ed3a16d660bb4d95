"""The commit of one converted trace into a store folder: the step that makes its rows visible.

A conversion (``ingest.convert_file``) writes a trace's parts, invisible until its ``sources``
row exists. ``commit_trace`` then decides, under the store's commit lock (``dedupe``), whether
the trace is already in the run, clashes with a stored one, or is another session of a rank or
of another job than the run's ranks (``sessions``, ``jobs``), and writes that row. A store on
object storage commits in a local copy of its commit state (``remote_commit``), through the same
function.

This module sits below ``ingest`` (which converts and batches) and above the rules it applies
(``dedupe``, ``sessions``) and the location the parts are in (``writer``, ``location``); it
imports none of ``ingest``, so the layers stay one way (``tests/test_layering.py``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import duckdb

from stepscope.errors import StoreError, StoreWriteError, TraceFormatError, UsageError
from stepscope.store import dedupe, engine, jobs, rankstats, sessions
from stepscope.store.constants import DUCKDB_TYPES, SOURCES_COLUMNS
from stepscope.store.convert import Conversion, SqlPart
from stepscope.store.writer import move_part, remove_uncommitted, write_partition

PARTS = ("events", "steps", "memory", *(t.name for t in rankstats.TABLES))
"""The tables a trace's conversion writes before its ``sources`` row commits them: its events,
steps and memory, then each rank's answers computed from them (``stepscope.store.rankstats``)."""
ON_CONFLICT = ("session", "refuse")
"""What ingest does with another recording (session) of a rank the run holds, or with a trace of
another job than the run's ranks (``jobs``): store it as a run of its own, or refuse it."""
INTERNAL_ERROR_CHARS = 300
"""An unexpected exception's text is cut to this length in its one line."""


@dataclass(frozen=True)
class IngestedTrace:
    """What happened to one file: stored, or skipped because the same trace was already there.

    ``same_as`` is the path of the stored copy when it is another file with the same content;
    ``note`` says why a trace went to another run than the one asked for (another session).
    """

    path: str
    run: str
    rank: int
    rank_from: str
    source: str
    events: int
    skipped: bool
    same_as: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class ConvertedTrace:
    """One file converted, its parts written into the store but not yet committed."""

    path: str
    run: str
    run_name: str
    rank: int
    rank_from: str
    source: str
    content_sha256: str
    conversion: Conversion
    sources_row: dict[str, Any]


def remove_parts(root: Path, run: str, rank: int, source: str) -> None:
    """Remove a trace's uncommitted parts, unless a committed copy of the same file owns them."""
    remove_uncommitted(root, PARTS, run, rank, source)


class LocalParts:
    """A trace's uncommitted parts in a local store folder: moved to another run, or removed."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def move(self, run: str, rank: int, source: str, to_run: str) -> None:
        for table in PARTS:
            move_part(self.root, table, run, rank, source, to_run)

    def remove(self, run: str, rank: int, source: str) -> None:
        remove_parts(self.root, run, rank, source)


def commit_trace(converted: ConvertedTrace, root: Path, *, on_conflict: str = "session",
                 parts: LocalParts | None = None) -> IngestedTrace:
    """Make a converted trace visible in the store folder ``root``: under the commit lock, skip
    it when the run already holds it, refuse it when it overlaps a different trace of its rank,
    place it in a run of its own when it is another session of its rank or of another job than
    the run's ranks (or refuse that, ``on_conflict="refuse"``), and write its ``sources`` row.
    ``parts`` holds the trace's parts when they are elsewhere than in ``root`` (a store on object
    storage commits in a local copy of its ``sources``: ``remote_commit``)."""
    if on_conflict not in ON_CONFLICT:
        raise UsageError(f"on_conflict must be one of {', '.join(ON_CONFLICT)}, not {on_conflict!r}")
    parts = parts or LocalParts(root)
    c = converted
    new = sessions.NewTrace(c.rank, c.source, c.conversion.start_ns, c.conversion.end_ns,
                            c.conversion.main_pid, frozenset(c.conversion.steps),
                            path=c.path, world_size=c.sources_row.get("world_size"),
                            gpu_name=c.sources_row.get("gpu_name"))
    parts_in = c.run  # where the trace's uncommitted parts are
    try:
        with dedupe.commit_lock(root):
            placed = checked(sessions.place, root, c.run, c.content_sha256, new)
            refusal = _refusal(c, placed, on_conflict)
            if placed.same is None and refusal is None:
                if placed.run != c.run:
                    parts.move(c.run, c.rank, c.source, placed.run)
                    parts_in = placed.run
                run_name = c.run_name if placed.run == c.run else placed.run
                row = {**c.sources_row, "run_name": run_name, "ingested_at": dt.datetime.now(dt.timezone.utc)}
                write_partition(root, "sources", placed.run, c.rank, c.source, _sources_part(c.path, row))
                with contextlib.suppress(OSError):  # committed already: a missing index entry
                    # only lets a copy in another file through later, never loses this one
                    dedupe.record_content(root, placed.run, c.content_sha256, c.rank, c.source)
                with contextlib.suppress(OSError):  # likewise: a job record without this trace
                    # only loosens the job rule (jobs.py), never refuses a trace of the job
                    jobs.record_job(root, placed.run, new.job_facts)
                return IngestedTrace(c.path, placed.run, c.rank, c.rank_from, c.source,
                                     c.conversion.event_count, skipped=False, note=_session_note(c, placed))
    except OSError as exc:
        parts.remove(parts_in, c.rank, c.source)
        raise StoreWriteError(c.path, root, exc) from exc
    except BaseException:  # an interrupt, a bug: the uncommitted parts go too
        parts.remove(parts_in, c.rank, c.source)
        raise
    if placed.same is None or placed.same.source != c.source:  # the parts are ours alone
        parts.remove(c.run, c.rank, c.source)
    if placed.same is not None:
        return skipped_trace(c.path, placed.run, placed.same, c.source, c.rank, c.rank_from)
    raise refusal


def _sources_part(path: str, row: dict[str, Any]) -> SqlPart:
    """The ``sources`` row, written by DuckDB with the types of ``SOURCES_COLUMNS`` (the one
    definition of the table; no pyarrow or pandas in a commit)."""
    select = ", ".join(f"CAST(${name} AS {DUCKDB_TYPES[kind]}) AS {name}" for name, kind, _ in SOURCES_COLUMNS)
    return SqlPart(engine.scratch(), Path(path), f"SELECT {select}", {name: row[name] for name, _, _ in SOURCES_COLUMNS})


def _refusal(c: ConvertedTrace, placed: sessions.Placement, on_conflict: str) -> TraceFormatError | None:
    """The line that refuses the trace, or None when it is committed as ``placed`` says."""
    if placed.clash is not None:
        return TraceFormatError(c.path, f"a different trace, {placed.clash.path}, is already stored as rank "
                                        f"{c.rank} of run {c.run} and overlaps it in time; not stored (ingest "
                                        "it into another run, or as another rank)")
    if placed.other is not None and on_conflict == "refuse" and placed.kind == "job":
        return TraceFormatError(c.path, f"not of the job of run {placed.other.run}'s ranks ({placed.reason}); "
                                        "not stored (--on-conflict session stores it as a run of its own)")
    if placed.other is not None and on_conflict == "refuse":
        return TraceFormatError(c.path, f"another recording of rank {c.rank}: run {placed.other.run} holds "
                                        f"{placed.other.path}, and they are two sessions ({placed.reason}); "
                                        "not stored (--on-conflict session stores it as a run of its own)")
    return None


def _session_note(c: ConvertedTrace, placed: sessions.Placement) -> str | None:
    if placed.run == c.run or placed.other is None:
        return None
    if placed.kind == "job":
        return f"not of the job of run {placed.other.run}'s ranks ({placed.reason}): stored as run {placed.run}"
    return (f"another recording of rank {c.rank} (run {placed.other.run} holds {placed.other.path}; "
            f"{placed.reason}): stored as run {placed.run}")


def checked(check: Callable[..., Any], root: Path, run: str, *args: Any) -> Any:
    """Run a store check; a store whose committed parts cannot be read is a ``StoreError``."""
    try:
        return check(root, run, *args)
    except (OSError, duckdb.Error) as exc:
        raise StoreError(f"{root}: cannot read the traces stored in run {run} ({exc})") from exc


def skipped_trace(path: str | Path, run: str, same: dedupe.StoredTrace, source: str, rank: int,
                  how: str) -> IngestedTrace:
    """The outcome of a file whose trace ``same`` the run already holds."""
    if same.source == source:
        return IngestedTrace(str(path), run, rank, how, source, 0, skipped=True)
    return IngestedTrace(str(path), run, same.rank, how, same.source, 0, skipped=True, same_as=same.path)


def problem_line(file: Path, exc: BaseException) -> str:
    """The one line that says why ``file`` was not stored."""
    if isinstance(exc, (TraceFormatError, StoreWriteError)):  # their messages start with the file
        return " ".join(str(exc).split())
    if isinstance(exc, StoreError):
        return f"{file}: {exc}"
    if isinstance(exc, MemoryError):
        return f"{file}: out of memory while converting"
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    if len(text) > INTERNAL_ERROR_CHARS:
        text = text[: INTERNAL_ERROR_CHARS - 3] + "..."
    return f"{file}: internal error ({text})"
