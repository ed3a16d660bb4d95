"""The commit of a batch into a store on object storage (``s3://bucket/prefix``, any fsspec URL).

Object stores have no rename and no ``flock``. A conversion uploads its parts (``ingest``);
then one commit per batch, so one per run for ``stepscope ingest``: under the store's commit
lock (``objectstore.commit_lock``), the ``sources`` rows, content index and ``steps`` parts of
the runs concerned are downloaded into a local folder (the *shadow*), and the local commit
(``commit.commit_trace``) decides there for each trace, in the batch's order, with the same
rules (same trace, overlap, sessions, jobs); the parts it moves to a session run or removes are
moved or removed in the object store (``RemoteParts``). Then the new ``sources`` rows are
uploaded, one object per trace, and the content index entries (and the runs' job records, which
a commit replaces) after them. A crash before a trace's ``sources`` object leaves only invisible
parts (a later ingest of the file writes them again); each trace is visible whole or not at all.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from stepscope.errors import StoreError, StoreWriteError
from stepscope.store.atomic import move_file
from stepscope.store.commit import PARTS, ConvertedTrace, IngestedTrace, LocalParts, commit_trace, problem_line
from stepscope.store.dedupe import INDEX_NAME
from stepscope.store.objectstore import RemoteStore, commit_lock
from stepscope.store.writer import part_path

COMMIT_TABLES = ("sources", INDEX_NAME)
"""What a commit uploads, in this order: the ``sources`` rows (which make traces visible), then
the content index entries that point at them (and the runs' job records)."""
COMMIT_STATE = ("sources/run={run}*/rank=*/*.parquet", INDEX_NAME + "/run={run}*/*",
                "steps/run={run}*/rank=*/*.parquet")
"""What a commit decides on, for a run and its session runs (``<run>-session2``, ...)."""


def download_commit_state(store: RemoteStore, shadow: Path, runs: set[str]) -> None:
    """Copy the ``sources`` rows, content index and ``steps`` parts of ``runs`` and their
    session runs into the local folder ``shadow``."""
    remote: list[str] = []
    for run in sorted(runs):
        for pattern in COMMIT_STATE:
            remote += store.fs.glob(store.key(pattern.format(run=run)))
    if remote:
        local = [str(shadow / p[len(store.base) + 1:]) for p in remote]
        for path in local:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        store.fs.get(remote, local)


class RemoteParts(LocalParts):
    """A trace's uncommitted parts in the object store, during a commit decided in ``shadow``
    (the local copy of the commit state, whose ``steps`` parts follow them)."""

    def __init__(self, store: RemoteStore, shadow: Path) -> None:
        super().__init__(shadow)
        self.store = store

    def _relative(self, table: str, run: str, rank: int, source: str) -> Path:
        return part_path(Path(), table, run, rank, source)

    def move(self, run: str, rank: int, source: str, to_run: str) -> None:
        for table in PARTS:
            self.store.move(self._relative(table, run, rank, source), self._relative(table, to_run, rank, source))
        local = part_path(self.root, "steps", run, rank, source)
        if local.is_file():
            move_file(local, part_path(self.root, "steps", to_run, rank, source))

    def remove(self, run: str, rank: int, source: str) -> None:
        if part_path(self.root, "sources", run, rank, source).is_file():
            return  # a committed copy of the same file owns these parts
        for table in PARTS:
            self.store.remove(self._relative(table, run, rank, source))
        part_path(self.root, "steps", run, rank, source).unlink(missing_ok=True)


def _stamps(shadow: Path) -> dict[Path, tuple[int, int, int]]:
    """Each file of ``shadow`` with what changes when it is replaced (an atomic write is a new inode)."""
    return {f: _stamps_of(f) for f in shadow.rglob("*") if f.is_file()}


def _written_files(shadow: Path, before: dict[Path, tuple[int, int, int]]) -> list[Path]:
    """The files a commit wrote or replaced in ``shadow`` (a run's job record is replaced), in
    upload order (``COMMIT_TABLES``)."""
    return [f for table in COMMIT_TABLES for f in sorted((shadow / table).rglob("*"))
            if f.is_file() and not f.name.endswith(".tmp") and before.get(f) != _stamps_of(f)]


def _stamps_of(file: Path) -> tuple[int, int, int]:
    s = file.stat()
    return s.st_ino, s.st_mtime_ns, s.st_size


def _commit_all(converted: list[ConvertedTrace], url: str, on_conflict: str) -> list[IngestedTrace | Exception]:
    """Commit ``converted`` into the store at ``url`` in one go (see the module's docstring):
    each trace's outcome, or the exception that refused it."""
    if not converted:
        return []
    store = RemoteStore(url)
    shadow = Path(tempfile.mkdtemp(prefix="stepscope-commit-"))
    outcomes: list[IngestedTrace | Exception] = []
    try:
        with commit_lock(store) as lock:
            download_commit_state(store, shadow, {c.run for c in converted})
            before = _stamps(shadow)
            parts = RemoteParts(store, shadow)
            for c in converted:
                try:
                    outcomes.append(commit_trace(c, shadow, on_conflict=on_conflict, parts=parts))
                except Exception as exc:  # noqa: BLE001 - one trace's refusal, not the batch's
                    outcomes.append(exc)
                if lock is not None:
                    lock.renew()
            store.upload(shadow, _written_files(shadow, before))
    except OSError as exc:  # nothing of the batch is known to be committed: each file says so
        return [StoreWriteError(c.path, url, exc) for c in converted]
    except StoreError as exc:
        return [exc for _ in converted]
    finally:
        shutil.rmtree(shadow, ignore_errors=True)
    return outcomes


def commit_batch(outcomes: list[ConvertedTrace | IngestedTrace | str], files: list[Path],
                 url: str, *, on_conflict: str = "session") -> list[IngestedTrace | str]:
    """The outcome of each file of a batch whose conversions ended (``outcomes``, in the batch's
    order): the converted ones committed together, skips and refusal lines as they are."""
    converted = [o for o in outcomes if isinstance(o, ConvertedTrace)]
    committed = iter(_commit_all(converted, url, on_conflict))
    final: list[IngestedTrace | str] = []
    for outcome, file in zip(outcomes, files):
        if isinstance(outcome, ConvertedTrace):
            result = next(committed)
            outcome = problem_line(file, result) if isinstance(result, Exception) else result
        final.append(outcome)
    return final


def commit_one(converted: ConvertedTrace, url: str, *, on_conflict: str = "session") -> IngestedTrace:
    """``commit.commit_trace`` for a store on object storage: raises what refused the trace."""
    (result,) = _commit_all([converted], url, on_conflict)
    if isinstance(result, Exception):
        raise result
    return result
