"""Ingest Kineto trace files into a store: convert each file into its parts, then commit it.

One path for offline files (``stepscope ingest``) and for the collector's live traces, so both
get the same parser, the same rank rules and the same deduplication. Two steps:

- ``convert_file``: read one file (streamed, ``kineto``), convert its events with DuckDB
  (``convert``), and write its parts (events, steps, memory) into the store. A part is invisible
  until its trace's ``sources`` row exists, so this step can run anywhere, any number at once:
  ``ingest_paths(..., jobs=N)`` runs it in N worker processes.
- ``commit``: under the store's commit lock, decide (again) whether the trace is already there,
  clashes with a stored one or is another session of a rank (``sessions``), then write its
  ``sources`` row: only this makes its rows visible (``store.commit``; on object storage
  ``store.remote_commit``).

This module is the top of the store's write path: it orchestrates the conversion and the batch
(workers, Ray) above the commit protocol (``commit``, ``dedupe``, ``sessions``, ``writer``),
which sits above the location (``location``, ``objectstore``); nothing below imports it
(``tests/test_layering.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import duckdb

from stepscope.errors import StoreWriteError, TraceFormatError, UsageError
from stepscope.store import dedupe, engine, rankstats, remote_commit, trace_metadata
from stepscope.store.commit import (ON_CONFLICT, PARTS, ConvertedTrace, IngestedTrace, checked, commit_trace,
                                    problem_line, remove_parts, skipped_trace)
from stepscope.store.constants import INT64_MAX, INT64_MIN, out_of_range
from stepscope.store.compact import compact_runs
from stepscope.store.convert import Conversion, SqlPart, Stager, convert
from stepscope.store.files import select_trace_files
from stepscope.store.kineto import KinetoTrace, read_trace
from stepscope.store.location import is_url
from stepscope.store.objectstore import RemoteStore
from stepscope.store.atomic import AtomicBatch
from stepscope.store.writer import part_path, run_id, write_partition
from stepscope.store.snapshot.unpickle import is_snapshot_file

RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)(?![0-9])", re.IGNORECASE)
SOURCE_DIGITS = 16

INGEST_MEMORY_LIMIT_ENV = "STEPSCOPE_INGEST_MEMORY_LIMIT"
DEFAULT_INGEST_MEMORY_LIMIT = "128MB"
"""DuckDB's memory for converting one trace (``--memory-limit`` or
``$STEPSCOPE_INGEST_MEMORY_LIMIT``); past it the conversion spills to the connection's private
folder. DuckDB keeps what it is allowed: with 512MB, df_index_resolver (216k events, 54 MB of
JSON) peaked at 205-213 MB of RSS in all, with 128MB (and the rank tables' 64MB, and 8 MB
pieces) at 154-156 MB, for 12% more CPU (6.46 -> 7.25 s, medians of 3 alternated runs on a quiet
machine). A trace is converted beside training (the collector converts on the rank's own host),
where memory is what is short."""
SMALL_TRACE_EVENTS = 50_000
SMALL_TRACE_SKIPPED_OPTIMIZERS = "common_subexpressions,projection_pullup"
"""A trace of fewer events is converted without these two DuckDB optimizer passes. On a small
trace the ~50 statements of a conversion cost their planning, not their rows, and these passes
were a tenth of it (hta/trace_filter/sampled_rank-0, 4,855 events: 0.71 s of CPU against 0.81 s,
minimum of 5); on df_index_resolver (216k events) they pay for themselves. An optimizer pass
never changes a result, only how it is computed."""
INGEST_THREADS = 1
"""DuckDB threads per conversion. One: a second thread parses another piece at once and holds
its buffers (measured: 229 MB peak against 184 MB on df_index_resolver, 323 MB against 203 MB
on five copies of it, for ~10% less wall time); files convert in parallel instead (``--jobs``)."""


@dataclass
class IngestReport:
    """Outcome of a batch: the files stored or skipped, and one error line per refused file."""

    run: str
    stored: list[IngestedTrace] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


RANK_MAX = 2**31 - 1
"""The largest rank the store holds: its ``rank=`` partition folders are read as 32-bit integers
(``catalog``), and one folder beyond that made every query of the whole store fail."""


def rank_from_name(path: Path) -> int | None:
    """Rank written in a file name: ``rank-3``, ``rank3``, ``worker3``, ``_rank_3``."""
    match = RANK_IN_NAME.search(path.name)
    return int(match.group(1)) if match else None


def resolve_rank(trace: KinetoTrace, position: int) -> tuple[int, str]:
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


def ingest_memory_limit(override: str | None = None) -> str:
    """DuckDB's memory limit for one conversion: ``override``, else the environment, else
    :data:`DEFAULT_INGEST_MEMORY_LIMIT`."""
    return override or os.environ.get(INGEST_MEMORY_LIMIT_ENV) or DEFAULT_INGEST_MEMORY_LIMIT


DEVICE_FIELDS = {"gpu_memory_bytes": "deviceProperties totalGlobalMem",
                 "gpu_sm_count": "deviceProperties numSms", "gpu_count": "deviceProperties count"}
"""Where each integer device fact of ``sources`` comes from, to name it when it is refused."""


def _device_facts(trace: KinetoTrace, main_device: int | None) -> dict[str, Any]:
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
        raise TraceFormatError(path, out_of_range(what, value))
    return value


def _sources_row(trace: KinetoTrace, source: str, run_name: str, rank_from: str, done: Conversion,
                 metadata: dict[str, Any] | None, tags: dict[str, str] | None) -> dict[str, Any]:
    """The trace's ``sources`` row, but for ``ingested_at`` (set at commit)."""
    dist = trace.distributed_info
    devices = _device_facts(trace, done.main_device)
    recorded = dict(trace.metadata)
    if trace_metadata.KEY in recorded:
        recorded[trace_metadata.KEY] = trace_metadata.decode(recorded[trace_metadata.KEY])
    return {
        "source": source,
        "run_name": run_name,
        "path": trace.path,
        "sha256": trace.sha256,
        "content_sha256": trace.content_sha256,
        "file_bytes": trace.file_bytes,
        "rank_from": rank_from,
        "trace_schema_version": trace.schema_version,
        "trace_start_ns": done.start_ns,
        "trace_end_ns": done.end_ns,
        "event_count": done.event_count,
        "backend": _str_or_none(dist.get("backend")),
        "world_size": _int_or_none(dist.get("world_size"), "distributedInfo.world_size", trace.path),
        "gpu_name": _str_or_none(devices.pop("gpu_name")),
        **{k: _int_or_none(v, DEVICE_FIELDS[k], trace.path) for k, v in devices.items()},
        "device_properties": _json_or_none(trace.device_properties),
        "distributed_info": _json_or_none(dist),
        "metadata": _json_or_none({**recorded, **(metadata or {})}),
        "tags": _json_or_none(tags),
        "process_id": done.main_pid,
    }


def convert_file(
    path: str | Path,
    store: str | Path,
    run: str,
    *,
    rank: int | None = None,
    rank_from: str | None = None,
    position: int = 0,
    metadata: dict[str, Any] | None = None,
    tags: dict[str, str] | None = None,
    memory_limit: str | None = None,
    threads: int | None = None,
) -> ConvertedTrace | IngestedTrace:
    """Convert one trace file and write its parts into ``store`` (uncommitted).

    Returns the ``ConvertedTrace`` to ``commit``, or the ``IngestedTrace`` of a skip when the run
    already holds this trace. Raises ``TraceFormatError`` on bad input, ``StoreWriteError`` when
    the store cannot be written; a failure leaves no part behind. ``rank`` overrides the trace's
    own (the collector knows it); otherwise distributedInfo, the file name, then ``position``.
    """
    if is_url(store):
        return _convert_into_url(path, str(store), run, rank=rank, rank_from=rank_from, position=position,
                                 metadata=metadata, tags=tags, memory_limit=memory_limit, threads=threads)
    root = Path(store)
    rid = run_id(run)
    work = Path(tempfile.mkdtemp(prefix="stepscope-ingest-"))
    con = engine.connect(limit=ingest_memory_limit(memory_limit), threads=threads or INGEST_THREADS)
    written: tuple[int, str] | None = None
    batch = AtomicBatch()
    try:
        stager = Stager(Path(path), con)
        try:
            trace = read_trace(path, work, stager.add)
        except TraceFormatError:
            stager.close()  # a problem in a piece cut before is earlier in the file: said first
            raise
        except BaseException:
            stager.stop()
            raise
        stages = stager.close()
        if stager.count < SMALL_TRACE_EVENTS:
            con.execute(f"SET disabled_optimizers = '{SMALL_TRACE_SKIPPED_OPTIMIZERS}'")
        source = source_id(trace.sha256)
        if rank is not None:
            resolved, how = int(rank), rank_from or "option"
        else:
            resolved, how = resolve_rank(trace, position)
        if resolved > RANK_MAX:
            raise TraceFormatError(path, f"rank {resolved} (from {how}) is out of range (the store holds "
                                         f"ranks up to {RANK_MAX:,})")
        same = checked(dedupe.same_trace, root, rid, source, trace.content_sha256)
        if same is not None:
            return skipped_trace(path, rid, same, source, resolved, how)
        converted_tables = convert(trace, con, stages)
        done = converted_tables.conversion
        row = _sources_row(trace, source, run, how, done, metadata, tags)
        written = (resolved, source)
        try:
            written_parts = {table: write_partition(root, table, rid, resolved, source, part, batch=batch)
                             for table, part in converted_tables.parts(source).items()}
            write_rank_tables(con, root, rid, resolved, source, written_parts, batch=batch)
            batch.place()
        except OSError as exc:
            raise StoreWriteError(path, root, exc) from exc
        converted = ConvertedTrace(str(path), rid, run, resolved, how, source, trace.content_sha256, done, row)
        written = None
        return converted
    finally:
        con.close()
        batch.discard()
        shutil.rmtree(work, ignore_errors=True)
        if written is not None:
            remove_parts(root, rid, *written)


def _convert_into_url(path: str | Path, url: str, run: str, **options: Any) -> ConvertedTrace | IngestedTrace:
    """``convert_file`` into the store at ``url``: converted in a local temporary folder, the
    parts uploaded (uncommitted; ``remote_commit`` commits them)."""
    store = RemoteStore(url)
    work = Path(tempfile.mkdtemp(prefix="stepscope-upload-"))
    try:
        outcome = convert_file(path, work, run, **options)
        if isinstance(outcome, ConvertedTrace):
            files = [part_path(work, table, outcome.run, outcome.rank, outcome.source) for table in PARTS]
            try:
                store.upload(work, [f for f in files if f.is_file()])
            except OSError as exc:
                for table in PARTS:
                    with contextlib.suppress(OSError):
                        store.remove(part_path(Path(), table, outcome.run, outcome.rank, outcome.source))
                raise StoreWriteError(path, url, exc) from exc
        return outcome
    finally:
        shutil.rmtree(work, ignore_errors=True)


RANK_TABLES_MEMORY_LIMIT = "64MB"
"""DuckDB's memory limit while a trace's per-rank tables are computed. Their sweeps hold every
interval of the trace at once (temporary tables, sorts); past this they spill to the
connection's private folder, so a bigger trace takes longer, not more memory (without a limit,
five copies of df_index_resolver peaked at 458 MB against 237 MB for one; at 128MB the rank
tables were the peak of df_index_resolver's ingest, 208 MB, at 64MB 152 MB)."""


def write_rank_tables(con: duckdb.DuckDBPyConnection, root: Path, run: str, rank: int, source: str,
                      parts: dict[str, Path], *, batch: AtomicBatch | None = None) -> None:
    """Write each per-rank table (``stepscope.store.rankstats``) of one trace, computed in ``con`` from
    the trace's parts ``parts`` (events, steps, ...), into ``batch`` when given (ingest: the
    trace's parts are put in place together). Ingest and ``stepscope migrate`` call it."""
    con.execute(f"SET memory_limit = '{RANK_TABLES_MEMORY_LIMIT}'")
    rankstats.trace_views(con, parts, run, rank)
    rankstats.prepare(con, run)
    for table, query in rankstats.queries(con, run):
        write_partition(root, table, run, rank, source,
                        SqlPart(con, Path(parts["events"]), query, rankstats.params(query, run)), batch=batch)


def commit(converted: ConvertedTrace, store: str | Path, *, on_conflict: str = "session") -> IngestedTrace:
    """Make a converted trace visible in ``store`` (``commit.commit_trace``; a store on object
    storage commits in a local copy of its commit state: ``remote_commit``). Raises what refused
    the trace."""
    if is_url(store):
        return remote_commit.commit_one(converted, str(store), on_conflict=on_conflict)
    return commit_trace(converted, Path(store), on_conflict=on_conflict)


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
    on_conflict: str = "session",
    memory_limit: str | None = None,
) -> IngestedTrace:
    """Ingest one trace file as one rank of ``run`` (``convert_file``, then ``commit``).

    Raises ``TraceFormatError`` on bad input (and when a different trace of the same rank with an
    overlapping time range is stored), ``StoreWriteError`` when the store cannot be written.
    """
    converted = convert_file(path, store, run, rank=rank, rank_from=rank_from, position=position,
                             metadata=metadata, tags=tags, memory_limit=memory_limit)
    if isinstance(converted, IngestedTrace):
        return converted
    return commit(converted, store, on_conflict=on_conflict)


