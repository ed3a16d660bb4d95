"""Make bigger inputs out of one real trace, for the benchmarks.

- ``scale_ranks``: a many-rank run (1,024 ranks) out of real ranks: copies of their store
  partitions with shifted clocks (bench_analysis.py's scaled cases, bench_dashboard.py). Rank k
  is a copy of real rank ``ranks[k % len(ranks)]`` with every timestamp shifted by
  ``k * shift_ns`` plus a jitter of its own (uniform in ``[0, jitter_ns)``, seeded) and its own
  source id: the copies are distinct traces to every query (no shared rows), their collectives
  match across ranks by sequence number, and, the jitter staying under the analysis's
  clock-correction threshold (1 ms), each rank arrives at each collective at its own time, so
  arrival skew, waits and late ranks are real figures rather than zeros. Every table of the rank
  is copied, the per-rank tables (``rank_*``) included, ``sources`` last (it commits the rest); a
  pure shift keeps every table consistent with the others (each step's parts still sum to the
  step). It copies the store's Parquet files (no re-ingest), which keeps the setup short, then
  compacts the run as an ingest's commit does (``stepscope.store.compact``).
  ``scale_rank``: the same from one rank, without jitter.
- ``repeat_trace``: one trace file whose events are the original's repeated, each copy shifted by
  the trace's span (bench_ingest.py's flat-memory case).
- ``rank_files``: copies of a trace file as ranks 0..n-1 of one job (distinct contents, so none
  is skipped as a duplicate; bench_ingest.py's ``--jobs`` case).
"""

from __future__ import annotations

import gzip
import hashlib
import random
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stepscope.store import schema
from stepscope.store.compact import compact_run
from stepscope.store.writer import part_path, write_partition

TIMESTAMP_COLUMNS = frozenset({"ts_ns", "start_ns", "end_ns", "cpu_start_ns", "trace_start_ns", "trace_end_ns",
                               "gpu_start_ns", "gpu_end_ns", "peak_ts_ns", "s0", "s1"})
"""Columns holding points in time (shifted); every other ``*_ns`` column is a duration (kept)."""
COMMIT_TABLE = "sources"


def _tables() -> list[str]:
    return [t for t in schema.TABLES if t != COMMIT_TABLE] + [COMMIT_TABLE]


def _read_rank(src_root: Path, run: str, rank: int) -> dict[str, pa.Table]:
    found = {}
    for table in _tables():
        files = sorted((src_root / table / f"run={run}" / f"rank={rank}").glob("*.parquet"))
        if files:
            found[table] = pa.concat_tables([pq.read_table(f) for f in files])
    return found


def _shifted(data: pa.Table, table: str, source: str, dst_run: str, shift_ns: int) -> pa.Table:
    for column in data.column_names:
        if column in TIMESTAMP_COLUMNS:
            shifted = pc.add(data.column(column), pa.scalar(shift_ns, pa.int64()))
            data = data.set_column(data.schema.get_field_index(column), column, shifted)
    ids = pa.array([source] * data.num_rows, pa.string())
    data = data.set_column(data.schema.get_field_index("source"), "source", ids)
    if table == COMMIT_TABLE:
        data = data.set_column(data.schema.get_field_index("sha256"), "sha256",
                               pa.array([hashlib.sha256(source.encode()).hexdigest()] * data.num_rows))
        data = data.set_column(data.schema.get_field_index("run_name"), "run_name",
                               pa.array([dst_run] * data.num_rows))
    return data


def scale_ranks(src_root: Path, run: str, ranks: Sequence[int], dst_root: Path, dst_run: str, copies: int,
                shift_ns: int = 7_000, jitter_ns: int = 0, seed: int = 0) -> None:
    """Write ``copies`` ranks of ``dst_run`` into ``dst_root``: rank k a copy of real rank
    ``ranks[k % len(ranks)]`` of ``run`` shifted by ``k * shift_ns`` plus its jitter."""
    sources = {rank: _read_rank(src_root, run, rank) for rank in ranks}
    rng = random.Random(seed)
    jitters = [rng.randrange(jitter_ns) if jitter_ns > 0 else 0 for _ in range(copies)]
    for table in _tables():
        for k in range(copies):
            data = sources[ranks[k % len(ranks)]].get(table)
            if data is None:
                continue
            source = hashlib.sha256(f"{dst_run}/{k}".encode()).hexdigest()[:16]
            write_partition(dst_root, table, dst_run, k, source,
                            _shifted(data, table, source, dst_run, k * shift_ns + jitters[k]))
            assert part_path(dst_root, table, dst_run, k, source).exists()
    compact_run(dst_root, dst_run)  # as an ingest does when it commits


def scale_rank(src_root: Path, run: str, rank: int, dst_root: Path, dst_run: str, copies: int,
               shift_ns: int = 7_000) -> None:
    """Write ``copies`` ranks of ``dst_run`` into ``dst_root``, each a shifted copy of ``rank``."""
    scale_ranks(src_root, run, [rank], dst_root, dst_run, copies, shift_ns)


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
