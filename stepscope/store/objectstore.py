"""Ingest into a store on object storage (``s3://bucket/prefix``, any fsspec URL).

Object stores have no rename and no ``flock``, so the two steps of :mod:`stepscope.store.ingest`
work like this:

- **convert** (any process, any machine: a worker, a Ray task): the trace is converted into a
  local temporary folder exactly as for a local store, then each of its parts is uploaded to its
  final key. A PUT is atomic (readers see the whole object or none), and a part is invisible
  until its trace's ``sources`` row exists, so uploaded parts change no answer.
- **commit** (one per batch, so one per run for ``stepscope ingest``): under the store's commit
  lock (:class:`CommitLock`), the ``sources`` rows, content index and ``steps`` parts of the runs
  concerned are downloaded into a local folder, and the local ``commit`` decides there for each
  trace, in the batch's order, with the same rules (same trace, overlap, sessions); the parts it
  moves to a session run or removes are moved or removed in the object store. Then the new
  ``sources`` rows are uploaded, one object per trace, and the content index entries after them.
  A crash before a trace's ``sources`` object leaves only invisible parts (a later ingest of the
  file writes them again); each trace is visible whole or not at all.

The commit lock on S3 is an object, ``<prefix>/.commit.lock``, created with a conditional PUT
(``If-None-Match: *``, which S3 honours since 2024, as do MinIO and moto): exactly one writer
creates it. It holds a lease (``LEASE_S``), renewed by the holder between traces with a PUT
conditional on its own ETag (``If-Match``); a lock whose lease ran out (its holder died) is taken
over the same way, so two writers cannot both take it. On other filesystems (``gs://``,
``abfs://``, ``memory://``) stepscope has no conditional write to build a lock on: one writer at
a time per store is then the user's to ensure (docs/SCALE.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from stepscope.errors import StoreError, StoreWriteError
from stepscope.store import ingest
from stepscope.store.atomic import move_file
from stepscope.store.dedupe import INDEX_NAME
from stepscope.store.location import RemoteStoreFiles
from stepscope.store.writer import part_path

log = logging.getLogger(__name__)

LOCK_NAME = ".commit.lock"
LEASE_S = 120.0
"""How long a commit lock is valid without renewal; the holder renews it between traces."""
LOCK_WAIT_S = 600.0
"""How long a commit waits for another writer's lock before giving up with one line."""
LOCK_POLL_S = 0.5
CONDITIONAL_PROTOCOLS = ("s3", "s3a")
"""Filesystems with conditional writes to build the commit lock on."""
COMMIT_TABLES = ("sources", INDEX_NAME)
"""What a commit uploads, in this order: the ``sources`` rows (which make traces visible), then
the content index entries that point at them."""


class RemoteStore(RemoteStoreFiles):
    """A store behind a URL, for writing: parts up, commit state down, the commit lock."""

    def key(self, relative: str | Path) -> str:
        return f"{self.base}/{Path(relative).as_posix()}"

    def upload(self, local_root: Path, files: Sequence[Path]) -> None:
        """Upload ``files`` (under ``local_root``) to the same relative keys."""
        if files:
            self.fs.put([str(f) for f in files], [self.key(f.relative_to(local_root)) for f in files])

    def download_commit_state(self, shadow: Path, runs: set[str]) -> None:
        """Copy the ``sources`` rows, content index and ``steps`` parts of ``runs`` and their
        session runs (``<run>-session2``, ...) into the local folder ``shadow``."""
        remote: list[str] = []
        for run in sorted(runs):
            for pattern in ("sources/run={run}*/rank=*/*.parquet", INDEX_NAME + "/run={run}*/*",
                            "steps/run={run}*/rank=*/*.parquet"):
                remote += self.fs.glob(self.key(pattern.format(run=run)))
        if remote:
            local = [str(shadow / p[len(self.base) + 1:]) for p in remote]
            for path in local:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.fs.get(remote, local)

    def remove(self, relative: str | Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.key(relative))

    def move(self, relative: str | Path, to: str | Path) -> None:
        if self.fs.exists(self.key(relative)):
            self.fs.mv(self.key(relative), self.key(to))

    def runs(self) -> list[str]:
        """The run ids with committed rows (their ``sources`` partition)."""
        found = self.fs.glob(self.key("sources/run=*"))
        return sorted({Path(p).name.removeprefix("run=") for p in found})

    def read_text(self, relative: str) -> str | None:
        """A small file of the store (``baselines.json``), or None when there is none."""
        try:
            return self.fs.cat_file(self.key(relative)).decode("utf-8")
        except FileNotFoundError:
            return None

    def write_text(self, relative: str, text: str) -> None:
        """Replace a small file of the store: one PUT, which readers see whole or not at all."""
        self.fs.pipe_file(self.key(relative), text.encode("utf-8"))