@dataclass(frozen=True)
class _Job:
    """One file of a batch, as a worker process converts it."""

    file: Path
    store: str
    run: str
    position: int
    tags: dict[str, str] | None
    memory_limit: str | None
    rank: int | None = None


def _convert_job(job: _Job) -> ConvertedTrace | IngestedTrace | str:
    """Convert one file of a batch: the converted trace, a skip, or the line that refuses it.
    Whatever goes wrong stays with this file; only an interrupt (Ctrl-C) stops the batch."""
    try:
        if is_snapshot_file(job.file):
            return _ingest_snapshot(job)
        return convert_file(job.file, job.store, job.run, rank=job.rank, position=job.position, tags=job.tags,
                            memory_limit=job.memory_limit)
    except Exception as exc:  # noqa: BLE001 - a bug must cost one file, not the batch
        return problem_line(job.file, exc)


# --- memory snapshots (``stepscope.store.snapshot``): recognised by content, committed there ---
def _ingest_snapshot(job: _Job) -> IngestedTrace:
    """Ingest a memory snapshot pickle of the batch; its rank: ``--rank``, the file name, its
    position."""
    named = rank_from_name(job.file)
    rank, how = ((job.rank, "option") if job.rank is not None else (named, "filename") if named is not None
                 else (job.position, "position"))
    # Imported here: it needs pyarrow (42 MB of memory, 0.2 s), which a Kineto trace's ingest
    # never loads (DuckDB writes its parts).
    from stepscope.store.snapshot import ingest as snapshot_ingest

    done = snapshot_ingest.ingest_snapshot(job.file, job.store, job.run, rank=rank, rank_from=how,
                                           source_of=source_id, tags=job.tags)
    return IngestedTrace(str(job.file), run_id(job.run), rank, how, done.source, done.events, done.skipped)
