"""Make bigger inputs out of one real trace, for the benchmarks.

- ``scale_rank``: a many-rank run out of one real rank: copies of its store partitions with
  shifted clocks (bench_analysis.py's scaled case). Each copy k of the source rank becomes rank
  k with every timestamp shifted by ``k * shift_ns`` and its own source id, so the copies are
  distinct traces to every query (no shared rows, staggered collectives) while keeping the real
  trace's structure. It copies the store's Parquet files (no re-ingest), which keeps the
  benchmark's setup short.
- ``repeat_trace``: one trace file whose events are the original's repeated, each copy shifted by
  the trace's span (bench_ingest.py's flat-memory case).
- ``rank_files``: copies of a trace file as ranks 0..n-1 of one job (distinct contents, so none
  is skipped as a duplicate; bench_ingest.py's ``--jobs`` case).
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stepscope.store import rankstats
from stepscope.store.writer import part_path, write_partition

TIME_COLUMNS = {
    "events": ("ts_ns",),
    "steps": ("start_ns", "end_ns"),
    "memory": ("ts_ns",),
    "step_times": ("start_ns",),
    "sources": ("trace_start_ns", "trace_end_ns"),
    "rank_copies": ("ts_ns",),
    "rank_step_gpu": ("start_ns", "end_ns", "cpu_start_ns"),
    "rank_step_host": ("start_ns", "end_ns"),
    "rank_comm_spans": ("s0", "s1"),
    "rank_collectives": ("ts_ns", "end_ns"),
    "rank_gpu_totals": ("gpu_start_ns", "gpu_end_ns"),
    "rank_hiding_spans": ("s0", "s1"),
    "rank_memory_peaks": ("peak_ts_ns",),
}
TABLES = ("events", "steps", "memory", "step_times", "memory_roles", *(t.name for t in rankstats.TABLES),
          "sources")  # sources last: it commits


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


def _load(path: Path) -> dict[str, Any]:
    import msgspec

    data = path.read_bytes()
    return msgspec.json.decode(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _save(doc: dict[str, Any], path: Path) -> None:
    import msgspec

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(msgspec.json.encode(doc), compresslevel=6))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def repeat_trace(src: Path, dst: Path, copies: int) -> int:
    """Write ``src`` with its events repeated ``copies`` times, copy k shifted by k x its span
    (first start to last end); returns the number of events written."""
    doc = _load(src)
    events = doc["traceEvents"]
    timed = [e for e in events if _is_number(e.get("ts"))]
    start = min(e["ts"] for e in timed)
    end = max(e["ts"] + (e["dur"] if _is_number(e.get("dur")) else 0) for e in timed)
    doc["traceEvents"] = [e if k == 0 or not _is_number(e.get("ts")) else {**e, "ts": e["ts"] + k * (end - start)}
                          for k in range(copies) for e in events]
    _save(doc, dst)
    return len(doc["traceEvents"])


def rank_files(src: Path, folder: Path, ranks: int) -> list[Path]:
    """Write ``src`` as ranks 0..ranks-1 of one job (``distributedInfo.rank``), one file each."""
    doc = _load(src)
    paths = []
    for rank in range(ranks):
        doc["distributedInfo"] = {**(doc.get("distributedInfo") or {}), "rank": rank}
        paths.append(folder / f"rank{rank}.json.gz")
        _save(doc, paths[-1])
    return paths
