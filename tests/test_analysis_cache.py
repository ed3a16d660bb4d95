"""The per-run frame cache: same numbers as a fresh computation, invalidated by new traces."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pytest

from stepscope.analysis.breakdown import step_breakdown
from stepscope.analysis.cache import CACHE_ENV
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests.conftest import copy_store

pytestmark = pytest.mark.shared

NCCL = "hta/nccl_parser_config/nccl_data.json.gz"
CPU = "cpu-transformer"
"""A bundled sample run of one trace (``sample_run``), run ``cpu-transformer``."""


def test_cached_frame_equals_fresh_and_follows_the_runs_sources(
    tmp_path: Path, shared_traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    assert ingest_paths([shared_traces / "hta/trace_filter/sampled_rank-0.json.gz"], root, "r").ok
    first = step_breakdown(open_store(root), "r")
    files = list((root / "cache" / "step_breakdown" / "run=r").glob("*.parquet"))
    assert len(files) == 1
    assert step_breakdown(open_store(root), "r").equals(first)  # read back from the file
    monkeypatch.setenv(CACHE_ENV, "1")
    assert step_breakdown(open_store(root), "r").equals(first)  # computed afresh
    monkeypatch.delenv(CACHE_ENV)
    # A second rank of the same job joins the run: the cached frame must not be served any more.
    assert ingest_paths([shared_traces / "hta/trace_filter/sampled_rank-1.json.gz"], root, "r").ok
    both = step_breakdown(open_store(root), "r")
    assert sorted(set(both.column("rank").to_pylist())) == [0, 1]
    files = list((root / "cache" / "step_breakdown" / "run=r").glob("*.parquet"))
    assert len(files) == 1  # the stale file is gone


def test_a_subset_of_ranks_is_not_cached(tmp_path: Path, ingested: Callable[[str], Path]) -> None:
    root = copy_store(ingested(NCCL), tmp_path / "store")
    step_breakdown(open_store(root), "t", ranks=[0])
    assert not (root / "cache").exists()


def test_unwritable_cache_still_answers(tmp_path: Path, ingested: Callable[[str], Path]) -> None:
    root = copy_store(ingested(NCCL), tmp_path / "store")
    (root / "cache").write_text("not a folder")  # makes every cache write fail
    assert step_breakdown(open_store(root), "t").num_rows == 3


def test_frames_written_without_fsync_and_a_torn_one_is_a_miss(
    tmp_path: Path, sample_run: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frames can be made again, so they are not fsynced (an fsync per file is most of a
    dashboard's first-open writes); what a crash could leave instead (an empty file, an
    absence with no reason) is recomputed, never served."""
    import os

    from stepscope.analysis.absent import Absent
    from stepscope.analysis.breakdown import host_breakdown

    root = copy_store(sample_run(CPU), tmp_path / "store")
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    fresh = host_breakdown(open_store(root), CPU)
    assert isinstance(step_breakdown(open_store(root), CPU), Absent)  # no GPU: kept as an absence
    assert synced == []
    torn = list((root / "cache").glob(f"*/run={CPU}/*"))
    assert {p.suffix for p in torn} == {".parquet", ".absent"}
    for kept in torn:
        kept.write_bytes(b"")
    assert host_breakdown(open_store(root), CPU).equals(fresh)
    again = step_breakdown(open_store(root), CPU)
    assert isinstance(again, Absent) and again.reason
    assert all(kept.stat().st_size > 0 for kept in torn)  # made again


def test_summary_document_is_cached_per_run_and_rank_selection(tmp_path: Path, ingested: Callable[[str], Path]) -> None:
    from stepscope.analysis.summary import build_summary

    root = copy_store(ingested(NCCL), tmp_path / "store")
    first = build_summary(open_store(root), "t")
    assert len(list((root / "cache" / "summary" / "run=t").glob("*.json"))) == 1
    assert build_summary(open_store(root), "t") == first
    assert [r["rank"] for r in build_summary(open_store(root), "t", ranks=[3])["ranks"]] == [3]
    assert build_summary(open_store(root), "t") == first  # the rank-3 document did not replace it wrongly


