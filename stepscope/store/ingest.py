"""Ingest Kineto trace files into a store: decode, convert, write atomically, commit.

One path for offline files (``stepscope ingest``) and for the collector's live traces, so both
get the same parser, the same rank rules and the same deduplication.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import pyarrow as pa

from stepscope.errors import StoreError, StoreWriteError, TraceFormatError, UsageError
from stepscope.store import dedupe, schema, trace_metadata
from stepscope.store.convert import TraceTables, convert
from stepscope.store.files import select_trace_files
from stepscope.store.kineto import RawTrace, decode
from stepscope.store.schema import INT64_MAX, INT64_MIN
from stepscope.store.writer import part_path, run_id, write_partition

RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)(?![0-9])", re.IGNORECASE)
SOURCE_DIGITS = 16
PARTS = ("events", "steps", "memory")
"""The tables a trace's conversion writes before its ``sources`` row commits them."""
INTERNAL_ERROR_CHARS = 300
"""An unexpected exception's text is cut to this length in its one line."""


@dataclass(frozen=True)
class IngestedTrace:
    """What happened to one file: stored, or skipped because the same trace was already there.

    ``same_as`` is the path of the stored copy when it is another file with the same content.
    """

    path: str
    run: str
    rank: int
    rank_from: str
    source: str
    events: int
    skipped: bool
    same_as: str | None = None


@dataclass
class IngestReport:
    """Outcome of a batch: the files stored or skipped, and one error line per refused file."""

    run: str
    stored: list[IngestedTrace] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


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


DEVICE_FIELDS = {"gpu_memory_bytes": "deviceProperties totalGlobalMem",
                 "gpu_sm_count": "deviceProperties numSms", "gpu_count": "deviceProperties count"}
