"""The one place DuckDB connections are made: threads, memory limit, a private spill folder.

A module of its own, below ``catalog`` (which also needs pyarrow): ingest opens its connection
here without importing pyarrow (~30 MB of resident memory that one ingest does not need).
"""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import duckdb

from stepscope.errors import UsageError

MEMORY_LIMIT_ENV = "STEPSCOPE_MEMORY_LIMIT"
DEFAULT_MEMORY_LIMIT = "50%"
"""DuckDB's own default is 80% of RAM: a cross join in the SQL console reached 11.6 GB in 30 s.
Half of RAM leaves room for the training job, the dashboard server or the ingest beside it."""

THREADS = 2

_SPILL_ROOT = Path(tempfile.gettempdir()) / f"stepscope-duckdb-{os.getpid()}-{secrets.token_hex(4)}"
_spill_numbers = itertools.count()
atexit.register(shutil.rmtree, _SPILL_ROOT, ignore_errors=True)


def resolve_memory_limit(override: str | None = None) -> str:
    """The memory limit for DuckDB: ``override``, else ``$STEPSCOPE_MEMORY_LIMIT``, else 50%
    (of RAM; DuckDB also accepts sizes such as ``8GB``)."""
    return override or os.environ.get(MEMORY_LIMIT_ENV) or DEFAULT_MEMORY_LIMIT


def connect(*, limit: str | None = None, spill: bool = True,
            threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the tool's limits; every connection stepscope opens
    comes from here. ``spill=False`` turns spilling to disk off (the SQL sandbox: its temporary
    folder would otherwise be readable through it); else each connection spills into a private
    folder of this process's own under the system's temporary directory, never ``./.tmp``."""
    chosen = resolve_memory_limit(limit)
    spill_to = ""
    if spill:  # DuckDB creates the folder itself, not its parents
        _SPILL_ROOT.mkdir(parents=True, exist_ok=True)
        spill_to = str(_SPILL_ROOT / str(next(_spill_numbers)))
    try:
        con = duckdb.connect(":memory:", config={"threads": threads or THREADS, "memory_limit": chosen,
                                                 "temp_directory": spill_to})
    except duckdb.Error as exc:
        raise UsageError(f"memory limit {chosen!r} (--memory-limit or ${MEMORY_LIMIT_ENV}): "
                         f"not a size such as 8GB or 40% ({exc})") from exc
    # DuckDB draws its progress bar on stdout for any query past 2 s: into `summary --format
    # json`'s document, on a loaded machine. Its cursors inherit the setting.
    con.execute("SET enable_progress_bar = false")
    return con


@functools.lru_cache(maxsize=1)
def _housekeeping() -> duckdb.DuckDBPyConnection:
    return connect(limit="64MB", spill=False, threads=1)


def scratch() -> duckdb.DuckDBPyConnection:
    """A cursor on this process's small connection for the store's housekeeping reads (a few
    rows of a few parts: the dedupe and session checks), one thread, 64 MB; a cursor per caller,
    so threads may use it at once."""
    return _housekeeping().cursor()
