"""DuckDB catalog over a store folder: one view per table, parameterised SQL, read-only mode.

Every later layer queries through ``Store.sql`` so there is one place that knows the file
layout, the partition types, the commit rule (rows count only once their ``sources`` row
exists) and the schema-version check.

A ``Store`` reads the store's file list once, when it opens (:func:`stepscope.store.compact.read_plan`):
its views name exactly those files, a run's compacted files (one per table) where they match
its parts, else the parts. So a query binds a number of files that does not grow with the
ranks, and what one ``Store`` answers never changes under it: the analyses may keep what they
computed for as long as it is open (:meth:`Store.memo`). :meth:`Store.refresh` lists the files
again (the dashboard does, every few seconds, to show new ingests).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import duckdb
import pyarrow as pa

from stepscope.errors import InternalError, StoreError, UsageError
from stepscope.store import compact, schema
from stepscope.store.engine import (DEFAULT_MEMORY_LIMIT, MEMORY_LIMIT_ENV, THREADS, connect, resolve_memory_limit,
                                    scratch)
from stepscope.store.location import is_url, store_files

__all__ = ["DEFAULT_MEMORY_LIMIT", "MEMORY_LIMIT_ENV", "THREADS", "Store", "connect", "open_store",
           "resolve_memory_limit"]

READ_ONLY_STATEMENTS = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})

_HIVE = compact.HIVE
_RAW_HIVE = "hive_partitioning = true, hive_types = {'run': VARCHAR, 'rank': INTEGER}"
"""The raw tables' parts (never compacted) are read by name against the first part's columns:
every part of one schema version has the same columns and types, and ``union_by_name`` would
open every part of the store whenever a view is bound (at 1,024 ranks, seconds per open)."""


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _sql_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_list(paths: list[str]) -> str:
    return "[" + ", ".join(_sql_string(p) for p in paths) + "]"


@functools.lru_cache(maxsize=None)
def _empty_columns(name: str) -> str:
    """The columns of table ``name`` with ``run`` and ``rank``, typed as DuckDB types them reading
    a part, as a column list for ``CREATE TABLE``: the relation a view reads where the table has
    no part, or under the parts of a table that gained columns. Found once per process, through
    an empty Parquet file (not ``Schema.empty_table``: it imports pandas, a second; nor an Arrow
    table handed to DuckDB, whose import of one loads pandas); a store's every open, ~8 tables,
    then writes and removes no file (~18 ms of an open's ~105 on a one-trace store)."""
    import pyarrow.parquet as pq

    fields = [*schema.TABLES[name].schema, pa.field("run", pa.string()), pa.field("rank", pa.int32())]
    empty = pa.Table.from_arrays([pa.nulls(0, f.type) for f in fields], schema=pa.schema(fields))
    with tempfile.TemporaryDirectory(prefix="stepscope-empty-") as folder:
        path = str(Path(folder) / f"{name}.parquet")
        pq.write_table(empty, path)
        columns = scratch().execute(f"DESCRIBE SELECT * FROM read_parquet({_sql_string(path)})").fetchall()
    return ", ".join(f"{_sql_identifier(column)} {column_type}" for column, column_type, *_ in columns)


MEMO_ENTRIES = 256
"""Results :meth:`Store.memo` keeps (each frame of a run is one)."""


class _Shared:
    """What a ``Store`` and its :meth:`~Store.session` twins share: the file list the views read
    and what the analyses memoised over it."""

    def __init__(self) -> None:
        self.plan = compact.ReadPlan()
        self.listed_at = time.monotonic()
        """When the store's files were last listed (``time.monotonic``): at the open or the last
        :meth:`Store.refresh`, whether or not it found them changed."""
        self.memo: dict[tuple[Any, ...], Any] = {}
        self.tables: dict[str, str] = {}
        """What :meth:`Store.materialize` made: the hash of its query and parameters -> the table (dropped
        when the file list changes)."""
        self.lock = threading.Lock()
        self.memo_lock = threading.Lock()
        self.computing: dict[tuple[Any, ...], threading.Event] = {}
        """Keys whose ``compute`` runs now, each with the event set when it ends."""


class Store:
    """A store folder opened for queries.

    Views: one per table in ``schema.TABLES`` (committed rows only) plus ``runs`` (one row per
    run) and ``windows`` (one row per rank and profiled window, captures labelled). Queries take
    parameters (``$name`` or ``?``); user input is never formatted into SQL.
    """

    def __init__(self, root: Path | str, *, read_only_sql: bool = False,
                 memory_limit: str | None = None) -> None:
        self.root: Path | str = root if is_url(root) else Path(root)
        self._files = store_files(self.root)
        if not self._files.exists():
            raise StoreError(f"{self.root}: no such store (run `stepscope ingest ... --store {self.root}` first)")
        self._cache_root = self._files.cache_root()
        if is_url(self.root):  # queries read this machine's copy of the committed parts
            self._files = store_files(self._files.mirror())
        self._lock = threading.Lock()
        self.memory_limit = resolve_memory_limit(memory_limit)
        self._con = connect(limit=self.memory_limit, spill=not read_only_sql)
        self._shared = _Shared()
        with self._own_query():
            self._shared.plan = compact.read_plan(self._files.root, list(schema.TABLES))
            self._shared.listed_at = time.monotonic()
            self._check_version()
            self._create_views()
        if read_only_sql:
            self._lock_down(self._shared.plan.files())

    @property
    def cache_root(self) -> Path:
        """The folder of this machine where the analysis layer caches the store's frames (the
        store itself when it is a local folder)."""
        return self._cache_root

    @property
    def parts_root(self) -> Path:
        """The folder of this machine whose parts the queries read: the store itself, or this
        machine's copy of an object store's committed parts."""
        return self._files.root

    def _check_version(self) -> None:
        parts = self._shared.plan.parts.get("sources", [])
        versions = set(self._shared.plan.versions)
        if parts:
            rows = self._con.execute(
                "SELECT DISTINCT decode(value) FROM parquet_kv_metadata(" + _sql_list(parts) + ") "
                "WHERE decode(key) = 'stepscope.schema_version'"
            ).fetchall()
            versions.update(int(v) for (v,) in rows)
        ordered = sorted(versions)
        if ordered and ordered[-1] > schema.SCHEMA_VERSION:
            raise StoreError(
                f"{self.root}: store written with schema version {ordered[-1]}, newer than this "
                f"stepscope understands ({schema.SCHEMA_VERSION}); upgrade stepscope"
            )
        if ordered and ordered[0] < schema.SCHEMA_VERSION:
            raise StoreError(
                f"{self.root}: store written with schema version {ordered[0]}, older than this "
                f"stepscope's ({schema.SCHEMA_VERSION}); bring it up to date once with "
                f"`stepscope migrate --store {self.root}`"
            )

    def _empty_relation(self, table: schema.Table) -> None:
        # A table of the database, not a registered Arrow object: every session() sees it too.
        self._con.execute(f"CREATE OR REPLACE TABLE _empty_{table.name} ({_empty_columns(table.name)})")

    def _base(self, table: schema.Table) -> str:
        """The relation a table's view selects from: the compacted files of the runs that have
        them (committed rows only, ``run`` and ``rank`` stored), then the parts of the others
        (committed or not: the view keeps the committed)."""
        name = table.name
        compacted, parts = self._shared.plan.compacted.get(name, []), self._shared.plan.parts.get(name, [])
        relations = []
        if compacted:
            relations.append(f"SELECT * FROM read_parquet({_sql_list(compacted)}, union_by_name = true)")
        if parts:
            hive = _RAW_HIVE if name in compact.RAW_TABLES else _HIVE
            scan = f"SELECT * FROM read_parquet({_sql_list(parts)}, {hive})"
            if name != "sources":
                scan = (f"SELECT t.* FROM read_parquet({_sql_list(parts)}, {hive}) t "
                        "SEMI JOIN sources s ON t.run = s.run AND t.rank = s.rank AND t.source = s.source")
            relations.append(scan)
        if not relations:
            self._empty_relation(table)
            return f"SELECT * FROM _empty_{name}"
        body = " UNION ALL BY NAME ".join(relations)
        if name in schema.GROWING_TABLES:
            # Parts written before a column was added read it as null.
            self._empty_relation(table)
            body = f"SELECT * FROM _empty_{name} UNION ALL BY NAME {body}"
        return body

    def _create_views(self) -> None:
        con = self._con
        # Every file of the plan has a name of its own (compacted files are never rewritten: a
        # new token each time) or is rewritten only with the rows it held (a raw part, when its
        # trace is converted again): DuckDB's cached footers cannot go stale under this Store.
        unique = not any(files for table, files in self._shared.plan.parts.items() if table not in compact.RAW_TABLES)
        con.execute(f"SET parquet_metadata_cache = {'true' if unique else 'false'}")
        for table in (schema.TABLES["sources"], *(t for t in schema.TABLES.values() if t.name != "sources")):
            con.execute(f"CREATE OR REPLACE VIEW {table.name} AS {self._base(table)}")
        con.execute(
            """
            CREATE OR REPLACE VIEW runs AS
            SELECT run,
                   any_value(run_name) AS name,
                   min(ingested_at) AS created_at,
                   count(DISTINCT rank) AS ranks,
                   max(world_size) AS world_size,
                   any_value(backend) AS backend,
                   any_value(gpu_name) AS gpu_name,
                   max(gpu_count) AS gpu_count,
                   any_value(trace_schema_version) AS trace_schema_version,
                   sum(event_count) AS events,
                   list({'rank': rank, 'path': path, 'sha256': sha256} ORDER BY rank, path) AS sources,
                   any_value(tags) AS tags
            FROM sources GROUP BY run
            """
        )
        # One row per rank and profiled window (trace): a capture when the watch labelled it.
        con.execute(
            """
            CREATE OR REPLACE VIEW windows AS
            WITH w AS (
              SELECT run, rank, source::VARCHAR AS source, min(step) AS first_step,
                     max(step) AS last_step, count(*) AS steps
              FROM steps GROUP BY ALL
            )
            SELECT w.run, w.rank, w.source, w.first_step, w.last_step, w.steps,
                   CASE WHEN c.source IS NULL THEN 'schedule' ELSE 'capture' END AS kind,
                   c.trigger_kind::VARCHAR AS trigger_kind, c.trigger_rank, c.trigger_step,
                   c.observed_ns, c.reference_ns, c.agreed_step
            FROM w LEFT JOIN captures c
              ON c.run = w.run AND c.rank = w.rank AND c.source::VARCHAR = w.source
            """
        )

    def _lock_down(self, allowed: list[str]) -> None:
        """No file access but to the files the views read (not the store's other files, not a
        writer's temporary part, not DuckDB's temporary folder), no extensions, settings frozen."""
        self._con.execute(f"SET allowed_paths = {_sql_list(allowed)}")
        self._con.execute("SET enable_external_access = false")
        self._con.execute("SET autoinstall_known_extensions = false")
        self._con.execute("SET autoload_known_extensions = false")
        self._con.execute("SET lock_configuration = true")

    def refresh(self) -> bool:
        """List the store's files again; when they changed (an ingest, a compaction, a part
        rewritten), point the views at the new list and forget what was memoised. True when
        they changed. The views are the database's: the :meth:`session` twins see them too."""
        plan = compact.read_plan(self._files.root, list(schema.TABLES))
        with self._shared.lock:
            self._shared.listed_at = time.monotonic()
            if plan.listing == self._shared.plan.listing and plan.files() == self._shared.plan.files():
                return False
            with self._lock, self._own_query():
                self._shared.plan = plan
                self._shared.memo.clear()
                for name in self._shared.tables.values():
                    self._con.execute(f"DROP TABLE IF EXISTS {name}")
                self._shared.tables.clear()
                self._check_version()
                self._create_views()
        return True

    def listed_age_s(self) -> float:
        """Seconds since the store's files were last listed (opened or refreshed): a caller that
        would refresh a store listed a moment ago (1,024 ranks: ~0.4 s a listing) can skip it."""
        return time.monotonic() - self._shared.listed_at

    def memo(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        """``compute()``, once per ``key`` while this store's file list stays what it is: the
        views read a fixed list of files, so a result computed over them stays true until
        :meth:`refresh` finds another list (shared with the :meth:`session` twins). The
        :data:`MEMO_ENTRIES` used last are kept (a dashboard server visits many runs).

        Twins in other threads asking for a key being computed wait for that computation rather
        than repeating it (the summary's sections run on two threads and share their inputs: the
        matched collectives, the step breakdown); when it fails, the next one computes it."""
        shared = self._shared
        while True:
            with shared.memo_lock:
                if key in shared.memo:
                    shared.memo[key] = value = shared.memo.pop(key)  # the most recently used last
                    return value
                running = shared.computing.get(key)
                if running is None:
                    running = shared.computing[key] = threading.Event()
                    break
            running.wait()
        try:
            value = compute()  # outside the lock: it may memoise (or materialise) what it needs
            with shared.memo_lock:
                shared.memo[key] = value
                while len(shared.memo) > MEMO_ENTRIES:
                    shared.memo.pop(next(iter(shared.memo)))
            return value
        finally:
            with shared.memo_lock:
                del shared.computing[key]
            running.set()

    def materialize(self, query: str, params: dict[str, Any] | None = None) -> str:
        """Run ``query`` into a table of this store's database, once per query and parameters,
        and return the table's name, for later queries to read (a relation several analyses
        build on: the collectives matched across ranks). The twins of :meth:`session` see it
        too; :meth:`refresh` drops it when the file list changes."""
        key = hashlib.sha256(repr((query, sorted((params or {}).items()))).encode()).hexdigest()
        with self._shared.lock:
            name = self._shared.tables.get(key)
            if name is None:
                name = f"_materialized_{len(self._shared.tables)}"
                with self._lock, self._own_query():
                    self._con.execute(f"CREATE OR REPLACE TABLE {name} AS {query}", params)
                self._shared.tables[key] = name
        return name

    def part_stamps(self, run: str, tables: tuple[str, ...]) -> list[tuple[str, int, int]]:
        """``(path under the store, size, mtime_ns)`` of the run's parts of ``tables`` as listed
        when the store opened (or last refreshed): what a cache key of the run's files needs,
        without walking the folders again."""
        return self._shared.plan.stamps(run, tables)

    @property
    def tables(self) -> tuple[str, ...]:
        return (*schema.TABLES, "runs", "windows")

    def sql(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> pa.Table:
        """Run one query and return an Arrow table. ``params`` bind ``?`` or ``$name``.

        This is stepscope's own door (the analyses'): a failing query is an :class:`InternalError`,
        or a :class:`StoreError` when DuckDB names a damaged file of this store. User SQL goes
        through :meth:`read_only_query`, whose errors are the user's (:class:`UsageError`).
        """
        with self._lock, self._own_query():
            return self._con.sql(query, params=params).to_arrow_table()

    @contextlib.contextmanager
    def _own_query(self) -> Iterator[None]:
        """DuckDB errors of stepscope's own queries, by whose fault they are: a damaged file of
        this store (DuckDB names it) is bad input, anything else an internal error. One line:
        DuckDB's first, without the SQL it quotes."""
        try:
            yield
        except duckdb.Error as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if any(str(place) in first for place in self._places()):
                raise StoreError(f"{self.root}: a store file cannot be read ({first})") from exc
            raise InternalError(f"query failed: {first}") from exc

    def _places(self) -> tuple[str, ...]:
        """How DuckDB may name a file of this store in an error."""
        local = (str(self._files.root), str(self._files.root.resolve()))
        return local if isinstance(self.root, Path) else (self.root, *local)

    def df(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> Any:
        """Like ``sql`` but returns a pandas DataFrame (imports pandas only when asked)."""
        return self.sql(query, params).to_pandas()

    def read_only_query(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None,
                        *, max_rows: int | None = None, timeout_s: float | None = None
                        ) -> tuple[pa.Table, bool]:
        """Run user SQL that may only read: one SELECT/EXPLAIN statement.

        Returns the rows (at most ``max_rows``) and whether more were cut off. A query still
        running after ``timeout_s`` is interrupted and raises ``UsageError`` saying so.
        """
        if not timeout_s:
            return self._read_only_query(query, params, max_rows)
        fired = threading.Event()

        def stop() -> None:
            fired.set()
            self.interrupt()

        timer = threading.Timer(timeout_s, stop)
        timer.start()
        try:
            return self._read_only_query(query, params, max_rows)
        except UsageError as exc:
            if fired.is_set():
                raise UsageError(f"query stopped after the {timeout_s:g} s limit") from exc
            raise
        finally:
            timer.cancel()

    def _read_only_query(self, query: str, params: Sequence[Any] | dict[str, Any] | None,
                         max_rows: int | None) -> tuple[pa.Table, bool]:
        try:
            statements = self._con.extract_statements(query)
        except duckdb.Error as exc:
            raise UsageError(f"SQL error: {exc}") from exc
        if len(statements) != 1:
            raise UsageError("give exactly one SQL statement")
        if statements[0].type not in READ_ONLY_STATEMENTS:
            raise UsageError(f"only SELECT queries are allowed here, not {statements[0].type.name}")
        with self._lock:
            try:
                result = self._con.sql(query, params=params)
                if max_rows is None:
                    return result.to_arrow_table(), False
                reader = result.to_arrow_reader(max_rows + 1)
                rows = pa.Table.from_batches(list(_take(reader, max_rows + 1)), reader.schema)
            except duckdb.OutOfMemoryException as exc:
                raise UsageError(f"SQL error: {' '.join(str(exc).split())} (the memory limit is "
                                 f"{self.memory_limit}: --memory-limit or ${MEMORY_LIMIT_ENV})") from exc
            except duckdb.Error as exc:
                raise UsageError(f"SQL error: {exc}") from exc
        return rows.slice(0, max_rows), rows.num_rows > max_rows

    def interrupt(self) -> None:
        """Stop the running query (used for time limits)."""
        self._con.interrupt()

    def session(self) -> Store:
        """A ``Store`` on the same database (its views) with a connection of its own (a DuckDB
        cursor): its queries neither wait for this one's nor are stopped by its
        :meth:`interrupt`, and the other way round. For a server with several visitors; closing
        it closes only its connection."""
        twin = copy.copy(self)
        twin._con = self._con.cursor()
        twin._lock = threading.Lock()
        return twin

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _take(reader: pa.RecordBatchReader, limit: int):
    taken = 0
    for batch in reader:
        if taken >= limit:
            break
        batch = batch.slice(0, limit - taken)
        taken += batch.num_rows
        yield batch


def open_store(path: Path | str, *, read_only_sql: bool = False, memory_limit: str | None = None) -> Store:
    """Open a store folder for queries. Raises ``StoreError`` when it is missing or too new.

    ``memory_limit`` (a DuckDB size, ``8GB``, or a share of RAM, ``40%``) overrides
    ``$STEPSCOPE_MEMORY_LIMIT`` and the default, half of RAM."""
    return Store(path, read_only_sql=read_only_sql, memory_limit=memory_limit)