# --- end of memory snapshots ---


def _commit_outcome(outcome: ConvertedTrace | IngestedTrace | str, file: Path, store: str | Path,
                    on_conflict: str) -> IngestedTrace | str:
    if not isinstance(outcome, ConvertedTrace):
        return outcome
    try:
        return commit(outcome, store, on_conflict=on_conflict)
    except Exception as exc:  # noqa: BLE001 - as above
        return problem_line(file, exc)


CONVERT_FIXED_S = 0.45
"""A conversion's cost whatever the trace's size (~50 DuckDB statements, planned for each trace:
hta/trace_filter/sampled_rank-0, 4,855 events, converts in 0.45-0.5 s on the 2-core machine)."""
CONVERT_S_PER_MB = 0.8
"""A conversion's cost per MB of gzipped trace (df_index_resolver: 3 MB, 2.8 s); an uncompressed
file counts as :data:`JSON_PER_GZIP` times smaller."""
JSON_PER_GZIP = 16
"""How many times larger a trace's JSON is than its gzip (df_index_resolver 18x, trace_diff 20x,
the samples 11-16x): a plain file is costed as its gzip would be."""
AUTO_JOBS_MIN_S = 2.0
"""Below this many seconds of expected conversion (:func:`expected_convert_s`), a batch converts
in this process: starting workers (fresh interpreters, ~0.5 s each, side by side) costs more
than splitting the rest saves. Eight small ranks (4.1 s measured) are worth two workers; two are not."""


