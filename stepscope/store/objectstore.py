"""A store on object storage (``s3://bucket/prefix``, any fsspec URL), for writing: its keys,
uploads, moves and removals (:class:`RemoteStore`), and its commit lock.

This is the location layer, beside :mod:`stepscope.store.location` (which reads a URL's parts):
it knows where a store's files are and how to change them, nothing of what a trace or a commit
is. The commit protocol above it (``writer``, ``commit``, ``remote_commit``) uses it, and
``ingest`` above that; it imports none of them (``tests/test_layering.py``).

Object stores have no rename and no ``flock``. A part is written here and uploaded (one PUT,
atomic: readers see the whole object or none); a commit is decided in a local copy of the
store's commit state (``remote_commit``) under the lock below.

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
import socket
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from stepscope.errors import StoreError
from stepscope.store.location import RemoteStoreFiles

log = logging.getLogger(__name__)

LOCK_NAME = ".commit.lock"
LEASE_S = 120.0
"""How long a commit lock is valid without renewal; the holder renews it between traces."""
LOCK_WAIT_S = 600.0
"""How long a commit waits for another writer's lock before giving up with one line."""
LOCK_POLL_S = 0.5
CONDITIONAL_PROTOCOLS = ("s3", "s3a")
"""Filesystems with conditional writes to build the commit lock on."""


class RemoteStore(RemoteStoreFiles):
    """A store behind a URL, for writing: files up and down, moved, removed."""

    def key(self, relative: str | Path) -> str:
        return f"{self.base}/{Path(relative).as_posix()}"

    def upload(self, local_root: Path, files: Sequence[Path]) -> None:
        """Upload ``files`` (under ``local_root``) to the same relative keys."""
        if files:
            self.fs.put([str(f) for f in files], [self.key(f.relative_to(local_root)) for f in files])

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
