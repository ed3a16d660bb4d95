"""Make a many-rank run out of one real rank: copies of its store partitions with shifted clocks.

Used by bench_analysis.py's scaled case. Each copy k of the source rank becomes rank k with every
timestamp shifted by ``k * shift_ns`` and its own source id, so the copies are distinct traces to
every query (no shared rows, staggered collectives) while keeping the real trace's structure.
It copies the store's Parquet files (no re-ingest), which keeps the benchmark's setup short.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stepscope.store.writer import part_path, write_partition

TIME_COLUMNS = {
    "events": ("ts_ns",),
    "steps": ("start_ns", "end_ns"),
    "memory": ("ts_ns",),
    "step_times": ("start_ns",),
    "sources": ("trace_start_ns", "trace_end_ns"),
}
TABLES = ("events", "steps", "memory", "step_times", "memory_roles", "sources")  # sources last: it commits


def scale_rank(src_root: Path, run: str, rank: int, dst_root: Path, dst_run: str, copies: int,
               shift_ns: int = 7_000) -> None:
    """Write ``copies`` ranks of ``dst_run`` into ``dst_root``, each a shifted copy of ``rank``."""
    for table in TABLES:
        folder = src_root / table / f"run={run}" / f"rank={rank}"
        files = sorted(folder.glob("*.parquet"))
        if not files:
            continue
        data = pa.concat_tables([pq.read_table(f) for f in files])
        for k in range(copies):
            source = hashlib.sha256(f"{dst_run}/{k}".encode()).hexdigest()[:16]
            copy = data
            for column in TIME_COLUMNS.get(table, ()):
                shifted = pc.add(copy.column(column), pa.scalar(k * shift_ns, pa.int64()))
                copy = copy.set_column(copy.schema.get_field_index(column), column, shifted)
            ids = pa.array([source] * copy.num_rows, pa.string())
            copy = copy.set_column(copy.schema.get_field_index("source"), "source", ids)
            if table == "sources":
                copy = copy.set_column(copy.schema.get_field_index("sha256"), "sha256",
                                       pa.array([hashlib.sha256(source.encode()).hexdigest()], pa.string()))
                copy = copy.set_column(copy.schema.get_field_index("run_name"), "run_name", pa.array([dst_run]))
            write_partition(dst_root, table, dst_run, k, source, copy)
            assert part_path(dst_root, table, dst_run, k, source).exists()
