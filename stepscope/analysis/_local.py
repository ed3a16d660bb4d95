"""SQL over Arrow tables already fetched from the store.

An analysis whose expensive part is one query over the store's events (a sweep, a join of
launches to markers) runs that query once and derives its frames from the result here, in a
private in-memory DuckDB, instead of repeating the expensive part once per frame.
"""

from __future__ import annotations

import functools

import duckdb
import pyarrow as pa

from stepscope.store.catalog import connect
from stepscope.store.engine import resolve_memory_limit


@functools.lru_cache(maxsize=1)
def _database(memory_limit: str) -> duckdb.DuckDBPyConnection:
    """This process's one private database for these queries (opening a connection costs tens
    of milliseconds, and a summary runs a dozen of them), made again when the memory limit in
    force changes (``$STEPSCOPE_MEMORY_LIMIT`` set after the first query)."""
    return connect(limit=memory_limit)  # the tool's thread and memory limits, as the store's own


def local_sql(query: str, params: dict[str, object] | None = None, **tables: pa.Table) -> pa.Table:
    """Run ``query`` with each keyword's Arrow table visible under its name (registered on a
    cursor of its own: two threads' queries never see each other's tables)."""
    con = _database(resolve_memory_limit(None)).cursor()
    try:
        for name, table in tables.items():
            con.register(name, table)
        return con.sql(query, params=params).to_arrow_table()
    finally:
        con.close()
