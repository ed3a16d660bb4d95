"""Is a trace already in the run, or does it collide with one there? And the commit that decides.

Two copies of one trace (``.json`` and ``.json.gz``, or re-indented) have different sha256s; stored
both, they doubled the rank's rows and the summary failed on the overlap. So every trace also
gets a content hash: the sha256 of its decompressed JSON with all whitespace outside strings
removed (what ``msgspec.json.format(text, indent=-1)`` gives; computed piece by piece as the text
streams through, ``split.py``), stored beside the file's sha256 in ``sources.content_sha256``. A trace whose content is already in the run is
skipped like an identical file.

Two *different* traces of one rank whose time ranges overlap cannot both be that rank (they are two
recordings); the second is refused with a line naming both files. Disjoint ones are kept: the
collector writes one trace per profiling cycle of a rank into one run.

Concurrent ingests may both find nothing stored and both convert; the decision is therefore taken
again at commit, under a lock on the store (``commit_lock``), before the ``sources`` row is
written, so that exactly one copy becomes visible.

The checks cost what one rank holds, not what the run holds (a 1,024-rank job commits 1,024 traces
at once, each under the lock): the same file is a name lookup per rank folder, the same content a
lookup in the run's content index (``<store>/.content/run=<run>/<content_sha256>``, holding the rank
and source of the committed copy, written after its ``sources`` row and believed only while that
row exists), and the overlap check reads only the ``sources`` parts of the trace's own rank.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from stepscope.store.atomic import write_text_atomic
from stepscope.store.engine import scratch
from stepscope.store.writer import part_path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; concurrent ingests of one run are not guarded
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".commit.lock"
"""The lock file at the store's root (a dot file: Parquet readers and the store's globs skip it)."""

INDEX_NAME = ".content"
"""The content index folder at the store's root: one small file per committed trace."""


@dataclass(frozen=True)
class StoredTrace:
    """What the store knows of one committed trace of a run."""

    source: str
    rank: int
    path: str | None
    start_ns: int | None
    end_ns: int | None
    process_id: int | None = None
    run: str = ""


def _rows(part: Path) -> list[dict[str, object]]:
    """The rows of one small part (DuckDB: no pyarrow import in an ingest)."""
    cursor = scratch()
    try:
        cursor.execute("SELECT * FROM read_parquet(?)", [str(part)])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]
    finally:
        cursor.close()


def _read(part: Path, rank: int) -> list[StoredTrace]:
    """The traces one ``sources`` part commits. Columns a store of an older schema version lacks
    read as null."""
    run = part.parent.parent.name.removeprefix("run=")
    return [StoredTrace(r["source"], rank, r["path"], r["trace_start_ns"], r["trace_end_ns"],
                        r.get("process_id"), run) for r in _rows(part)]


def rank_traces(root: Path, run: str, rank: int) -> list[StoredTrace]:
    """Every committed trace of one rank of a run (it reads that rank's ``sources`` parts only)."""
    folder = part_path(root, "sources", run, rank, "x").parent
    return [t for part in sorted(folder.glob("part-*.parquet")) for t in _read(part, rank)]


def stored_steps(root: Path, trace: StoredTrace) -> frozenset[int]:
    """The ``ProfilerStep`` numbers a committed trace holds (its ``steps`` part)."""
    part = part_path(root, "steps", trace.run, trace.rank, trace.source)
    if not part.is_file():
        return frozenset()
    return frozenset(r["step"] for r in _rows(part))


def _committed(root: Path, run: str, rank: int, source: str) -> StoredTrace | None:
    part = part_path(root, "sources", run, rank, source)
    return next(iter(_read(part, rank)), None) if part.is_file() else None


def _index_entry(root: Path, run: str, content: str) -> Path:
    return root / INDEX_NAME / f"run={run}" / content


def same_trace(root: Path, run: str, source: str, content: str) -> StoredTrace | None:
    """The committed copy of this trace in ``run``: the same file (``source``) at any rank, or
    the same content in another file. None when the run holds neither."""
    for part in (root / "sources" / f"run={run}").glob(f"rank=*/part-{source}.parquet"):
        found = _committed(root, run, int(part.parent.name.removeprefix("rank=")), source)
        if found is not None:
            return found
    try:
        rank, other = _index_entry(root, run, content).read_text().split()
    except (OSError, ValueError):  # no entry (or a torn one: the trace counts as not there)
        return None
    return _committed(root, run, int(rank), other)


def overlapping(root: Path, run: str, rank: int, start_ns: int | None,
                end_ns: int | None) -> StoredTrace | None:
    """A committed trace of the same rank whose time range overlaps ``[start_ns, end_ns]``
    (ranges that only touch do not overlap)."""
    if start_ns is None or end_ns is None:
        return None
    return next((t for t in rank_traces(root, run, rank) if overlaps(t, start_ns, end_ns)), None)


def overlaps(trace: StoredTrace, start_ns: int | None, end_ns: int | None) -> bool:
    """Does ``trace`` overlap ``[start_ns, end_ns]`` in time (touching is not overlapping)?"""
    return (None not in (trace.start_ns, trace.end_ns, start_ns, end_ns)
            and trace.start_ns < end_ns and start_ns < trace.end_ns)


def record_content(root: Path, run: str, content: str, rank: int, source: str) -> None:
    """Enter a just committed trace in the run's content index (atomically)."""
    write_text_atomic(_index_entry(root, run, content), f"{rank} {source}\n")


@contextlib.contextmanager
def commit_lock(root: Path) -> Iterator[None]:
    """Hold the store's commit lock (an exclusive ``flock``); commits are short, so one lock per
    store is enough and waiting on it is brief."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
