"""The one way stepscope replaces a file: a temporary name of the writer's own, flushed to disk,
renamed into place.

Every file stepscope writes for readers to find (Parquet parts, the dedupe index, baselines and
acceptances, cached frames and documents, exported traces, the report's script cache) goes
through :func:`atomic_write` (or :func:`atomic_path`, for a writer that opens the file itself),
so a reader sees the old file or the whole new one, never half:

- the temporary name is unique per writer, ``<name>.<pid>.<random>.tmp`` (two processes or
  threads writing the same file each rename a complete file of their own; the last rename wins;
  with one shared temporary name they interleaved their bytes in one inode);
- the data is flushed and ``fsync``-ed before the rename, so a crash after it cannot leave an
  empty or short file under the final name;
- on any failure (a full disk, Ctrl-C) the temporary file is removed; a ``kill -9`` leaves at
  most a stray one, which a later write of the same file removes once it is ``STALE_TMP_S`` old.

The ``*.parquet`` globs of the catalog never match a ``.tmp`` name.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

TMP_SUFFIX = ".tmp"
STALE_TMP_S = 3600.0
"""A temporary file untouched for this long belongs to a writer that died: a live writer keeps
writing to it (or renames it) within seconds."""


def temporary_path(target: Path) -> Path:
    """A name beside ``target`` that no other writer (process or thread) uses."""
    return target.with_name(f"{target.name}.{os.getpid()}.{secrets.token_hex(6)}{TMP_SUFFIX}")


def remove_stale_temporaries(target: Path, older_than_s: float = STALE_TMP_S) -> None:
    """Delete temporary files of ``target`` left by writers that died (untouched for a while)."""
    cutoff = time.time() - older_than_s
    for stray in target.parent.glob(f"{target.name}.*{TMP_SUFFIX}"):
        try:
            if stray.stat().st_mtime < cutoff:
                stray.unlink()
        except OSError:  # another writer removed or renamed it meanwhile
            pass


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(target: Path | str, *, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``target`` (creating its folder) for a writer that opens the
    file itself (DuckDB's ``COPY ... TO``); when the block ends without error, fsync the file
    (unless ``durable`` is False) and rename it over ``target``; otherwise remove it.

    ``durable=False`` is for what can be made again (the analysis cache): a reader never sees a
    partly written file while the system runs, and after a crash such a file may be empty or
    torn, which its reader must take for a miss. It saves an fsync per file (3.5 ms each on the
    2-core machine's disk; a first open of the dashboard writes ~40 files)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target)
    tmp = temporary_path(target)
    try:
        yield tmp
        if durable:
            _fsync(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_write(target: Path | str, mode: str = "wb", encoding: str | None = None, *,
                 durable: bool = True) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``target`` (creating its folder) and yield it; when the block
    ends without error, flush, fsync (``durable``: see :func:`atomic_path`) and rename it over
    ``target``; otherwise remove it."""
    with atomic_path(target, durable=durable) as tmp, open(tmp, mode, encoding=encoding) as handle:
        yield handle
        handle.flush()


def write_text_atomic(target: Path | str, text: str, *, durable: bool = True) -> None:
    """Replace ``target`` with ``text`` (UTF-8), atomically."""
    with atomic_write(target, "w", encoding="utf-8", durable=durable) as handle:
        handle.write(text)


def move_file(source: Path | str, target: Path | str) -> None:
    """Move a complete file to ``target`` (creating its folder): one rename, so a reader sees it
    at one place or the other (same file system)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, target)


FSYNC_THREADS = 32
"""At most this many files flushed to disk at once by :meth:`AtomicBatch.place`."""


class AtomicBatch:
    """Files written under temporary names (:meth:`add`), then made durable together and renamed
    into place (:meth:`place`), or all removed (:meth:`discard`): a reader sees each file whole or
    not at all, as with :func:`atomic_path`, for one round of ``fsync`` instead of one per file.

    Why: the ~25 parts of one trace, fsynced one after the other, cost ~5 ms each here (0.13 s of
    a small trace's ingest); issued together the file system commits them in a few journal writes
    (0.03 s). Each file is still complete on disk before its name appears."""

    def __init__(self) -> None:
        self._pending: list[tuple[Path, Path]] = []

    def add(self, target: Path) -> Path:
        """The temporary path to write ``target``'s data to (its folder created)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target)
        tmp = temporary_path(target)
        self._pending.append((tmp, target))
        return tmp

    def place(self) -> list[Path]:
        """Flush every file to disk (at once: the fsyncs run in threads), then rename each into
        place; the files' final paths. Raises ``OSError`` (the files not yet placed stay pending)."""
        if self._pending:
            with ThreadPoolExecutor(max_workers=min(FSYNC_THREADS, len(self._pending))) as pool:
                list(pool.map(_fsync, [tmp for tmp, _ in self._pending]))
        placed = []
        while self._pending:
            tmp, target = self._pending[0]
            os.replace(tmp, target)
            self._pending.pop(0)
            placed.append(target)
        return placed

    def discard(self) -> None:
        """Remove the files not placed (a failure before or during :meth:`place`)."""
        for tmp, _ in self._pending:
            with contextlib.suppress(OSError):
                tmp.unlink()
        self._pending.clear()
