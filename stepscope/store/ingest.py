"""Ingest Kineto trace files into a store: decode, convert, write atomically, commit.

One path for offline files (``stepscope ingest``) and for the collector's live traces, so both
get the same parser, the same rank rules and the same deduplication.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import pyarrow as pa

from stepscope.errors import StepscopeError, TraceFormatError, UsageError
from stepscope.store import schema
from stepscope.store.convert import convert
from stepscope.store.kineto import RawTrace, decode
from stepscope.store.writer import run_id, write_partition

TRACE_SUFFIXES = (".json", ".json.gz")
RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)(?![0-9])", re.IGNORECASE)
SOURCE_DIGITS = 16


@dataclass(frozen=True)
class IngestedTrace:
    """What happened to one file: stored, or skipped because the same bytes were already there."""

    path: str
    run: str
    rank: int
    rank_from: str
    source: str
    events: int
    skipped: bool


@dataclass
class IngestReport:
    """Outcome of a batch: the files stored or skipped, and one error line per refused file."""

    run: str
    stored: list[IngestedTrace] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def find_trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files given, plus ``*.json``/``*.json.gz`` found under folders given, sorted per folder."""
    found: list[Path] = []
    for item in paths:
        path = Path(item)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)))
        elif path.exists():
            found.append(path)
        else:
            raise UsageError(f"{path}: no such file or folder")
    return found


def rank_from_name(path: Path) -> int | None:
    """Rank written in a file name: ``rank-3``, ``rank3``, ``worker3``, ``_rank_3``."""
    match = RANK_IN_NAME.search(path.name)
    return int(match.group(1)) if match else None


def resolve_rank(trace: RawTrace, position: int) -> tuple[int, str]:
    """Rank of a trace and where it came from: distributedInfo, else file name, else position."""
    rank = trace.distributed_info.get("rank")
    if isinstance(rank, int) and rank >= 0:
        return rank, "distributedInfo"
    named = rank_from_name(Path(trace.path))
    if named is not None:
        return named, "filename"
    return position, "position"


def default_run_name(files: list[Path]) -> str:
    """A run named after the folder that holds the files (their common parent)."""
    common = Path(os.path.commonpath([str(f.resolve().parent) for f in files]))
    return common.name or "run"


def source_id(sha256: str) -> str:
    return sha256[:SOURCE_DIGITS]


def already_stored(root: Path, run: str, source: str) -> bool:
    """True when this exact file (by hash) is committed in this run, at any rank."""
    return any((root / "sources" / f"run={run}").glob(f"rank=*/part-{source}.parquet"))


def _device_facts(trace: RawTrace, main_device: int | None) -> dict[str, Any]:
    devices = trace.device_properties
    chosen = next((d for d in devices if d.get("id") == main_device), devices[0] if devices else None)
    chosen = chosen or {}
    return {
        "gpu_name": chosen.get("name"),
        "gpu_memory_bytes": chosen.get("totalGlobalMem"),
        "gpu_sm_count": chosen.get("numSms"),
        "gpu_count": len(devices) or None,
    }


def _json_or_none(value: Any) -> str | None:
    return json.dumps(value, sort_keys=True, default=str) if value else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _sources_row(trace: RawTrace, source: str, run_name: str, rank_from: str, tables: Any,
                 metadata: dict[str, Any] | None, tags: dict[str, str] | None) -> pa.Table:
    dist = trace.distributed_info
    row = {
        "source": source,
        "run_name": run_name,
        "path": trace.path,
        "sha256": trace.sha256,
        "file_bytes": trace.file_bytes,
        "ingested_at": dt.datetime.now(dt.timezone.utc),
        "rank_from": rank_from,
        "trace_schema_version": trace.schema_version,
        "trace_start_ns": tables.start_ns,
        "trace_end_ns": tables.end_ns,
        "event_count": tables.events.num_rows,
        "backend": dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        "world_size": _int_or_none(dist.get("world_size")),
        **{k: v if k == "gpu_name" else _int_or_none(v) for k, v in _device_facts(trace, tables.main_device).items()},
        "device_properties": _json_or_none(trace.device_properties),
        "distributed_info": _json_or_none(dist),
        "metadata": _json_or_none({**trace.metadata, **(metadata or {})}),
        "tags": _json_or_none(tags),
    }
    return pa.Table.from_pylist([row], schema=schema.SOURCES)


def ingest_trace_file(
    path: str | Path,
    store: str | Path,
    run: str,
    *,
    rank: int | None = None,
    rank_from: str | None = None,
    position: int = 0,
    metadata: dict[str, Any] | None = None,
    tags: dict[str, str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> IngestedTrace:
    """Ingest one trace file as one rank of ``run``. Raises ``TraceFormatError`` on bad input.

    ``rank`` overrides the trace's own (the collector knows it); otherwise distributedInfo, the
    file name, then ``position`` decide. Rows become visible only when the ``sources`` row, written
    last, lands; re-ingesting the same bytes into the same run is a no-op.
    """
    root = Path(store)
    rid = run_id(run)
    trace = decode(path)
    source = source_id(trace.sha256)
    if rank is not None:
        resolved, how = int(rank), rank_from or "option"
    else:
        resolved, how = resolve_rank(trace, position)
    if already_stored(root, rid, source):
        return IngestedTrace(str(path), rid, resolved, how, source, 0, skipped=True)
    tables = convert(trace, source, progress)
    del trace.events[:]
    write_partition(root, "events", rid, resolved, source, tables.events)
    write_partition(root, "steps", rid, resolved, source, tables.steps)
    write_partition(root, "memory", rid, resolved, source, tables.memory)
    write_partition(root, "sources", rid, resolved, source,
                    _sources_row(trace, source, run, how, tables, metadata, tags))
    return IngestedTrace(str(path), rid, resolved, how, source, tables.events.num_rows, skipped=False)


def ingest_paths(
    paths: Iterable[str | Path],
    store: str | Path,
    run: str | None = None,
    *,
    tags: dict[str, str] | None = None,
    on_file: Callable[[Path], None] | None = None,
    on_done: Callable[[IngestedTrace | str], None] | None = None,
) -> IngestReport:
    """Ingest files and folders as the ranks of one run. Bad files are reported, not fatal.

    Every file of the batch is tried; ``report.errors`` holds one ``<file>: <problem>`` line per
    refused file, and nothing already stored is touched by a refused one.
    """
    files = find_trace_files(paths)
    if not files:
        raise UsageError("no trace files (*.json, *.json.gz) in the paths given")
    name = run or default_run_name(files)
    report = IngestReport(run=run_id(name))
    for position, file in enumerate(files):
        if on_file:
            on_file(file)
        try:
            outcome: IngestedTrace | str = ingest_trace_file(file, store, name, position=position, tags=tags)
            report.stored.append(outcome)
        except TraceFormatError as exc:
            outcome = str(exc)
            report.errors.append(outcome)
        except StepscopeError:
            raise
        except MemoryError:
            outcome = f"{file}: out of memory while converting"
            report.errors.append(outcome)
        if on_done:
            on_done(outcome)
    return report
