"""Concurrent writers of one store: every part a reader sees is complete, nothing is stored twice.

Each writer runs in its own process (as concurrent ``stepscope ingest`` runs and collector ranks
do); the reader is this test.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepscope.store.writer import part_path

REPO = Path(__file__).resolve().parents[1]
WRITERS = 4
READS = 200
ROWS = 200_000

WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import pyarrow as pa
    from stepscope.store.writer import write_partition

    root, me, rows = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    table = pa.table({"source": ["s"] * rows, "step": pa.array([me] * rows, pa.int64()),
                      "name": [f"writer {me}"] * rows, "start_ns": pa.array(range(rows), pa.int64()),
                      "end_ns": pa.array(range(rows), pa.int64()),
                      "dur_ns": pa.array([0] * rows, pa.int64())})
    deadline = time.monotonic() + 120
    while not (root / "stop").exists() and time.monotonic() < deadline:
        write_partition(root, "steps", "r", 0, "s", table)
""")


def test_four_processes_writing_one_part_never_show_a_corrupt_file(tmp_path: Path) -> None:
    root = tmp_path / "store"
    target = part_path(root, "steps", "r", 0, "s")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(me), str(ROWS)], cwd=REPO)
               for me in range(WRITERS)]
    corrupt: list[str] = []
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while not target.exists():
            assert time.monotonic() < deadline, "no writer produced the part"
            time.sleep(0.01)
        for _ in range(READS):
            try:
                # One open, so one inode: ``pq.read_table(path)`` may open the path twice (footer,
                # then pages) and see two different files across a rename, which no writer can
                # prevent. DuckDB's scans open each file once.
                with open(target, "rb") as handle:
                    table = pq.read_table(handle)
            except (OSError, pa.ArrowException) as exc:
                corrupt.append(f"{type(exc).__name__}: {exc}")
                continue
            writer_ids = set(table.column("step").to_pylist())
            if table.num_rows != ROWS or len(writer_ids) != 1:
                corrupt.append(f"{table.num_rows} rows from writers {sorted(writer_ids)}")
            seen |= writer_ids
    finally:
        (root / "stop").touch()
        codes = [w.wait(timeout=120) for w in writers]
    assert codes == [0] * WRITERS
    assert corrupt == [], f"{len(corrupt)} of {READS} reads saw a corrupt part: {corrupt[:3]}"
    assert len(seen) > 1, "the writers never overlapped: the test proves nothing"
    assert not list(target.parent.glob("*.tmp")), "a writer left its temporary file behind"


def test_a_dead_writers_temporary_file_is_removed_by_the_next_write(tmp_path: Path) -> None:
    import os

    from stepscope.store.schema import STEPS
    from stepscope.store.atomic import STALE_TMP_S
    from stepscope.store.writer import write_partition

    target = part_path(tmp_path, "steps", "r", 0, "s")
    target.parent.mkdir(parents=True)
    stale = target.with_name(target.name + ".4242.deadbeef.tmp")
    live = target.with_name(target.name + ".4243.cafef00d.tmp")
    for stray in (stale, live):
        stray.write_bytes(b"half a parquet file")
    old = time.time() - STALE_TMP_S - 60
    os.utime(stale, (old, old))
    write_partition(tmp_path, "steps", "r", 0, "s", STEPS.empty_table())
    assert not stale.exists() and live.exists() and target.exists()