class CommitLock:
    """The store's commit lock on S3: an object created with ``If-None-Match: *``, holding a
    lease renewed with ``If-Match`` (see the module's docstring)."""

    def __init__(self, store: RemoteStore) -> None:
        self.store = store
        self.bucket, self.key = store.fs.split_path(store.key(LOCK_NAME))[:2]
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        self.etag: str | None = None

    def _body(self) -> bytes:
        return json.dumps({"owner": self.owner, "expires_at": time.time() + LEASE_S}).encode()

    def _put(self, **condition: str) -> str:
        reply = self.store.fs.call_s3("put_object", Bucket=self.bucket, Key=self.key, Body=self._body(), **condition)
        return reply["ETag"]

    def _holder(self) -> tuple[str, dict[str, Any]] | None:
        """The lock's ETag and lease, or None when there is no lock. Two reads: should the lock
        change between them, a takeover conditional on the older ETag fails, as it must."""
        path = f"{self.bucket}/{self.key}"
        try:
            etag = self.store.fs.info(path)["ETag"]
            lease = json.loads(self.store.fs.cat_file(path))
        except FileNotFoundError:
            return None
        except ValueError:  # not a lease of ours: never expires on its own
            return etag, {}
        return etag, lease if isinstance(lease, dict) else {}

    def acquire(self) -> None:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                self.etag = self._put(IfNoneMatch="*")
                return
            except (FileExistsError, OSError):  # 412: held by someone (409: a concurrent create)
                pass
            holder = self._holder()
            if holder is not None and holder[1].get("expires_at", float("inf")) < time.time():
                with contextlib.suppress(OSError):  # the holder died: take it over, one winner
                    self.etag = self._put(IfMatch=holder[0])
                    log.info("%s: took over a commit lock whose lease ran out (%s)", self.store.url,
                             holder[1].get("owner"))
                    return
            if time.monotonic() > deadline:
                owner = holder[1].get("owner") if holder else "?"
                raise StoreError(f"{self.store.url}: the commit lock is held by {owner} for more than "
                                 f"{LOCK_WAIT_S:.0f} s; not committed")
            time.sleep(LOCK_POLL_S)

    def renew(self) -> None:
        """Extend the lease; a lease lost (it ran out and another writer took the lock) stops
        the commit."""
        try:
            self.etag = self._put(IfMatch=self.etag)
        except OSError as exc:
            raise StoreError(f"{self.store.url}: the commit lock was lost (its lease of {LEASE_S:.0f} s ran "
                             "out); the traces not yet committed are not stored") from exc

    def release(self) -> None:
        with contextlib.suppress(OSError):
            self.store.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key, IfMatch=self.etag)


@contextlib.contextmanager
def commit_lock(store: RemoteStore) -> Iterator[CommitLock | None]:
    """Hold the store's commit lock (S3), or nothing where the filesystem has no conditional
    writes (one writer at a time is then the user's to ensure)."""
    if store.protocol not in CONDITIONAL_PROTOCOLS:
        log.debug("%s: no commit lock on %s://; one writer at a time", store.url, store.protocol)
        yield None
        return
    lock = CommitLock(store)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()


class RemoteParts(ingest.LocalParts):
    """A trace's uncommitted parts in the object store, during a commit decided in ``shadow``
    (the local copy of the commit state, whose ``steps`` parts follow them)."""

    def __init__(self, store: RemoteStore, shadow: Path) -> None:
        super().__init__(shadow)
        self.store = store

    def _relative(self, table: str, run: str, rank: int, source: str) -> Path:
        return part_path(Path(), table, run, rank, source)

    def move(self, run: str, rank: int, source: str, to_run: str) -> None:
        for table in ingest.PARTS:
            self.store.move(self._relative(table, run, rank, source), self._relative(table, to_run, rank, source))
        local = part_path(self.root, "steps", run, rank, source)
        if local.is_file():
            move_file(local, part_path(self.root, "steps", to_run, rank, source))

    def remove(self, run: str, rank: int, source: str) -> None:
        if part_path(self.root, "sources", run, rank, source).is_file():
            return  # a committed copy of the same file owns these parts
        for table in ingest.PARTS:
            self.store.remove(self._relative(table, run, rank, source))
        part_path(self.root, "steps", run, rank, source).unlink(missing_ok=True)


