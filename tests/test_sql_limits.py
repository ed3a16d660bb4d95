"""User SQL has limits: time, memory, and files (only the store's Parquet parts are readable).

Before, `stepscope sql` had no time limit, no connection set DuckDB's memory limit (its default
is 80% of RAM: a cross join reached 11.6 GB in 30 s), and the sandbox let read_text/read_blob read
DuckDB's `<cwd>/.tmp/` and any file inside the store.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from stepscope.cli import main
from stepscope.store import open_store
from stepscope.store.catalog import DEFAULT_MEMORY_LIMIT, MEMORY_LIMIT_ENV, connect
from stepscope.store.ingest import ingest_trace_file
from tests.test_ingest_input import GOOD_EVENTS

REPO = Path(__file__).resolve().parents[1]
CROSS_JOIN = "SELECT count(*) FROM range(1000000) a, range(1000000) b, range(1000) c"


@pytest.fixture
def store(tmp_path: Path, make_trace) -> Path:
    root = tmp_path / "store"
    ingest_trace_file(make_trace("rank0.json", GOOD_EVENTS), root, "r")
    return root


def _limit_of(con) -> str:
    return con.sql("SELECT current_setting('memory_limit') AS m").fetchall()[0][0]


def test_sandbox_reads_only_the_stores_parquet_parts(store: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "spill.txt").write_text("another query's spilled rows")
    (store / "baselines.json").write_text('{"main": "r"}')
    part = next((store / "events").rglob("*.parquet"))
    stray = part.with_name(part.name + ".4242.deadbeef.tmp")
    stray.write_bytes(b"a writer's half-written part")
    for reader in ("read_text", "read_blob"):
        for target in (tmp_path / ".tmp" / "spill.txt", Path(".tmp/spill.txt"), store / "baselines.json",
                       stray, store / ".commit.lock"):
            assert main(["sql", f"SELECT * FROM {reader}('{target}')", "--store", str(store)]) == 2, (reader, target)
            assert "SQL error" in capsys.readouterr().err
    # The views, and the parts themselves, stay readable.
    assert main(["sql", "SELECT count(*) AS n FROM events", "--store", str(store), "--format", "csv"]) == 0
    assert capsys.readouterr().out.split() == ['"n"', str(len(GOOD_EVENTS))]
    assert main(["sql", f"SELECT count(*) AS n FROM read_parquet('{part.resolve()}')", "--store", str(store),
                 "--format", "csv"]) == 0
    assert capsys.readouterr().out.split() == ['"n"', str(len(GOOD_EVENTS))]


def test_sql_stops_at_its_time_limit(store: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "stepscope.cli", "sql", CROSS_JOIN, "--store", str(store),
                           "--timeout", "0.5"], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == "stepscope sql: query stopped after the 0.5 s limit"


def test_sql_has_a_default_time_limit() -> None:
    from stepscope.cli import build_parser

    args = build_parser("sql").parse_args(["sql", "SELECT 1", "--store", "s"])
    assert args.timeout == 60


def test_every_connection_has_the_memory_limit(store: Path, monkeypatch) -> None:
    from stepscope.analysis._local import local_sql

    expected = _limit_of(connect(limit=DEFAULT_MEMORY_LIMIT))
    assert expected != _limit_of(duckdb.connect())  # DuckDB's own default is 80%
    with open_store(store) as trusted, open_store(store, read_only_sql=True) as sandbox:
        assert _limit_of(trusted._con) == _limit_of(sandbox._con) == expected
    assert local_sql("SELECT current_setting('memory_limit') AS m").column("m").to_pylist() == [expected]
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "1GB")
    with open_store(store) as trusted:
        assert _limit_of(trusted._con) == "953.6 MiB"
    assert local_sql("SELECT current_setting('memory_limit') AS m").column("m").to_pylist() == ["953.6 MiB"]


def test_a_query_beyond_the_memory_limit_is_one_line(store: Path, capsys) -> None:
    query = "SELECT count(DISTINCT i) FROM range(100000000) t(i)"
    assert main(["sql", query, "--store", str(store), "--memory-limit", "100MB"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "Out of Memory" in line and "the memory limit is 100MB" in line


def test_a_bad_memory_limit_is_a_usage_error(store: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "lots")
    assert main(["sql", "SELECT 1", "--store", str(store)]) == 2
    assert "memory limit 'lots'" in capsys.readouterr().err


def test_the_trusted_connection_does_not_spill_into_the_working_folder(store: Path) -> None:
    with open_store(store) as trusted:
        spill = trusted.sql("SELECT current_setting('temp_directory') AS d").column("d").to_pylist()[0]
    assert spill and Path(spill).is_absolute() and "stepscope-duckdb-" in spill
