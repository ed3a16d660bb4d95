"""Compacted runs (store/compact.py): one file per table and run, read only while it holds
exactly what the run's parts hold, and a ``Store`` whose file list is fixed while it is open.

The independent side is always the per-rank parts themselves: the same store opened with its
``.compact/`` folder gone, which reads every part with the commit rule's semi join.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from stepscope.store import open_store, schema
from stepscope.store.compact import COMPACT_DIR, MANIFEST, RAW_TABLES, compact_run
from stepscope.store.ingest import ingest_paths, ingest_trace_file
from tests.conftest import REPO

LATE = REPO / "sample_traces" / "gloo-3ranks-late"
PIPELINE = REPO / "sample_traces" / "pp-1f1b-4stages"


def _every_table(root: Path) -> dict[str, pa.Table]:
    """Every view's rows, in one order, with its column names and types."""
    with open_store(root) as store:
        return {name: store.sql(f"SELECT * FROM {name} ORDER BY ALL") for name in store.tables}


def _from_parts(root: Path, tmp: Path) -> dict[str, pa.Table]:
    """The same store read from its parts only (a copy without ``.compact/``)."""
    copy = tmp / "parts-only"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(COMPACT_DIR))
    return _every_table(copy)


def _manifest(root: Path, run: str) -> dict:
    return json.loads((root / COMPACT_DIR / f"run={run}" / MANIFEST).read_text())


@pytest.fixture(scope="module")
def late_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("compact") / "store"
    assert ingest_paths([LATE], root, "late").ok
    return root


def _another_rank_of_the_job(tmp: Path) -> Path:
    """Rank 2's trace with one top-level key more: new content of the same job (world size,
    device, recording time), so the run takes it as another rank rather than another job."""
    doc = json.loads(gzip.decompress((LATE / "rank2.pt.trace.json.gz").read_bytes()))
    doc["note"] = "copy"
    path = tmp / "rank7.pt.trace.json"
    path.write_text(json.dumps(doc))
    return path


def _copy(root: Path, tmp: Path, name: str = "store") -> Path:
    target = tmp / name
    shutil.copytree(root, target)
    return target


def test_an_ingest_compacts_its_run_and_the_views_read_only_the_compacted_files(late_store: Path) -> None:
    manifest = _manifest(late_store, "late")
    # every table the run has, but the raw ones, is one file; the manifest lists every part
    assert "events" not in manifest["tables"] and "memory" not in manifest["tables"]
    assert {"sources", "steps", "rank_collectives", "rank_step_host"} <= set(manifest["tables"])
    assert len({p[1] for p in manifest["parts"]}) == 3 and manifest["versions"] == [schema.SCHEMA_VERSION]
    with open_store(late_store) as store:
        plan = store._shared.plan
        assert plan.compacted_runs == {"late"}
        assert all(len(files) == 1 for files in plan.compacted.values())
        assert set(plan.parts) <= RAW_TABLES  # only the raw tables are read from their parts
        assert store.sql("SELECT current_setting('parquet_metadata_cache') AS on").to_pylist() == [{"on": True}]


def test_compacted_views_answer_exactly_what_the_parts_do(late_store: Path, tmp_path: Path) -> None:
    compacted, parts = _every_table(late_store), _from_parts(late_store, tmp_path)
    assert compacted.keys() == parts.keys()
    for name in compacted:
        assert compacted[name].schema == parts[name].schema, name
        assert compacted[name].equals(parts[name]), name
    assert compacted["rank_collectives"].num_rows > 0 and compacted["rank_step_host"].num_rows > 0


def test_a_trace_committed_after_the_compaction_is_read_from_the_parts(late_store: Path, tmp_path: Path) -> None:
    """``ingest_trace_file`` commits without compacting: the run's listing no longer matches
    its manifest, so the whole run is read from its parts, the new rank included."""
    root = _copy(late_store, tmp_path)
    ingest_trace_file(_another_rank_of_the_job(tmp_path), root, "late", rank=7)
    with open_store(root) as store:
        assert store._shared.plan.compacted_runs == set()
        ranks = store.sql("SELECT DISTINCT rank FROM rank_step_host WHERE run = 'late' ORDER BY rank")
    assert ranks.column("rank").to_pylist() == [0, 1, 2, 7]
    assert _every_table(root)["rank_cpu_ops"].equals(_from_parts(root, tmp_path)["rank_cpu_ops"])
    assert compact_run(root, "late")  # the next compaction covers it again
    with open_store(root) as store:
        assert store._shared.plan.compacted_runs == {"late"}
        assert store.sql("SELECT count(DISTINCT rank) AS n FROM rank_step_host").to_pylist() == [{"n": 4}]


