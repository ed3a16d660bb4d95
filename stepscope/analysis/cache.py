"""Per-run cache of analysis frames: computed once, then read back in milliseconds.

A run's traces do not change once ingested, so a frame computed over the whole run can be kept
next to the store: ``<store>/cache/<frame>/run=<run>/<key>.parquet``. The key hashes what the
frame depends on: the run's sources (rank, source id, file sha256: adding or replacing a trace
changes it), the store's schema version, the frame's arguments, and the source code of the
analysis modules (so a new stepscope never serves numbers an older one computed). Stale files of
the same frame and run are removed when a new one is written.

Only whole-run calls are cached (``ranks=None``); a subset of ranks is computed directly.
``Absent`` results are not cached (they are cheap to recompute). A store folder that cannot be
written (read-only mount) just means no cache: the frame is computed and returned.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from stepscope.store.schema import SCHEMA_VERSION

log = logging.getLogger(__name__)

_CODE_FILES = ("_sql.py", "breakdown.py", "kernels.py", "cache.py",
               "_local.py", "overlap.py", "phase.py", "comm.py", "copies.py", "memory.py", "matching.py",
               "parts.py", "lateness.py")
_CODE_HASH = hashlib.sha256(
    b"".join((Path(__file__).parent / name).read_bytes() for name in _CODE_FILES)
).hexdigest()[:16]

CACHE_ENV = "STEPSCOPE_NO_CACHE"
"""Set to 1 to compute every frame afresh (benchmarks of the cold path, debugging)."""

F = TypeVar("F", bound=Callable[..., Any])


def run_key(store: Any, run: str, args: str) -> str:
    """Hash of the run's sources, the schema version, the frame's arguments and the code."""
    rows = store.sql(
        "SELECT rank, source, sha256 FROM sources WHERE run = $run ORDER BY rank, source", {"run": run}
    ).to_pylist()
    text = repr((rows, SCHEMA_VERSION, args, _CODE_HASH))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


_PACKAGE_HASH = hashlib.sha256(
    b"".join(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py")))
).hexdigest()[:16]


def cached_json(store: Any, name: str, run: str, args: object, compute: Callable[[], Any]) -> Any:
    """Cache a JSON document derived from the whole analysis package (e.g. the summary).

    Keyed like the frames, but on the code of *every* module of ``stepscope.analysis``, since a
    document gathers all sections and rules.
    """
    root = getattr(store, "root", None)
    if root is None or os.environ.get(CACHE_ENV) == "1":
        return compute()
    key = run_key(store, run, repr((args, _PACKAGE_HASH)))
    path = Path(root) / "cache" / name / f"run={run}" / f"{key}.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("%s: unreadable cache file, recomputing (%s)", path, exc)
    doc = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
        for stale in path.parent.glob("*.json"):
            if stale != path:
                stale.unlink(missing_ok=True)
    except OSError as exc:
        log.info("%s: cache not written (%s)", path, exc)
    return doc


def cache_path(root: Path, frame: str, run: str, key: str) -> Path:
    return root / "cache" / frame / f"run={run}" / f"{key}.parquet"


def _write(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    for stale in path.parent.glob("*.parquet"):
        if stale != path:
            stale.unlink(missing_ok=True)


def cached_frame(frame: str) -> Callable[[F], F]:
    """Cache the whole-run result of ``func(store, run, ranks=None, **kwargs)`` under ``frame``."""

    def decorate(func: F) -> F:
        signature = inspect.signature(func)

        @functools.wraps(func)
        def wrapper(store: Any, run: str, *args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(store, run, *args, **kwargs)
            bound.apply_defaults()
            options = {k: v for k, v in bound.arguments.items() if k not in ("store", "run")}
            root = getattr(store, "root", None)
            if options.get("ranks") is not None or root is None or os.environ.get(CACHE_ENV) == "1":
                return func(store, run, *args, **kwargs)
            key = run_key(store, run, repr(sorted(options.items())))
            path = cache_path(Path(root), frame, run, key)
            if path.is_file():
                try:
                    return pq.read_table(path)
                except (OSError, pa.ArrowInvalid) as exc:
                    log.warning("%s: unreadable cache file, recomputing (%s)", path, exc)
            result = func(store, run, *args, **kwargs)
            if isinstance(result, pa.Table):
                try:
                    _write(path, result)
                except OSError as exc:
                    log.info("%s: cache not written (%s)", path, exc)
            return result

        return wrapper  # type: ignore[return-value]

    return decorate
