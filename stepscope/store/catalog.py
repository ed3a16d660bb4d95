"""DuckDB catalog over a store folder: one view per table, parameterised SQL, read-only mode.

Every later layer queries through ``Store.sql`` so there is one place that knows the file
layout, the partition types, the commit rule (rows count only once their ``sources`` row
exists) and the schema-version check.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

import duckdb
import pyarrow as pa

from stepscope.errors import InternalError, StoreError, UsageError
from stepscope.store import schema
from stepscope.store.engine import DEFAULT_MEMORY_LIMIT, MEMORY_LIMIT_ENV, THREADS, connect, resolve_memory_limit
from stepscope.store.location import is_url, store_files

__all__ = ["DEFAULT_MEMORY_LIMIT", "MEMORY_LIMIT_ENV", "THREADS", "Store", "connect", "open_store",
           "resolve_memory_limit"]

READ_ONLY_STATEMENTS = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})

_HIVE = "hive_partitioning = true, hive_types = {'run': VARCHAR, 'rank': INTEGER}, union_by_name = true"


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _sql_list(paths: list[str]) -> str:
    return "[" + ", ".join(_sql_string(p) for p in paths) + "]"


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
        with self._own_query():
            self._check_version()
            # The sandbox may read exactly the Parquet files the store holds now, so its views list
            # them; the trusted views glob, and see parts committed later too.
            self._parts = {t: self._part_files(t) for t in schema.TABLES} if read_only_sql else None
            self._create_views()
        if self._parts is not None:
            self._lock_down(self._parts)

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

    def _files_exist(self, table: str) -> bool:
        return self._files.has_parts(table)

    def _part_files(self, table: str) -> list[str]:
        return self._files.part_files(table)

    def _glob(self, table: str) -> str:
        return _sql_string(self._files.glob(table))

    def _check_version(self) -> None:
        if not self._files_exist("sources"):
            return
        rows = self._con.execute(
            "SELECT DISTINCT decode(value) FROM parquet_kv_metadata(" + self._glob("sources") + ") "
            "WHERE decode(key) = 'stepscope.schema_version'"
        ).fetchall()
        versions = sorted(int(v) for (v,) in rows)
        if versions and versions[-1] > schema.SCHEMA_VERSION:
            raise StoreError(
                f"{self.root}: store written with schema version {versions[-1]}, newer than this "
                f"stepscope understands ({schema.SCHEMA_VERSION}); upgrade stepscope"
            )
        if versions and versions[0] < schema.SCHEMA_VERSION:
            raise StoreError(
                f"{self.root}: store written with schema version {versions[0]}, older than this "
                f"stepscope's ({schema.SCHEMA_VERSION}); bring it up to date once with "
                f"`stepscope migrate --store {self.root}`"
            )

    def _empty_relation(self, table: schema.Table) -> None:
        empty = table.schema.empty_table()
        empty = empty.append_column("run", pa.array([], pa.string()))
        empty = empty.append_column("rank", pa.array([], pa.int32()))
        # A table of the database, not a registered Arrow object: every session() sees it too.
        self._con.from_arrow(empty).create(f"_empty_{table.name}")

    def _create_views(self) -> None:
        con = self._con
        for table in schema.TABLES.values():
            name = table.name
            if self._parts is not None and self._parts[name]:
                base = f"read_parquet({_sql_list(self._parts[name])}, {_HIVE})"
            elif self._parts is None and self._files_exist(name):
                base = f"read_parquet({self._glob(name)}, {_HIVE})"
            else:
                self._empty_relation(table)
                base = f"_empty_{name}"
            if name in schema.GROWING_TABLES and not base.startswith("_empty_"):
                # Parts written before a column was added read it as null.
                self._empty_relation(table)
                base = f"(SELECT * FROM _empty_{name} UNION ALL BY NAME SELECT * FROM {base})"
            if name == "sources":
                con.execute(f"CREATE VIEW sources AS SELECT * FROM {base}")
            else:
                con.execute(
                    f"CREATE VIEW {name} AS SELECT t.* FROM {base} t "
                    "SEMI JOIN sources s ON t.run = s.run AND t.rank = s.rank AND t.source = s.source"
                )
        con.execute(
            """
            CREATE VIEW runs AS
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
            CREATE VIEW windows AS
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

    def _lock_down(self, parts: dict[str, list[str]]) -> None:
        """No file access but to the store's Parquet parts (not its other files, not a writer's
        temporary part, not DuckDB's temporary folder), no extensions, settings frozen."""
        allowed = [path for table in parts.values() for path in table]
        self._con.execute(f"SET allowed_paths = {_sql_list(allowed)}")
        self._con.execute("SET enable_external_access = false")
        self._con.execute("SET autoinstall_known_extensions = false")
        self._con.execute("SET autoload_known_extensions = false")
        self._con.execute("SET lock_configuration = true")

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