"""Where each integer device fact of ``sources`` comes from, to name it when it is refused."""


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


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int_or_none(value: Any, what: str, path: str) -> int | None:
    """An integer fact of the trace for its ``sources`` row; any other JSON type is not recorded
    (null), an integer int64 cannot hold is refused."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    if not INT64_MIN <= value <= INT64_MAX:
        raise TraceFormatError(path, schema.out_of_range(what, value))
    return value


def _sources_row(trace: RawTrace, source: str, run_name: str, rank_from: str, tables: Any,
                 metadata: dict[str, Any] | None, tags: dict[str, str] | None) -> pa.Table:
    dist = trace.distributed_info
    devices = _device_facts(trace, tables.main_device)
    recorded = dict(trace.metadata)
    if trace_metadata.KEY in recorded:
        recorded[trace_metadata.KEY] = trace_metadata.decode(recorded[trace_metadata.KEY])
    row = {
        "source": source,
        "run_name": run_name,
        "path": trace.path,
        "sha256": trace.sha256,
        "content_sha256": trace.content_sha256,
        "file_bytes": trace.file_bytes,
        "ingested_at": dt.datetime.now(dt.timezone.utc),
        "rank_from": rank_from,
        "trace_schema_version": trace.schema_version,
        "trace_start_ns": tables.start_ns,
        "trace_end_ns": tables.end_ns,
        "event_count": tables.events.num_rows,
        "backend": _str_or_none(dist.get("backend")),
        "world_size": _int_or_none(dist.get("world_size"), "distributedInfo.world_size", trace.path),
        "gpu_name": _str_or_none(devices.pop("gpu_name")),
        **{k: _int_or_none(v, DEVICE_FIELDS[k], trace.path) for k, v in devices.items()},
        "device_properties": _json_or_none(trace.device_properties),
        "distributed_info": _json_or_none(dist),
        "metadata": _json_or_none({**recorded, **(metadata or {})}),
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
    """Ingest one trace file as one rank of ``run``.

    Raises ``TraceFormatError`` on bad input (and when a different trace of the same rank with an
    overlapping time range is stored), ``StoreWriteError`` when the store cannot be written.
    ``rank`` overrides the trace's own (the collector knows it); otherwise distributedInfo, the
    file name, then ``position`` decide. Rows become visible only when the ``sources`` row, written
    last under the commit lock, lands; a trace already in the run (same file or same content) is
    skipped.
    """
    root = Path(store)
    rid = run_id(run)
    trace = decode(path)
    source = source_id(trace.sha256)
    if rank is not None:
        resolved, how = int(rank), rank_from or "option"
    else:
        resolved, how = resolve_rank(trace, position)
    same = _checked(dedupe.same_trace, root, rid, source, trace.content_sha256)
    if same is not None:
        return _skipped(path, rid, same, source, resolved, how)
    tables = convert(trace, source, progress)
    del trace.events[:]
    same, clash = _conflicts(root, rid, source, trace.content_sha256, resolved, tables)
    if clash is not None:
        # A commit in progress shows its sources part before its content-index entry: decide a
        # clash under the lock, where every commit is whole (it may be this very trace).
        with dedupe.commit_lock(root):
            same, clash = _conflicts(root, rid, source, trace.content_sha256, resolved, tables)
    if same is not None:
        return _skipped(path, rid, same, source, resolved, how)
    if clash is not None:
        raise _overlap_error(path, rid, clash, resolved)
    try:
        for table in PARTS:
            write_partition(root, table, rid, resolved, source, getattr(tables, table))
        with dedupe.commit_lock(root):
            # Decided again under the lock: another ingest may have committed this trace, or a
            # clashing one, since the checks above.
            same, clash = _conflicts(root, rid, source, trace.content_sha256, resolved, tables)
            if same is None and clash is None:
                write_partition(root, "sources", rid, resolved, source,
                                _sources_row(trace, source, run, how, tables, metadata, tags))
                with contextlib.suppress(OSError):  # committed already: a missing index entry
                    # only lets a copy in another file through later, never loses this one
                    dedupe.record_content(root, rid, trace.content_sha256, resolved, source)
                return IngestedTrace(str(path), rid, resolved, how, source, tables.events.num_rows,
                                     skipped=False)
        if same is None or same.source != source:  # the parts just written are ours alone
            for table in PARTS:
                part_path(root, table, rid, resolved, source).unlink(missing_ok=True)
    except OSError as exc:
        raise StoreWriteError(path, root, exc) from exc
    if same is not None:
        return _skipped(path, rid, same, source, resolved, how)
    raise _overlap_error(path, rid, clash, resolved)


def _conflicts(root: Path, run: str, source: str, content: str, rank: int, tables: TraceTables
               ) -> tuple[dedupe.StoredTrace | None, dedupe.StoredTrace | None]:
    """``(the stored copy of this trace, a different stored trace it overlaps)``; at most one."""
    same = _checked(dedupe.same_trace, root, run, source, content)
    if same is not None:
        return same, None
    return None, _checked(dedupe.overlapping, root, run, rank, tables.start_ns, tables.end_ns)


def _checked(check: Callable[..., dedupe.StoredTrace | None], root: Path, run: str,
             *args: Any) -> dedupe.StoredTrace | None:
    """Run a ``dedupe`` check; a store whose committed parts cannot be read is a ``StoreError``."""
    try:
        return check(root, run, *args)
    except (OSError, pa.ArrowException) as exc:
        raise StoreError(f"{root}: cannot read the traces stored in run {run} ({exc})") from exc


def _skipped(path: str | Path, run: str, same: dedupe.StoredTrace, source: str, rank: int,
             how: str) -> IngestedTrace:
    if same.source == source:
        return IngestedTrace(str(path), run, rank, how, source, 0, skipped=True)
    return IngestedTrace(str(path), run, same.rank, how, same.source, 0, skipped=True, same_as=same.path)


def _overlap_error(path: str | Path, run: str, clash: dedupe.StoredTrace | None, rank: int
                   ) -> TraceFormatError:
    other = clash.path if clash is not None else "another trace"
    return TraceFormatError(path, f"a different trace, {other}, is already stored as rank {rank} of "
                                  f"run {run} and overlaps it in time; not stored (ingest it into "
                                  "another run, or as another rank)")


def _ingest_one(file: Path, store: str | Path, run: str, position: int,
                tags: dict[str, str] | None) -> IngestedTrace | str:
    """One file of a batch: what was stored, or the one line that says why not. Whatever goes
    wrong stays with this file; only an interrupt (Ctrl-C) stops the batch."""
    try:
        return ingest_trace_file(file, store, run, position=position, tags=tags)
    except (TraceFormatError, StoreWriteError) as exc:  # their messages start with the file
        return " ".join(str(exc).split())
    except StoreError as exc:
        return f"{file}: {exc}"
    except MemoryError:
        return f"{file}: out of memory while converting"
    except Exception as exc:  # noqa: BLE001 - a bug must cost one file, not the batch
        text = " ".join(f"{type(exc).__name__}: {exc}".split())
        if len(text) > INTERNAL_ERROR_CHARS:
            text = text[: INTERNAL_ERROR_CHARS - 3] + "..."
        return f"{file}: internal error ({text})"


def ingest_paths(
    paths: Iterable[str | Path],
    store: str | Path,
    run: str | None = None,
    *,
    tags: dict[str, str] | None = None,
    on_selected: Callable[[list[Path]], None] | None = None,
    on_file: Callable[[Path], None] | None = None,
    on_done: Callable[[IngestedTrace | str], None] | None = None,
) -> IngestReport:
    """Ingest files and folders as the ranks of one run. Bad files are reported, not fatal.

    Every readable file of the batch is tried; ``report.errors`` holds one ``<file>: <problem>``
    line per path that was refused or could not be read (missing, a FIFO, a broken link, ...),
    and nothing already stored is touched by a refused one. ``on_selected`` gets the files found
    before any is read.
    """
    selection = select_trace_files(paths)
    if not selection.files and not selection.problems:
        raise UsageError("no trace files (*.json, *.json.gz) in the paths given")
    name = run or (default_run_name(selection.files) if selection.files else "run")
    report = IngestReport(run=run_id(name))
    if on_selected:
        on_selected(selection.files)
    for problem in selection.problems:
        report.errors.append(problem)
        if on_done:
            on_done(problem)
    for position, file in enumerate(selection.files):
        if on_file:
            on_file(file)
        outcome = _ingest_one(file, store, name, position, tags)
        if isinstance(outcome, str):
            report.errors.append(outcome)
        else:
            report.stored.append(outcome)
        if on_done:
            on_done(outcome)
    return report
