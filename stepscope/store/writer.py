"""Atomic Parquet writes into the Hive-partitioned store.

A part is written through :func:`stepscope.store.atomic.atomic_write`: a temporary name of its
own, ``<name>.parquet.<pid>.<random>.tmp`` (which the ``*.parquet`` globs never match), flushed
to disk, and renamed into place, so a reader sees either the whole file or nothing. The name is
unique per writer: two processes writing the same part (two ingests of one file, a collector rank
and an offline ingest) each rename a complete file of their own, and the last rename wins. A
crash or ``kill -9`` leaves at most a stray temporary file, which a later write of the same part
removes once it is ``STALE_TMP_S`` old.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from stepscope.store import schema
from stepscope.store.atomic import atomic_write

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def run_id(name: str) -> str:
    """Directory-safe id of a run name: characters outside ``[A-Za-z0-9._-]`` become ``-``."""
    cleaned = _UNSAFE.sub("-", name).strip("-.")
    if not cleaned:
        raise ValueError(f"run name {name!r} has no usable characters")
    return cleaned


def partition_dir(root: Path, table: str, run: str, rank: int) -> Path:
    """``<root>/<table>/run=<run>/rank=<rank>``."""
    return Path(root) / table / f"run={run}" / f"rank={rank}"


def part_path(root: Path, table: str, run: str, rank: int, source: str) -> Path:
    return partition_dir(root, table, run, rank) / f"part-{source}.parquet"


def _encodings(spec: pa.Schema) -> dict[str, object]:
    """Delta-encode integer columns (times and ids are near-sorted), dictionary-encode the rest.

    On the 54 MB df_index_resolver trace this takes the events part from 3.2 MB to 2.5 MB (below
    the 2.9 MB gzipped JSON) and writes faster than plain dictionary encoding.
    """
    ints = [f.name for f in spec if pa.types.is_integer(f.type)]
    return {
        "use_dictionary": [f.name for f in spec if f.name not in ints],
        "column_encoding": {name: "DELTA_BINARY_PACKED" for name in ints},
    }


def write_partition(root: Path | str, table: str, run: str, rank: int, source: str,
                    data: pa.Table) -> Path:
    """Write ``data`` as the part of ``table`` that ``source`` contributes to (run, rank).

    The table must match the schema in ``stepscope.store.schema``; the file carries
    ``SCHEMA_VERSION`` in its metadata. Writing the same part again replaces it atomically, also
    while another process writes it.
    """
    spec = schema.TABLES[table].schema
    data = data.cast(spec).replace_schema_metadata(schema.file_metadata(table))
    target = part_path(Path(root), table, run, int(rank), source)
    with atomic_write(target) as handle:
        pq.write_table(data, handle, compression="zstd", compression_level=3,
                       row_group_size=256 * 1024, **_encodings(spec))
    return target
