"""Each run's tables compacted into one file per table, so that a query over a run reads a number
of files that does not grow with its ranks.

The per-rank parts (``<table>/run=<run>/rank=<rank>/part-<source>.parquet``) stay the source of
truth: other engines read them as docs/STORE.md says, and nothing here is needed to read them.
What this module adds is derived and safe to delete: when an ingest commits, each table of the
run (but the raw ``events`` and ``memory``, :data:`RAW_TABLES`) that holds more than one part
gets one file of its committed rows, with ``run`` and ``rank`` as columns, under
``<store>/.compact/run=<run>/``, and a ``manifest.json`` that records exactly which parts (name,
size, modification time, inode) it was made from and their schema versions.

A reader (:func:`read_plan`, the catalog) lists the store's parts once, and takes a run's
compacted files only while that listing is exactly the manifest's: a trace committed, moved or
removed since, a part rewritten (the collector's tables), an uncommitted part in flight, and the
run is read from its parts as before, so a compacted file can never answer for parts it does
not hold. The parts are listed before they are read, so a part that changes while it is being
compacted no longer matches what the manifest recorded. A compacted file's name is new every
time (a random token), never reused, which is what makes DuckDB's Parquet metadata cache safe to
turn on for it; files a newer manifest no longer names are removed once :data:`STALE_S` old (a
reader that listed them a moment ago may still open them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import duckdb

from stepscope.store.atomic import atomic_path, write_text_atomic
from stepscope.store.constants import SCHEMA_VERSION_KEY, file_metadata
from stepscope.store.location import is_url

log = logging.getLogger(__name__)

COMPACT_DIR = ".compact"
MANIFEST = "manifest.json"
RAW_TABLES = frozenset({"events", "memory"})
"""Not compacted: one row per trace event (the bulk of a store: rewriting 14 M events of 64 ranks
takes minutes), and no summary, dashboard page or comparison reads them."""
STALE_S = 600.0
"""Compacted files no manifest names are kept this long: a reader may have listed them just before."""
MANIFEST_FORMAT = 1

HIVE = "hive_partitioning = true, hive_types = {'run': VARCHAR, 'rank': INTEGER}, union_by_name = true"
"""How the per-rank parts are read (their ``run`` and ``rank`` come from the folder names)."""


class Part(NamedTuple):
    """One per-rank part as listed: what identifies its content without reading it (a rewrite
    is a rename: a new inode, and a new size or time)."""

    rank: int
    name: str
    path: str
    size: int
    mtime_ns: int
    inode: int


def _dirs(folder: str, prefix: str) -> list[tuple[str, str]]:
    """``(value, path)`` of each subfolder of ``folder`` named ``<prefix><value>``, sorted."""
    try:
        with os.scandir(folder) as entries:
            return sorted((e.name[len(prefix):], e.path) for e in entries
                          if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _table_parts(root: Path, table: str, runs: set[str] | None) -> list[tuple[str, list[Part]]]:
    """``(run, parts)`` of one table, parts sorted by rank and name."""
    out = []
    for run, run_dir in _dirs(str(root / table), "run="):
        if runs is not None and run not in runs:
            continue
        parts = []
        for rank, rank_dir in _dirs(run_dir, "rank="):
            if not rank.lstrip("-").isdigit():
                continue
            number = int(rank)
            with os.scandir(rank_dir) as entries:
                for entry in entries:
                    if entry.name.endswith(".parquet"):
                        try:
                            info = entry.stat()
                        except OSError:  # removed while listed
                            continue
                        parts.append(Part(number, entry.name, entry.path, info.st_size, info.st_mtime_ns, info.st_ino))
        if parts:
            parts.sort()
            out.append((run, parts))
    return out


LIST_THREADS = 8
"""Tables listed at once: the listing is system calls (one ``scandir`` per folder, one ``stat``
per file), which threads overlap; 26,000 parts at 1,024 ranks."""


def list_parts(root: Path, tables: list[str], runs: set[str] | None = None) -> dict[str, dict[str, list[Part]]]:
    """Every part of ``tables`` (committed or not), by run then table, sorted by rank and name;
    no Parquet file opened. ``runs``: only these."""
    found: dict[str, dict[str, list[Part]]] = defaultdict(dict)
    with ThreadPoolExecutor(max_workers=LIST_THREADS) as pool:
        for table, listed in zip(tables, pool.map(lambda t: _table_parts(root, t, runs), tables)):
            for run, parts in listed:
                found[run][table] = parts
    return dict(found)


def _run_dir(root: Path, run: str) -> Path:
    return root / COMPACT_DIR / f"run={run}"


def _fingerprint(parts: dict[str, list[Part]]) -> list[list[object]]:
    """What a manifest records of a run's parts, in the form it reads back from JSON."""
    return sorted([table, p.rank, p.name, p.size, p.mtime_ns, p.inode] for table, listed in parts.items() for p in listed)


