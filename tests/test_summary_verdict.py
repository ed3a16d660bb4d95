"""The verdict the dashboard's Overview opens with is the summary's, whichever computes it first.

``summary_verdict`` keeps the verdict on its own in the run's cache: computed from the sections
when no summary document exists yet (the dashboard's first open), read from the document when
``stepscope summary`` wrote one, recomputed with the cache off. Every way gives the object
``build_summary`` puts in its document, and ``summary --format json`` prints the cached document
exactly as it prints a computed one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.analysis.summary import build_summary, summary_verdict
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests.conftest import REPO


def _plain(value: object) -> object:
    return json.loads(json.dumps(value))


def test_the_verdict_alone_is_the_summary_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "store"
    assert ingest_paths([REPO / "sample_traces" / "gloo-3ranks-late"], root, "late").ok
    with open_store(root) as store:
        first = summary_verdict(store, "late")  # no summary yet: from the sections
    assert (root / "cache" / "verdict").is_dir() and not (root / "cache" / "summary").exists()
    with open_store(root) as store:
        doc = build_summary(store, "late")
    assert _plain(first) == _plain(doc["verdict"]) and doc["verdict"]["findings"]
    shutil.rmtree(root / "cache" / "verdict")
    with open_store(root) as store:
        assert _plain(summary_verdict(store, "late")) == _plain(doc["verdict"])  # from the document
    monkeypatch.setenv("STEPSCOPE_NO_CACHE", "1")
    with open_store(root) as store:
        assert _plain(summary_verdict(store, "late")) == _plain(doc["verdict"])


def test_summary_json_from_the_cache_is_printed_as_computed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    assert ingest_paths([REPO / "sample_traces" / "gloo-3ranks-late"], root, "late").ok
    argv = [sys.executable, "-m", "stepscope.cli", "summary", "--store", str(root), "--format", "json"]
    computed = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert list((root / "cache" / "summary").rglob("*.json"))
    cached = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert cached == computed
    assert computed == json.dumps(json.loads(computed), indent=1) + "\n"
