"""`stepscope prune`: a store kept as a CI artifact stays small; the runs a baseline points at,
and the newest ones, are kept whole; removed runs leave nothing behind."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from stepscope.cli import main
from stepscope.commands.prune import parse_age, runs_to_prune
from stepscope.errors import UsageError
from tests.conftest import REPO

SAMPLE = REPO / "sample_traces" / "cpu-transformer"
DAY = dt.timedelta(days=1)
NOW = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)


def test_which_runs_go() -> None:
    created = {f"r{i}": NOW - i * DAY for i in range(6)}  # r0 newest, r5 oldest
    assert runs_to_prune(created, set(), keep=2, older_than=None, now=NOW) == ["r5", "r4", "r3", "r2"]
    assert runs_to_prune(created, {"r5"}, keep=2, older_than=None, now=NOW) == ["r4", "r3", "r2"]
    assert runs_to_prune(created, set(), keep=2, older_than=3.5 * DAY, now=NOW) == ["r5", "r4"]
    assert runs_to_prune(created, set(), keep=None, older_than=0.5 * DAY, now=NOW) == ["r5", "r4", "r3", "r2", "r1"]
    assert runs_to_prune(created, set(), keep=10, older_than=None, now=NOW) == []
    assert parse_age("30d") == 30 * DAY and parse_age("12h") == dt.timedelta(hours=12)
    with pytest.raises(UsageError):
        parse_age("soon")


def test_prune_keeps_the_newest_and_the_baselines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stepscope.store import open_store
    from stepscope.store.ingest import ingest_paths
    from stepscope.store.runs import stored_runs

    store = tmp_path / "store"
    for run in ("a", "b", "c", "d"):  # ingested in this order: a is the oldest
        assert ingest_paths([SAMPLE], store, run).ok
    assert main(["baseline", "set", "main", "a", "--store", str(store)]) == 0
    assert main(["accept", "b", "--reason", "intended", "--store", str(store), "--baseline", "other"]) == 0
    # accept made b the whole of baseline "other"; a new run replaces it when the baseline keeps one
    assert main(["baseline", "set", "other", "d", "--keep", "1", "--store", str(store)]) == 0
    assert main(["summary", "--store", str(store), "--run", "b", "--format", "json"]) == 0  # fills the cache
    capsys.readouterr()
    assert main(["prune", "--keep", "1", "--store", str(store), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove run b" in out and "would remove run c" in out and stored_runs(store) == ["a", "b", "c", "d"]
    assert main(["prune", "--keep", "1", "--store", str(store)]) == 0
    assert "removed 2 run(s), 2 kept (baselines: a, d)" in capsys.readouterr().out
    assert stored_runs(store) == ["a", "d"]
    leftovers = [p for p in store.rglob("*") if "run=b" in str(p) or "run=c" in str(p)]
    assert leftovers == [] and not (store / "acceptances" / "b.json").exists()
    with open_store(store) as s:
        assert s.sql("SELECT DISTINCT run FROM events ORDER BY run").column("run").to_pylist() == ["a", "d"]
    assert json.loads((store / "baselines.json").read_text())["baselines"]["main"]["run"] == "a"
    assert main(["prune", "--older-than", "1d", "--store", str(store)]) == 0
    assert stored_runs(store) == ["a", "d"]
    assert main(["prune", "--store", str(store)]) == 2  # nothing said: a usage error
