"""Bring a store written by an older stepscope up to this one's schema version.

From any older schema version: each committed trace gets every per-rank table of this version
(``stepscope.store.rankstats``), computed from the parts the store already holds (the same queries as
at ingest, so a migrated store answers exactly as a fresh ingest of the same files would), and
its ``sources`` row gains ``process_id`` (the pid most of its host events carry, version 2) and the new
version. The ``sources`` part is rewritten last, under the commit lock, so a trace is never seen
half migrated; running ``migrate`` again skips what is done. The events, steps and memory parts
keep their bytes (their layout did not change).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stepscope.store import dedupe, engine
from stepscope.store.classify import HOST_KINDS
from stepscope.store.constants import SCHEMA_VERSION, SCHEMA_VERSION_KEY
from stepscope.store.writer import part_path, write_partition

TRACE_PARTS = ("events", "steps", "memory")


@dataclass
class MigrationReport:
    """What ``migrate_store`` did: the traces brought up to date, and those already there."""

    migrated: list[tuple[str, int, str]] = field(default_factory=list)
    up_to_date: int = 0


def _version(part: Path) -> int:
    import pyarrow.parquet as pq

    value = (pq.read_schema(part).metadata or {}).get(SCHEMA_VERSION_KEY, b"1")
    return int(value.decode())


def _committed_parts(root: Path) -> list[Path]:
    return sorted((root / "sources").glob("run=*/rank=*/part-*.parquet"))


def _main_pid(con: object, events: Path) -> int | None:
    kinds = ", ".join(f"'{k}'" for k in sorted(HOST_KINDS))
    row = con.execute(  # type: ignore[attr-defined]
        f"SELECT pid FROM read_parquet(?) WHERE pid IS NOT NULL AND kind IN ({kinds}) "
        "GROUP BY pid ORDER BY count(*) DESC, pid LIMIT 1", [str(events)]).fetchone()
    return row[0] if row else None


def migrate_trace(root: Path, run: str, rank: int, source: str) -> None:
    """Write the per-rank tables of one committed trace and rewrite its ``sources`` part."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stepscope.store.ingest import write_rank_tables

    parts = {t: part_path(root, t, run, rank, source) for t in TRACE_PARTS}
    con = engine.connect(limit="512MB", threads=1)
    try:
        write_rank_tables(con, root, run, rank, source, {t: p for t, p in parts.items() if p.is_file()})
        pid = _main_pid(con, parts["events"]) if parts["events"].is_file() else None
    finally:
        con.close()
    sources = part_path(root, "sources", run, rank, source)
    with dedupe.commit_lock(root):
        table = pq.read_table(sources)
        if "process_id" not in table.column_names:
            table = table.append_column("process_id", pa.array([pid] * table.num_rows, pa.int64()))
        write_partition(root, "sources", run, rank, source, table.drop_columns(
            [c for c in ("run", "rank") if c in table.column_names]))


def migrate_store(root: Path | str) -> MigrationReport:
    """Bring every committed trace of the store at ``root`` to ``SCHEMA_VERSION``."""
    root = Path(root)
    report = MigrationReport()
    for part in _committed_parts(root):
        if _version(part) >= SCHEMA_VERSION:
            report.up_to_date += 1
            continue
        run = part.parent.parent.name.removeprefix("run=")
        rank = int(part.parent.name.removeprefix("rank="))
        source = part.name.removeprefix("part-").removesuffix(".parquet")
        migrate_trace(root, run, rank, source)
        report.migrated.append((run, rank, source))
    return report