def expected_convert_s(files: list[Path]) -> float:
    """Seconds a batch would take to convert in one process on the 2-core machine, from the
    number and sizes of its files (:data:`CONVERT_FIXED_S`, :data:`CONVERT_S_PER_MB`)."""
    mb = sum(_size(f) / (1 if f.name.endswith(".gz") else JSON_PER_GZIP) for f in files) / 2**20
    return len(files) * CONVERT_FIXED_S + mb * CONVERT_S_PER_MB


def default_jobs(files: list[Path] | None = None) -> int:
    """Worker processes for a batch: the cores this process may use, or 1 for a batch that takes
    less to convert than workers take to start (:data:`AUTO_JOBS_MIN_S`). Why by time, not bytes:
    a small trace costs its fixed ~0.45 s whatever its size, so many small ranks are as worth
    splitting as one large one (eight ranks of 130 KB: 4.1 s in one process)."""
    if files is not None and (len(files) < 2 or expected_convert_s(files) < AUTO_JOBS_MIN_S):
        return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


ENGINES = ("local", "ray")
"""Where a batch's files are converted: worker processes of this machine, or Ray tasks
(``store.ray_engine``, the ``stepscope[ray]`` extra)."""


def ingest_paths(
    paths: Iterable[str | Path],
    store: str | Path,
    run: str | None = None,
    *,
    tags: dict[str, str] | None = None,
    jobs: int | None = 1,
    on_conflict: str = "session",
    memory_limit: str | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    rank: int | None = None,
    on_selected: Callable[[list[Path]], None] | None = None,
    on_file: Callable[[Path], None] | None = None,
    on_converted: Callable[[Path], None] | None = None,
    on_done: Callable[[IngestedTrace | str], None] | None = None,
) -> IngestReport:
    """Ingest files and folders as the ranks of one run. Bad files are reported, not fatal.

    Every readable file of the batch is tried; ``report.errors`` holds one ``<file>: <problem>``
    line per path that was refused or could not be read (missing, a FIFO, a broken link, ...),
    and nothing already stored is touched by a refused one. ``on_selected`` gets the files found
    before any is read, ``on_converted`` each file once its conversion ended (in the order they
    end), ``on_done`` each outcome once committed. With ``jobs > 1`` files are converted in that
    many worker processes (``jobs=None``: ``default_jobs``), with ``engine="ray"`` in one Ray
    task each (on the cluster at ``ray_address``, else a local one); they are committed in the
    batch's order. A store on object storage (``s3://...``) takes the whole batch in one commit.
    ``rank`` is the rank of every file given (``--rank``); memory snapshot pickles, recognised
    by content, are stored as snapshots (``stepscope.store.snapshot``).
    """
    if on_conflict not in ON_CONFLICT:
        raise UsageError(f"--on-conflict must be one of {', '.join(ON_CONFLICT)}, not {on_conflict!r}")
    if engine not in ENGINES:
        raise UsageError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    selection = select_trace_files(paths)
    if not selection.files and not selection.problems:
        raise UsageError("no trace files (*.json, *.json.gz) in the paths given")
    name = run or (default_run_name(selection.files) if selection.files else "run")
    report = IngestReport(run=run_id(name))
    if on_selected:
        on_selected(selection.files)
    for problem in selection.problems:
        _record(report, problem, on_done)
    workers = max(1, min(default_jobs(selection.files) if jobs is None else jobs, len(selection.files)))
    batch = [_Job(file, str(store), name, position, tags, memory_limit, rank)
             for position, file in enumerate(selection.files)]
    if engine == "ray":
        from stepscope.store import ray_engine

        conversions = ray_engine.convert_batch(batch, _convert_job, address=ray_address, on_converted=on_converted)
    else:
        conversions = _converted_here(batch, workers, on_file, on_converted)
    if is_url(store):
        outcomes = list(conversions)
        for outcome in remote_commit.commit_batch([o for _, o in outcomes], [j.file for j, _ in outcomes],
                                                   str(store), on_conflict=on_conflict):
            _record(report, outcome, on_done)
        return report
    for job, outcome in conversions:
        _record(report, _commit_outcome(outcome, job.file, store, on_conflict), on_done)
    compact_runs(store, {t.run for t in report.stored if not t.skipped})
    return report


