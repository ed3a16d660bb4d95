"""Make a store look written by an older schema version, for the tests of ``stepscope migrate``."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

import pyarrow.parquet as pq


def as_older_version(store: Path, version: int, tables: Iterable[str], columns: Iterable[str] = ()) -> None:
    """Remove ``tables`` (which that version did not have) and the ``sources`` columns
    ``columns``, and write ``version`` into the ``sources`` parts' metadata: what
    ``stepscope migrate`` must bring back."""
    for name in tables:
        shutil.rmtree(store / name, ignore_errors=True)
    dropped = {*columns, "run", "rank"}  # run and rank come from the partition path
    for part in (store / "sources").rglob("*.parquet"):
        table = pq.read_table(part)
        table = table.drop_columns([c for c in table.column_names if c in dropped])
        metadata = {**(table.schema.metadata or {}), b"stepscope.schema_version": str(version).encode(),
                    b"stepscope.table": b"sources"}
        pq.write_table(table.replace_schema_metadata(metadata), part)
