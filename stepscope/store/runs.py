"""Whole runs as folders of the store: list, copy from another store, remove.

A run is the ``run=<id>`` partition of every table (``<store>/<table>/run=<id>/``). Its rows
count only once its ``sources`` partition exists (the commit rule of :mod:`stepscope.store.catalog`),
so a copy writes ``sources`` last and a removal deletes it first: a reader sees the whole run or
none of it, never half.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from stepscope.store import schema
from stepscope.store.dedupe import INDEX_NAME
from stepscope.store.location import is_url

COMMIT_TABLE = "sources"
CACHE_DIR = "cache"


def stored_runs(root: Path | str) -> list[str]:
    """The run ids with committed rows in the store at ``root`` (sorted; a folder or a URL)."""
    if is_url(root):
        from stepscope.store.objectstore import RemoteStore

        return RemoteStore(str(root)).runs()
    return sorted(p.name.removeprefix("run=") for p in (Path(root) / COMMIT_TABLE).glob("run=*") if p.is_dir())


def _tables_commit_last() -> list[str]:
    return [t for t in schema.TABLES if t != COMMIT_TABLE] + [COMMIT_TABLE]


def remove_run(root: Path | str, run: str) -> None:
    """Delete every partition of ``run`` (``sources`` first), its content index and its cached
    frames."""
    root = Path(root)
    for table in reversed(_tables_commit_last()):
        shutil.rmtree(root / table / f"run={run}", ignore_errors=True)
    shutil.rmtree(root / INDEX_NAME / f"run={run}", ignore_errors=True)
    for cached in (root / CACHE_DIR).glob(f"*/run={run}"):
        shutil.rmtree(cached, ignore_errors=True)


def copy_run(source: Path | str, target: Path | str, run: str) -> bool:
    """Copy ``run`` from store ``source`` into store ``target``, replacing the run there.

    Each table's partition is copied into a temporary folder at the store's top level (which
    no table's ``**/*.parquet`` glob reaches) and renamed into place, ``sources`` last. Returns False (and changes nothing) when ``source`` holds no committed
    rows of ``run``.
    """
    source, target = Path(source), Path(target)
    if not (source / COMMIT_TABLE / f"run={run}").is_dir():
        return False
    remove_run(target, run)
    for table in _tables_commit_last():
        partition = source / table / f"run={run}"
        if not partition.is_dir():
            continue
        place = target / table / f"run={run}"
        place.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".copy-{table}-", dir=target))
        try:
            shutil.copytree(partition, staging / "run")
            (staging / "run").rename(place)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return True