def _converted_here(batch: list[_Job], workers: int, on_file: Callable[[Path], None] | None,
                    on_converted: Callable[[Path], None] | None
                    ) -> Iterator[tuple[_Job, ConvertedTrace | IngestedTrace | str]]:
    """Each file of ``batch`` with its conversion's outcome, in the batch's order: converted in
    this process (``workers == 1``), else in a pool of worker processes."""
    if workers == 1:
        for job in batch:
            if on_file:
                on_file(job.file)
            outcome = _convert_job(job)
            if on_converted:
                on_converted(job.file)
            yield job, outcome
        return
    with _worker_pool(workers) as pool:
        futures: list[Future] = [pool.submit(_convert_job, job) for job in batch]
        for job, future in zip(batch, futures):
            if on_file:
                on_file(job.file)
            try:
                outcome = future.result()
            except Exception as exc:  # noqa: BLE001 - a worker that died costs its file
                outcome = problem_line(job.file, exc)
            if on_converted:
                on_converted(job.file)
            yield job, outcome


def _worker_pool(workers: int) -> ProcessPoolExecutor:
    """Worker processes started fresh (``spawn``): a forked copy of a process that already runs
    DuckDB threads (a notebook, the dashboard) could deadlock."""
    import multiprocessing

    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def _record(report: IngestReport, outcome: IngestedTrace | str,
            on_done: Callable[[IngestedTrace | str], None] | None) -> None:
    if isinstance(outcome, str):
        report.errors.append(outcome)
    else:
        report.stored.append(outcome)
    if on_done:
        on_done(outcome)
