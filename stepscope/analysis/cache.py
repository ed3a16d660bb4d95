"""Per-run cache of analysis frames: computed once, then read back in milliseconds.

A run's traces do not change once ingested, so a frame computed over the whole run can be kept
next to the store: ``<store>/cache/<frame>/run=<run>/<key>.parquet``. The key hashes what the
frame depends on: the run's sources (rank, source id, file sha256: adding or replacing a trace
changes it), the files of the tables the collector writes after a trace is committed and rewrites
later (:data:`~stepscope.store.schema.REWRITTEN_TABLES`: name, size and mtime of each part), the
store's schema version, the frame's arguments, and the source code of the
whole analysis package with the formatters its messages use (:data:`CODE_HASH`: a new or edited
module, in any subpackage, invalidates every entry, so a stepscope never serves numbers an older
code computed; no hand-kept list of files to forget). Stale files of
the same frame and run are removed when a new one is written.

Only whole-run calls are cached on disk (``ranks=None``); a subset of ranks is computed directly.
Within one open ``Store`` every call is computed once (``Store.memo``): the store's views read
the file list it took when it opened, so nothing they answer changes while it is open.
An ``Absent`` result is kept too, as its reason in ``<key>.absent``: deciding that a CPU-only run
has no GPU breakdown runs the whole query (a quarter of a second on the sample runs), and the
gate asks for it on every comparison. A store folder that cannot be written (read-only mount)
just means no cache: the frame is computed and returned. Frames are replaced atomically but not
fsynced (they can be made again): one that a crash left empty or torn is read as a miss. The
summary's JSON is fsynced: ``stepscope summary --format json`` prints it without parsing it.
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

from stepscope.analysis.absent import Absent
from stepscope.store.atomic import atomic_write, write_text_atomic
from stepscope.store.schema import REWRITTEN_TABLES, SCHEMA_VERSION

log = logging.getLogger(__name__)


def code_files(package: Path) -> list[Path]:
    """What cached results depend on: every module under ``package`` (the analysis package,
    subpackages included), the store's per-rank SQL beside it (``store/rankstats``: the part
    catalogue and the queries the analyses share with ingest) and :mod:`stepscope.units`,
    whose formatters write the findings' messages."""
    return [*sorted(package.rglob("*.py")), *sorted((package.parent / "store" / "rankstats").rglob("*.py")),
            package.parent / "units.py"]