def test_an_uncommitted_part_in_flight_keeps_its_rows_out_either_way(late_store: Path, tmp_path: Path) -> None:
    root = _copy(late_store, tmp_path)
    stray = root / "steps" / "run=late" / "rank=9" / "part-0123456789abcdef.parquet"
    stray.parent.mkdir(parents=True)
    shutil.copy(next((root / "steps" / "run=late" / "rank=0").glob("*.parquet")), stray)
    with open_store(root) as store:
        assert store._shared.plan.compacted_runs == set()  # a part the manifest does not list
        assert store.sql("SELECT count(*) AS n FROM steps WHERE rank = 9").to_pylist() == [{"n": 0}]
    assert compact_run(root, "late")
    with open_store(root) as store:
        assert store._shared.plan.compacted_runs == {"late"}
        assert store.sql("SELECT count(*) AS n FROM steps WHERE rank = 9").to_pylist() == [{"n": 0}]


def test_a_rewritten_or_removed_part_is_noticed(late_store: Path, tmp_path: Path) -> None:
    root = _copy(late_store, tmp_path)
    part = next((root / "rank_step_host" / "run=late" / "rank=1").glob("*.parquet"))
    part.unlink()  # the rank's answers gone: the compacted file still holds them
    with open_store(root) as store:
        assert store._shared.plan.compacted_runs == set()
        assert store.sql("SELECT count(*) AS n FROM rank_step_host WHERE rank = 1").to_pylist() == [{"n": 0}]


def test_compacted_names_are_never_reused_and_old_ones_outlive_a_reader(late_store: Path, tmp_path: Path) -> None:
    root = _copy(late_store, tmp_path)
    before = _manifest(root, "late")["tables"]
    with open_store(root) as reader:  # opened on the old files
        assert compact_run(root, "late")
        after = _manifest(root, "late")["tables"]
        assert not set(before.values()) & set(after.values())
        # the old files stay (removed only once STALE_S old): the reader still answers
        assert reader.sql("SELECT count(*) AS n FROM sources").to_pylist() == [{"n": 3}]


def test_a_run_of_one_trace_is_not_compacted(tmp_path: Path) -> None:
    root = tmp_path / "store"
    assert ingest_paths([LATE / "rank0.pt.trace.json.gz"], root, "one").ok
    assert not (root / COMPACT_DIR).exists()
    with open_store(root) as store:
        assert store.sql("SELECT count(*) AS n FROM steps").to_pylist()[0]["n"] > 0


def test_an_open_store_keeps_its_file_list_until_refreshed(late_store: Path, tmp_path: Path) -> None:
    from stepscope.analysis.matching import ranks_with_collectives

    root = _copy(late_store, tmp_path)
    with open_store(root) as store:
        assert ranks_with_collectives(store, "late") == 3
        assert ingest_paths([PIPELINE / "rank3.pt.trace.json.gz"], root, "late").ok  # rank 3
        # neither the views nor what was memoised over them changed under the open store
        assert store.sql("SELECT count(*) AS n FROM sources").to_pylist() == [{"n": 3}]
        assert ranks_with_collectives(store, "late") == 3
        assert store.refresh()
        assert store.sql("SELECT count(*) AS n FROM sources").to_pylist() == [{"n": 4}]
        assert not store.refresh()  # nothing changed since


def test_the_sql_sandbox_reads_a_compacted_run(late_store: Path) -> None:
    with open_store(late_store, read_only_sql=True) as store:
        rows, cut = store.read_only_query("SELECT count(DISTINCT rank) AS n FROM rank_collectives")
    assert rows.to_pylist() == [{"n": 3}] and not cut
