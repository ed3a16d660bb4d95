"""Is a trace already in the run, or does it collide with one there? And the commit that decides.

Two copies of one trace (``.json`` and ``.json.gz``, or re-indented) have different sha256s; stored
both, they doubled the rank's rows and the summary failed on the overlap. So every trace also
gets a content hash: the sha256 of its decompressed JSON with all whitespace outside strings
removed (``msgspec.json.format(text, indent=-1)``, one C pass, ~0.1 s on 54 MB), stored beside the
file's sha256 in ``sources.content_sha256``. A trace whose content is already in the run is
skipped like an identical file.

Two *different* traces of one rank whose time ranges overlap cannot both be that rank (they are two
recordings); the second is refused with a line naming both files. Disjoint ones are kept: the
collector writes one trace per profiling cycle of a rank into one run.

Concurrent ingests may both find nothing stored and both convert; the decision is therefore taken
again at commit, under a lock on the store (``commit_lock``), before the ``sources`` row is
written, so that exactly one copy becomes visible.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import msgspec
import pyarrow.parquet as pq

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; concurrent ingests of one run are not guarded
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".commit.lock"
"""The lock file at the store's root (a dot file: Parquet readers and the store's globs skip it)."""

_COLUMNS = ("source", "path", "content_sha256", "trace_start_ns", "trace_end_ns")


def content_sha256(text: bytes) -> str:
    """sha256 of the JSON text with whitespace outside strings removed (``text`` must parse)."""
    return hashlib.sha256(msgspec.json.format(text, indent=-1)).hexdigest()


@dataclass(frozen=True)
class StoredTrace:
    """What the store knows of one committed trace of a run."""

    source: str
    rank: int
    path: str | None
    content_sha256: str | None
    start_ns: int | None
    end_ns: int | None


def _rows(part: Path) -> list[dict[str, object]]:
    """The columns ``StoredTrace`` needs from one ``sources`` part (null where the part predates
    a column). ``ParquetFile`` rather than a dataset: ``pyarrow.dataset`` costs 0.2 s to import."""
    handle = pq.ParquetFile(part)
    present = [c for c in _COLUMNS if c in handle.schema_arrow.names]
    return [{c: row.get(c) for c in _COLUMNS} for row in handle.read(columns=present).to_pylist()]


def stored_traces(root: Path, run: str) -> list[StoredTrace]:
    """The committed traces of ``run``: its ``sources`` rows."""
    found = []
    for part in sorted((root / "sources" / f"run={run}").glob("rank=*/part-*.parquet")):
        rank = int(part.parent.name.removeprefix("rank="))
        found += [StoredTrace(r["source"], rank, r["path"], r["content_sha256"], r["trace_start_ns"],
                              r["trace_end_ns"]) for r in _rows(part)]
    return found


def same_trace(stored: list[StoredTrace], source: str, content: str) -> StoredTrace | None:
    """The stored copy of this trace: the same file (source) or the same content, if any."""
    return next((t for t in stored if t.source == source), None) or next(
        (t for t in stored if t.content_sha256 == content), None)


def overlapping(stored: list[StoredTrace], rank: int, start_ns: int | None,
                end_ns: int | None) -> StoredTrace | None:
    """A stored trace of the same rank whose time range overlaps ``[start_ns, end_ns]`` (ranges
    that only touch do not overlap)."""
    if start_ns is None or end_ns is None:
        return None
    return next((t for t in stored if t.rank == rank and t.start_ns is not None and t.end_ns is not None
                 and t.start_ns < end_ns and start_ns < t.end_ns), None)


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