@dataclass
class Manifest:
    """What a run's compacted files hold: table -> file name, and the parts they were made from."""

    tables: dict[str, str]
    parts: list[list[object]]
    versions: list[int]

    @classmethod
    def read(cls, root: Path, run: str) -> Manifest | None:
        try:
            doc = json.loads((_run_dir(root, run) / MANIFEST).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
            return None
        return cls(dict(doc["tables"]), [list(p) for p in doc["parts"]], [int(v) for v in doc["versions"]])


@dataclass
class ReadPlan:
    """The files a store's views read: per table, the compacted files of the runs whose manifest
    matches their parts, and the per-rank parts of every other run (and of the raw tables)."""

    compacted: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    parts: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    compacted_runs: set[str] = field(default_factory=set)
    versions: set[int] = field(default_factory=set)
    """Schema versions of the compacted runs' ``sources`` parts, as their manifests recorded."""
    listing: dict[str, dict[str, list[Part]]] = field(default_factory=dict)

    def files(self) -> list[str]:
        return [f for files in (*self.compacted.values(), *self.parts.values()) for f in files]

    def stamps(self, run: str, tables: tuple[str, ...]) -> list[tuple[str, int, int]]:
        """``(path relative to the table folder, size, mtime_ns)`` of the run's parts of ``tables``."""
        out = []
        for table in tables:
            for part in self.listing.get(run, {}).get(table, []):
                out.append((f"{table}/run={run}/rank={part.rank}/{part.name}", part.size, part.mtime_ns))
        return sorted(out)


def read_plan(root: Path, tables: list[str]) -> ReadPlan:
    """List the store's parts once and decide, run by run, what its views read."""
    plan = ReadPlan(listing=list_parts(root, tables))
    for run, parts in sorted(plan.listing.items()):
        manifest = Manifest.read(root, run)
        folder = _run_dir(root, run)
        usable = (manifest is not None and manifest.parts == _fingerprint(parts)
                  and all((folder / name).is_file() for name in manifest.tables.values()))
        if usable:
            plan.compacted_runs.add(run)
            plan.versions.update(manifest.versions)
        for table, table_parts in parts.items():
            if usable and table in manifest.tables:
                plan.compacted[table].append(str(folder / manifest.tables[table]))
            else:
                plan.parts[table].extend(p.path for p in table_parts)
    return plan


def _sql_list(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def _kv(table: str) -> str:
    return "{" + ", ".join(f"'{k.decode()}': '{v.decode()}'" for k, v in file_metadata(table).items()) + "}"


def compact_run(root: Path | str, run: str) -> bool:
    """Write the run's compacted files and manifest (module docs); False when there is nothing
    to compact (a run of one trace: each of its tables is one file already) or the store is not
    a local folder. Safe to run again, and beside readers and other writers."""
    if is_url(root):
        return False  # an object store: its readers read a local mirror of the parts
    root = Path(root)
    if not (root / "sources" / f"run={run}").is_dir():
        return False
    tables = sorted(t.name for t in os.scandir(root) if t.is_dir() and not t.name.startswith(".")
                    and (Path(t.path) / f"run={run}").is_dir())
    parts = list_parts(root, tables, {run}).get(run, {})
    if len(parts.get("sources", [])) < 2:
        return False
    from stepscope.store import engine

    con = engine.connect(limit="25%", threads=2)
    try:
        con.execute("SET preserve_insertion_order = true")
        versions = sorted({int(v) for (v,) in con.execute(
            f"SELECT DISTINCT decode(value) FROM parquet_kv_metadata({_sql_list([p.path for p in parts['sources']])}) "
            f"WHERE decode(key) = '{SCHEMA_VERSION_KEY.decode()}'").fetchall()})
        # a table of the database, not a temporary one: the cursors of the threads below read it
        con.execute(f"CREATE TABLE committed AS SELECT rank, source FROM "
                    f"read_parquet({_sql_list([p.path for p in parts['sources']])}, {HIVE})")
        folder = _run_dir(root, run)
        folder.mkdir(parents=True, exist_ok=True)
        token = secrets.token_hex(8)
        tables = sorted((t for t in parts if t not in RAW_TABLES), key=lambda t: -sum(p.size for p in parts[t]))
        with ThreadPoolExecutor(max_workers=COMPACT_THREADS) as pool:
            names = pool.map(lambda t: _compact_table(con, folder, t, parts[t], token), tables)
            written = dict(sorted(zip(tables, names)))
    finally:
        con.close()
    doc = {"format": MANIFEST_FORMAT, "tables": written, "parts": _fingerprint(parts), "versions": versions}
    write_text_atomic(folder / MANIFEST, json.dumps(doc))
    _remove_stale(folder, set(written.values()))
    return True


COMPACT_THREADS = 2
"""Tables compacted at once, largest first: each is one ``COPY`` whose fixed cost (binding the
run's parts, writing a file) one thread would pay in turn. Quiet 2-core machine, alternated: 8
small ranks (27 tables) 0.19-0.26 s on one thread, 0.15 s on two; 64 copies of df_index_resolver
1.40-1.70 s on one, 1.12-1.19 s on two."""


def _compact_table(con: duckdb.DuckDBPyConnection, folder: Path, table: str, table_parts: list[Part],
                   token: str) -> str:
    """Write ``table``'s compacted file of the run's committed rows, on a cursor of ``con`` of its
    own (a thread's); its name."""
    name = f"{table}-{token}.parquet"
    select = f"SELECT * FROM read_parquet({_sql_list([p.path for p in table_parts])}, {HIVE}) t"
    if table != "sources":
        select += " SEMI JOIN committed c ON t.rank = c.rank AND t.source = c.source"
    cursor = con.cursor()
    try:
        with atomic_path(folder / name) as tmp:
            cursor.execute(f"COPY ({select}) TO '{tmp}' (FORMAT parquet, COMPRESSION zstd, KV_METADATA {_kv(table)})")
    finally:
        cursor.close()
    return name


def compact_runs(root: Path | str, runs: set[str]) -> None:
    """:func:`compact_run` for each of ``runs`` after an ingest committed into them. A compaction
    that fails costs nothing but speed (the run is read from its parts): a warning, no error."""
    for run in sorted(runs):
        try:
            compact_run(root, run)
        except (OSError, duckdb.Error) as exc:
            log.warning("%s: run %s not compacted (%s); it is read from its parts", root, run, exc)


def _remove_stale(folder: Path, keep: set[str]) -> None:
    """Remove compacted files (and temporaries) the manifest does not name, once old enough."""
    now = time.time()
    for entry in os.scandir(folder):
        if entry.name == MANIFEST or entry.name in keep:
            continue
        with contextlib.suppress(OSError):
            if now - entry.stat().st_mtime > STALE_S:
                os.unlink(entry.path)
