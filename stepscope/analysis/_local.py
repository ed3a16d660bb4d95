"""SQL over Arrow tables already fetched from the store.

An analysis whose expensive part is one query over the store's events (a sweep, a join of
launches to markers) runs that query once and derives its frames from the result here, in a
private in-memory DuckDB, instead of repeating the expensive part once per frame.
"""

from __future__ import annotations

import pyarrow as pa

from stepscope.store.catalog import connect


def local_sql(query: str, params: dict[str, object] | None = None, **tables: pa.Table) -> pa.Table:
    """Run ``query`` with each keyword's Arrow table visible under its name."""
    con = connect()  # the tool's thread and memory limits, as on the store's own connection
    try:
        for name, table in tables.items():
            con.register(name, table)
        return con.sql(query, params=params).to_arrow_table()
    finally:
        con.close()