def test_editing_or_adding_any_analysis_module_changes_the_key(tmp_path: Path) -> None:
    """The key covers the whole analysis package (subpackages too) and the formatters of its
    messages: editing any one file, or adding a module, gives another key."""
    from stepscope.analysis import cache

    real = Path(cache.__file__).resolve().parent
    names = {p.relative_to(real.parent).as_posix() for p in cache.code_files(real)}
    assert {"analysis/breakdown.py", "analysis/compare/gate.py", "analysis/cache.py", "store/rankstats/parts.py",
            "units.py"} <= names
    assert names >= {p.relative_to(real.parent).as_posix() for p in real.rglob("*.py")}
    root = tmp_path / "stepscope"
    shutil.copytree(real, root / "analysis", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(real.parent / "store" / "rankstats", root / "store" / "rankstats",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(real.parent / "units.py", root / "units.py")
    package = root / "analysis"
    before = cache.code_hash(cache.code_files(package), root)
    assert before == cache.CODE_HASH  # the same files as the installed package
    for path in cache.code_files(package):
        original = path.read_bytes()
        path.write_bytes(original + b"\n# edited\n")
        assert cache.code_hash(cache.code_files(package), root) != before, path
        path.write_bytes(original)
    (package / "compare" / "new_rule.py").write_text('"""A new module."""\n')
    assert cache.code_hash(cache.code_files(package), root) != before


def test_other_code_is_not_served_a_cached_frame(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 sample_run: Callable[[str], Path]) -> None:
    from stepscope.analysis import cache
    from stepscope.analysis.breakdown import host_breakdown

    root = copy_store(sample_run(CPU), tmp_path / "store")
    first = host_breakdown(open_store(root), CPU)
    [old] = (root / "cache" / "host_breakdown" / f"run={CPU}").glob("*.parquet")
    monkeypatch.setattr(cache, "CODE_HASH", "another-version")
    assert host_breakdown(open_store(root), CPU).equals(first)
    [new] = (root / "cache" / "host_breakdown" / f"run={CPU}").glob("*.parquet")
    assert new.name != old.name  # recomputed under a new key; the stale file removed


def test_an_absence_is_kept_with_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             sample_run: Callable[[str], Path]) -> None:
    """A CPU-only run has no GPU breakdown: the reason is kept and served without the query."""
    from stepscope.analysis.absent import Absent
    from stepscope.store.catalog import Store

    root = copy_store(sample_run(CPU), tmp_path / "store")
    first = step_breakdown(open_store(root), CPU)
    assert isinstance(first, Absent)
    [kept] = (root / "cache" / "step_breakdown" / f"run={CPU}").glob("*.absent")
    assert kept.read_text() == first.reason
    queries: list[str] = []
    original = Store.sql
    monkeypatch.setattr(Store, "sql", lambda self, q, p=None: queries.append(q) or original(self, q, p))
    assert step_breakdown(open_store(root), CPU) == first
    assert all("FROM sources WHERE run" in q for q in queries)  # only the key's lookup of the sources



def _step_times(source: str, wall_ns: int, steps: int) -> pa.Table:
    return pa.table({"source": [source] * steps, "step": list(range(steps)),
                     "start_ns": [i * wall_ns for i in range(steps)], "wall_ns": [wall_ns] * steps,
                     "cpu_ns": [None] * steps, "preemptions": [None] * steps, "gpu_ns": [None] * steps,
                     "profiled": [False] * steps,
                     "tokens": [None] * steps, "samples": [None] * steps,
                     "disturbed_by": [None] * steps, "others_cpu_ns": [None] * steps})


def test_step_times_written_after_the_commit_are_not_hidden_by_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sample_run: Callable[[str], Path]
) -> None:
    """The collector commits a trace, then writes (and every few minutes rewrites) the rank's
    step_times: a summary cached in between must not be served afterwards."""
    from stepscope.analysis.summary import build_summary
    from stepscope.store.writer import write_partition

    def fresh() -> object:
        monkeypatch.setenv(CACHE_ENV, "1")
        try:
            return build_summary(open_store(root), CPU)
        finally:
            monkeypatch.delenv(CACHE_ENV)

    root = copy_store(sample_run(CPU), tmp_path / "store")
    source = open_store(root).sql("SELECT source FROM sources").column("source")[0].as_py()
    before = build_summary(open_store(root), CPU)  # cached
    for wall_ns, steps in ((7_000_000, 3), (9_000_000, 4)):  # written, then rewritten
        write_partition(root, "step_times", CPU, 0, source, _step_times(source, wall_ns, steps))
        answer = build_summary(open_store(root), CPU)
        assert answer == fresh() and answer != before
        before = answer
