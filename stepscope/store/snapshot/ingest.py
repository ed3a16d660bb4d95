"""Ingest a memory snapshot pickle: its four tables, then its ``sources`` row, which commits it.

A snapshot is one rank's allocator state, not a trace: its ``sources`` row says so in
``metadata`` (``{"input": "memory_snapshot", ...}``), has no time range and no process, so it
never clashes with, nor splits a session from, the traces of its rank (``store.sessions``), and
the same file ingested twice into a run is skipped like a trace (``store.dedupe``, by the file's
sha256). Its rank comes from ``--rank``, else from the file name (``rank-3``), else its position
in the batch.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from stepscope.errors import StoreWriteError, TraceFormatError
from stepscope.store import dedupe, schema
from stepscope.store.constants import SOURCES_COLUMNS
from stepscope.store.location import is_url
from stepscope.store.snapshot.reader import read_snapshot
from stepscope.store.snapshot.tables import snapshot_tables
from stepscope.store.writer import remove_uncommitted, run_id, write_partition

INPUT_KIND = "memory_snapshot"
"""``metadata.input`` of a snapshot's ``sources`` row: what tells it from a trace."""
TABLES = tuple(name for name, _, _ in schema.SNAPSHOT_TABLES)


def _sources_row(path: Path, source: str, run_name: str, rank_from: str, sha256: str, file_bytes: int,
                 events: int, snapshot: dict[str, Any], tags: dict[str, str] | None) -> dict[str, Any]:
    settings = snapshot.get("allocator_settings")
    metadata = {"input": INPUT_KIND, "allocator_settings": settings if isinstance(settings, dict) else None}
    row: dict[str, Any] = {name: None for name, _, _ in SOURCES_COLUMNS}
    row.update(source=source, run_name=run_name, path=str(path), sha256=sha256, content_sha256=sha256,
               file_bytes=file_bytes, rank_from=rank_from, event_count=events,
               metadata=json.dumps(metadata, sort_keys=True, default=str),
               tags=json.dumps(tags, sort_keys=True) if tags else None,
               ingested_at=dt.datetime.now(dt.timezone.utc))
    return row


@dataclass(frozen=True)
class StoredSnapshot:
    """What ingesting one snapshot did: its ``source`` id, its history's length, and whether
    the run held it already (then nothing was written)."""

    source: str
    events: int
    skipped: bool


def ingest_snapshot(path: str | Path, store: str | Path, run: str, *, rank: int, rank_from: str,
                    source_of: Callable[[str], str], tags: dict[str, str] | None = None) -> StoredSnapshot:
    """Read, convert and commit one snapshot file as rank ``rank`` of ``run``; ``source_of``
    turns the file's sha256 into its source id (the traces' rule, ``store.ingest``). Raises
    ``TraceFormatError`` on a file that is not a readable snapshot (nothing is written then),
    ``StoreWriteError`` when the store cannot be written (what was written is removed)."""
    if is_url(store):
        raise TraceFormatError(path, "memory snapshots go into a local store folder only, for now")
    path, root, rid = Path(path), Path(store), run_id(run)
    read = read_snapshot(path)
    sha256, source, events = read.sha256, source_of(read.sha256), len(read.history)
    if dedupe.same_trace(root, rid, source, sha256) is not None:
        return StoredSnapshot(source, 0, skipped=True)
    try:
        tables = snapshot_tables(read, source)
    except (TypeError, ValueError, OverflowError, pa.ArrowException) as exc:
        raise TraceFormatError(path, f"not a memory snapshot ({exc})") from exc
    row = _sources_row(path, source, run, rank_from, sha256, read.file_bytes, events, read.snapshot, tags)
    del read
    try:
        for name, table in tables.items():
            write_partition(root, name, rid, rank, source, table)
        with dedupe.commit_lock(root):
            if dedupe.same_trace(root, rid, source, sha256) is not None:
                return StoredSnapshot(source, 0, skipped=True)  # a copy committed meanwhile
            write_partition(root, "sources", rid, rank, source, pa.Table.from_pylist([row], schema=schema.SOURCES))
            with contextlib.suppress(OSError):
                dedupe.record_content(root, rid, sha256, rank, source)
    except OSError as exc:
        remove_uncommitted(root, TABLES, rid, rank, source)
        raise StoreWriteError(path, root, exc) from exc
    except BaseException:
        remove_uncommitted(root, TABLES, rid, rank, source)
        raise
    return StoredSnapshot(source, events, skipped=False)