def code_hash(files: list[Path], root: Path) -> str:
    """sha256 over each file's path (relative to ``root``) and bytes: editing, adding, removing
    or renaming any of them changes it."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


_ANALYSIS = Path(__file__).resolve().parent
CODE_HASH = code_hash(code_files(_ANALYSIS), _ANALYSIS.parent)
"""The code every cache key includes (computed once, at import)."""

CACHE_ENV = "STEPSCOPE_NO_CACHE"
"""Set to 1 to compute every frame afresh, not read from ``<store>/cache/`` (benchmarks of the
cold path, debugging); within one open ``Store`` a frame is still computed once."""

F = TypeVar("F", bound=Callable[..., Any])


def rewritten_parts(root: Path, run: str) -> list[tuple[str, int, int]]:
    """``(path, size, mtime_ns)`` of every part of the run's :data:`REWRITTEN_TABLES`: a rewrite
    (atomic, so a new inode) changes its size or mtime."""
    found = []
    for table in REWRITTEN_TABLES:
        for part in (root / table / f"run={run}").glob("rank=*/*.parquet"):
            try:
                info = part.stat()
            except OSError:  # replaced or pruned while listed
                continue
            found.append((str(part.relative_to(root)), info.st_size, info.st_mtime_ns))
    return sorted(found)


def _cache_root(store: Any) -> Path | None:
    """Where ``store``'s frames are cached: its ``cache_root`` (a local folder, also for a store
    on object storage), else its ``root``; None (no cache) for an object without either."""
    root = getattr(store, "cache_root", None) or getattr(store, "root", None)
    return None if root is None else Path(root)


def _run_facts(store: Any, run: str) -> tuple[list[dict[str, Any]], list[tuple[str, int, int]]]:
    """What every key of the run hashes but its arguments: the run's sources and the stamps of
    its rewritten parts. A store that lists its files once (the catalog's ``Store``) gives the
    stamps from that list and keeps both for as long as the list holds (``Store.memo``)."""

    def facts() -> tuple[list[dict[str, Any]], list[tuple[str, int, int]]]:
        rows = store.sql(
            "SELECT rank, source, sha256 FROM sources WHERE run = $run ORDER BY rank, source", {"run": run}
        ).to_pylist()
        if hasattr(store, "part_stamps"):
            return rows, store.part_stamps(run, REWRITTEN_TABLES)
        parts_root = getattr(store, "parts_root", None)
        return rows, rewritten_parts(parts_root, run) if parts_root is not None else []

    memo = getattr(store, "memo", None)
    return memo(("cache.run_facts", run), facts) if memo is not None else facts()


def run_key(store: Any, run: str, args: str) -> str:
    """Hash of the run's sources and rewritten parts, the schema version, the frame's arguments
    and the code."""
    rows, parts = _run_facts(store, run)
    text = repr((rows, parts, SCHEMA_VERSION, args, CODE_HASH))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _json_path(store: Any, name: str, run: str, args: object) -> Path | None:
    """Where the document ``name`` of ``run`` for ``args`` is kept; None when nothing is cached
    (no cache folder, or the cache turned off)."""
    root = _cache_root(store)
    if root is None or os.environ.get(CACHE_ENV) == "1":
        return None
    return Path(root) / "cache" / name / f"run={run}" / f"{run_key(store, run, repr(args))}.json"


def cached_json_text(store: Any, name: str, run: str, args: object) -> bytes | None:
    """The kept document of :func:`cached_json` as the compact JSON it was written as, not
    parsed (``stepscope summary --format json`` reformats it without building the objects);
    None when there is none."""
    path = _json_path(store, name, run, args)
    try:
        return path.read_bytes() if path is not None and path.is_file() else None
    except OSError:
        return None


def cached_json(store: Any, name: str, run: str, args: object, compute: Callable[[], Any]) -> Any:
    """Cache a JSON document derived from the whole analysis package (e.g. the summary), keyed
    like the frames. Kept as compact JSON (written and read by the C codec: a 1,024-rank
    summary is tens of MB)."""
    path = _json_path(store, name, run, args)
    if path is None:
        return compute()
    if path.is_file():
        try:
            return json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:
            log.warning("%s: unreadable cache file, recomputing (%s)", path, exc)
    doc = compute()
    try:
        write_text_atomic(path, json.dumps(doc, separators=(",", ":")))
        for stale in path.parent.glob("*.json"):
            if stale != path:
                stale.unlink(missing_ok=True)
    except OSError as exc:
        log.info("%s: cache not written (%s)", path, exc)
    return doc


def peek_json(store: Any, name: str, run: str, args: object) -> Any | None:
    """The kept document of :func:`cached_json`, parsed, or None when there is none (nothing
    computed)."""
    text = cached_json_text(store, name, run, args)
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        return None


def cache_path(root: Path, frame: str, run: str, key: str) -> Path:
    return root / "cache" / frame / f"run={run}" / f"{key}.parquet"


ABSENT_SUFFIX = ".absent"


def _write(path: Path, result: pa.Table | Absent) -> None:
    """Keep ``result`` at ``path`` (a table) or beside it (an absence's reason); remove the
    frame's files of other keys."""
    if isinstance(result, Absent):
        kept = path.with_suffix(ABSENT_SUFFIX)
        write_text_atomic(kept, result.reason, durable=False)
    else:
        kept = path
        with atomic_write(path, durable=False) as handle:
            pq.write_table(result, handle)
    for stale in [*path.parent.glob("*.parquet"), *path.parent.glob(f"*{ABSENT_SUFFIX}")]:
        if stale != kept:
            stale.unlink(missing_ok=True)


def _read(path: Path) -> pa.Table | Absent | None:
    """The kept result for ``path``'s key, or None when there is none (or it cannot be read)."""
    absent = path.with_suffix(ABSENT_SUFFIX)
    try:
        if path.is_file():
            # One file: read as a file, not a dataset (``pq.read_table`` imports pyarrow.dataset,
            # ~0.5 s of the first cached read of a CLI process on a loaded machine).
            with pq.ParquetFile(path) as kept:
                return kept.read()
        if absent.is_file():
            reason = absent.read_text(encoding="utf-8")
            if reason:  # empty: torn by a crash (cache files are not fsynced), so a miss
                return Absent(reason)
    except (OSError, pa.ArrowInvalid, UnicodeDecodeError) as exc:
        log.warning("%s: unreadable cache file, recomputing (%s)", path, exc)
    return None


def cached_frame(frame: str) -> Callable[[F], F]:
    """Cache the whole-run result of ``func(store, run, ranks=None, **kwargs)`` under ``frame``,
    and every result (whole run or not) in the store's memo while it is open (``Store.memo``:
    a frame that several sections need is computed once per process, also with the disk cache
    off)."""

    def decorate(func: F) -> F:
        signature = inspect.signature(func)

        @functools.wraps(func)
        def wrapper(store: Any, run: str, *args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(store, run, *args, **kwargs)
            bound.apply_defaults()
            options = {k: v for k, v in bound.arguments.items() if k not in ("store", "run")}

            def compute() -> Any:
                return _on_disk(frame, func, store, run, options, args, kwargs)

            memo = getattr(store, "memo", None)
            if memo is None:
                return compute()
            return memo((frame, run, repr(sorted(options.items()))), compute)

        return wrapper  # type: ignore[return-value]

    return decorate


def _on_disk(frame: str, func: Callable[..., Any], store: Any, run: str, options: dict[str, Any],
             args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The frame from ``<store>/cache/`` (whole-run calls, cache on), else computed (and kept there)."""
    root = _cache_root(store)
    if options.get("ranks") is not None or root is None or os.environ.get(CACHE_ENV) == "1":
        return func(store, run, *args, **kwargs)
    key = run_key(store, run, repr(sorted(options.items())))
    path = cache_path(Path(root), frame, run, key)
    kept = _read(path)
    if kept is not None:
        return kept
    result = func(store, run, *args, **kwargs)
    if isinstance(result, (pa.Table, Absent)):
        try:
            _write(path, result)
        except OSError as exc:
            log.info("%s: cache not written (%s)", path, exc)
    return result