def convert_file(path: str | Path, url: str, run: str, **options: Any) -> ingest.ConvertedTrace | ingest.IngestedTrace:
    """``ingest.convert_file`` into the store at ``url``: converted in a local temporary folder,
    the parts uploaded (uncommitted; :func:`commit_batch` commits them)."""
    store = RemoteStore(url)
    work = Path(tempfile.mkdtemp(prefix="stepscope-upload-"))
    try:
        outcome = ingest.convert_file(path, work, run, **options)
        if isinstance(outcome, ingest.ConvertedTrace):
            files = [part_path(work, table, outcome.run, outcome.rank, outcome.source) for table in ingest.PARTS]
            try:
                store.upload(work, [f for f in files if f.is_file()])
            except OSError as exc:
                for table in ingest.PARTS:
                    with contextlib.suppress(OSError):
                        store.remove(part_path(Path(), table, outcome.run, outcome.rank, outcome.source))
                raise StoreWriteError(path, url, exc) from exc
        return outcome
    finally:
        shutil.rmtree(work, ignore_errors=True)


def write_partition(url: str, table: str, run: str, rank: int, source: str, data: Any) -> str:
    """``writer.write_partition`` into the store at ``url``: written in a local temporary
    folder, then uploaded to its key (the collector's tables beside a committed trace)."""
    from stepscope.store.writer import write_partition as write_local_partition

    store = RemoteStore(url)
    work = Path(tempfile.mkdtemp(prefix="stepscope-part-"))
    try:
        written = write_local_partition(work, table, run, rank, source, data)
        store.upload(work, [Path(written)])
        return f"{store.url}/{Path(written).relative_to(work).as_posix()}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _new_files(shadow: Path, before: set[Path]) -> list[Path]:
    """The files a commit wrote into ``shadow``, in upload order (``COMMIT_TABLES``)."""
    return [f for table in COMMIT_TABLES for f in sorted((shadow / table).rglob("*"))
            if f.is_file() and f not in before and not f.name.endswith(".tmp")]


def _commit_all(converted: list[ingest.ConvertedTrace], url: str, on_conflict: str
                ) -> list[ingest.IngestedTrace | Exception]:
    """Commit ``converted`` into the store at ``url`` in one go (see the module's docstring):
    each trace's outcome, or the exception that refused it."""
    if not converted:
        return []
    store = RemoteStore(url)
    shadow = Path(tempfile.mkdtemp(prefix="stepscope-commit-"))
    outcomes: list[ingest.IngestedTrace | Exception] = []
    try:
        with commit_lock(store) as lock:
            store.download_commit_state(shadow, {c.run for c in converted})
            before = {f for f in shadow.rglob("*") if f.is_file()}
            parts = RemoteParts(store, shadow)
            for c in converted:
                try:
                    outcomes.append(ingest.commit(c, shadow, on_conflict=on_conflict, parts=parts))
                except Exception as exc:  # noqa: BLE001 - one trace's refusal, not the batch's
                    outcomes.append(exc)
                if lock is not None:
                    lock.renew()
            store.upload(shadow, _new_files(shadow, before))
    except OSError as exc:  # nothing of the batch is known to be committed: each file says so
        return [StoreWriteError(c.path, url, exc) for c in converted]
    except StoreError as exc:
        return [exc for _ in converted]
    finally:
        shutil.rmtree(shadow, ignore_errors=True)
    return outcomes


def commit_batch(outcomes: list[ingest.ConvertedTrace | ingest.IngestedTrace | str], files: list[Path],
                 url: str, *, on_conflict: str = "session") -> list[ingest.IngestedTrace | str]:
    """The outcome of each file of a batch whose conversions ended (``outcomes``, in the batch's
    order): the converted ones committed together, skips and refusal lines as they are."""
    converted = [o for o in outcomes if isinstance(o, ingest.ConvertedTrace)]
    committed = iter(_commit_all(converted, url, on_conflict))
    final: list[ingest.IngestedTrace | str] = []
    for outcome, file in zip(outcomes, files):
        if isinstance(outcome, ingest.ConvertedTrace):
            result = next(committed)
            outcome = ingest._problem_line(file, result) if isinstance(result, Exception) else result
        final.append(outcome)
    return final


def commit_one(converted: ingest.ConvertedTrace, url: str, *, on_conflict: str = "session") -> ingest.IngestedTrace:
    """``ingest.commit`` for a store on object storage: raises what refused the trace."""
    (result,) = _commit_all([converted], url, on_conflict)
    if isinstance(result, Exception):
        raise result
    return result
