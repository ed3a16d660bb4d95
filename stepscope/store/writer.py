"""Atomic Parquet writes into the Hive-partitioned store.

A part is written through :mod:`stepscope.store.atomic`: a temporary name of its own,
``<name>.parquet.<pid>.<random>.tmp`` (which the ``*.parquet`` globs never match), flushed to
disk, and renamed into place, so a reader sees either the whole file or nothing. The name is
unique per writer: two processes writing the same part (two ingests of one file, a collector rank
and an offline ingest) each rename a complete file of their own, and the last rename wins. A
crash or ``kill -9`` leaves at most a stray temporary file, which a later write of the same part
removes once it is ``STALE_TMP_S`` old.

A part's rows are an Arrow table (the collector's tables, ``sources``) or a ``PartSource`` that
writes the file itself (ingest's DuckDB queries); this module imports pyarrow only for the first.

The ~25 parts of one trace are written as one :class:`~stepscope.store.atomic.AtomicBatch`
(ingest's ``convert_file``): each under its temporary name, then all flushed to disk at once and
renamed into place.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Union

from stepscope.errors import UsageError
from stepscope.store.atomic import AtomicBatch, atomic_path, atomic_write, move_file
from stepscope.store.constants import file_metadata
from stepscope.store.location import is_url

if TYPE_CHECKING:
    import pyarrow as pa

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def run_id(name: str) -> str:
    """Directory-safe id of a run name: characters outside ``[A-Za-z0-9._-]`` become ``-``."""
    cleaned = _UNSAFE.sub("-", name).strip("-.")
    if not cleaned:
        raise UsageError(f"run name {name!r} has no usable characters (letters, digits, '.', '_', '-')")
    return cleaned


def partition_dir(root: Path, table: str, run: str, rank: int) -> Path:
    """``<root>/<table>/run=<run>/rank=<rank>``."""
    return Path(root) / table / f"run={run}" / f"rank={rank}"


def part_path(root: Path, table: str, run: str, rank: int, source: str) -> Path:
    return partition_dir(root, table, run, rank) / f"part-{source}.parquet"


def remove_uncommitted(root: Path, tables: Iterable[str], run: str, rank: int, source: str) -> None:
    """Remove a source's parts of ``tables``, unless its ``sources`` row (written last, at the
    commit) made them visible: a committed copy of the same file owns them then."""
    if part_path(root, "sources", run, rank, source).is_file():
        return
    for table in tables:
        with contextlib.suppress(OSError):
            part_path(root, table, run, rank, source).unlink()


class PartSource(Protocol):
    """Something that writes a part's rows as a Parquet file itself (a DuckDB query)."""

    def write_parquet(self, path: Path, metadata: dict[bytes, bytes]) -> None: ...


PartData = Union["pa.Table", PartSource]

def _encodings(spec: "pa.Schema") -> dict[str, object]:
    """Delta-encode integer columns (times and ids are near-sorted), dictionary-encode the rest.

    On the 54 MB df_index_resolver trace this takes the events part from 3.2 MB to 2.5 MB (below
    the 2.9 MB gzipped JSON) and writes faster than plain dictionary encoding.
    """
    import pyarrow as pa

    ints = [f.name for f in spec if pa.types.is_integer(f.type)]
    return {
        "use_dictionary": [f.name for f in spec if f.name not in ints],
        "column_encoding": {name: "DELTA_BINARY_PACKED" for name in ints},
    }


def write_partition(root: Path | str, table: str, run: str, rank: int, source: str,
                    data: PartData, *, batch: AtomicBatch | None = None) -> Path | str:
    """Write ``data`` as the part of ``table`` that ``source`` contributes to (run, rank); on
    object storage (``root`` a URL) it is written here and uploaded (one PUT); returns its path.
    With ``batch`` (a local store, a ``PartSource``) the part is written under a temporary name,
    which is returned, and put in place by ``batch.place()``.

    ``data`` is an Arrow table matching the schema in ``stepscope.store.schema``, or a
    ``PartSource`` (ingest's DuckDB queries, which select exactly those columns); the file
    carries ``SCHEMA_VERSION`` in its metadata. Writing the same part again replaces it
    atomically, also while another process writes it.
    """
    if is_url(root):
        return _write_remote(str(root), table, run, rank, source, data)
    target = part_path(Path(root), table, run, int(rank), source)
    if batch is not None and hasattr(data, "write_parquet"):
        tmp = batch.add(target)
        data.write_parquet(tmp, file_metadata(table))
        return tmp
    if hasattr(data, "write_parquet"):
        with atomic_path(target) as tmp:
            data.write_parquet(tmp, file_metadata(table))
        return target
    import pyarrow.parquet as pq

    from stepscope.store import schema

    spec = schema.TABLES[table].schema
    table_data = data.cast(spec).replace_schema_metadata(file_metadata(table))
    with atomic_write(target) as handle:
        pq.write_table(table_data, handle, compression="zstd", compression_level=3,
                       row_group_size=256 * 1024, **_encodings(spec))
    return target


def _write_remote(url: str, table: str, run: str, rank: int, source: str, data: PartData) -> str:
    """``write_partition`` into the store at ``url``: written in a local temporary folder, then
    uploaded to its key (the collector's tables beside a committed trace)."""
    from stepscope.store.objectstore import RemoteStore

    store = RemoteStore(url)
    work = Path(tempfile.mkdtemp(prefix="stepscope-part-"))
    try:
        written = write_partition(work, table, run, rank, source, data)
        store.upload(work, [Path(written)])
        return f"{store.url}/{Path(written).relative_to(work).as_posix()}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def move_part(root: Path, table: str, run: str, rank: int, source: str, to_run: str) -> None:
    """Move an uncommitted part to another run (a rename: same file system, atomic)."""
    move_file(part_path(root, table, run, rank, source), part_path(root, table, to_run, rank, source))
