"""The catalog's views over a store: how a table without parts reads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from stepscope.store import open_store, schema


def _types(store, relation: str) -> dict[str, str]:
    return {row["column_name"]: row["column_type"] for row in store.sql(f"DESCRIBE {relation}").to_pylist()}


def test_an_empty_table_is_typed_as_duckdb_reads_the_parts(sample_run: Callable[[str], Path]) -> None:
    """A view whose table has no part reads an empty table of the table's columns (and under the
    parts of a table that gained columns, unions with it): each column must have the type DuckDB
    gives it reading a part, or a union would cast, and a store without parts would answer in
    other types than one with. Checked on every table of a sample run's store, whose views read
    its parts (or, for a table it has none of, the empty table itself)."""
    with open_store(sample_run("gloo-3ranks-late")) as store:
        for table in schema.TABLES.values():
            store._empty_relation(table)
            empty = _types(store, f"_empty_{table.name}")
            assert list(empty) == [*table.schema.names, "run", "rank"]
            view = _types(store, f"(SELECT * FROM {table.name})")
            assert {column: empty[column] for column in view} == view, table.name
