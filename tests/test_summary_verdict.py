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
from typing import Callable

import pytest

from stepscope.analysis.summary import build_summary, summary_verdict
from stepscope.store import open_store
from tests.conftest import copy_store

LATE = "gloo-3ranks-late"
"""A bundled sample run (``sample_run``): three gloo ranks, one of them late."""


def _plain(value: object) -> object:
    return json.loads(json.dumps(value))


def test_the_verdict_alone_is_the_summary_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  sample_run: Callable[[str], Path]) -> None:
    root = copy_store(sample_run(LATE), tmp_path / "store")
    with open_store(root) as store:
        first = summary_verdict(store, LATE)  # no summary yet: from the sections
    assert (root / "cache" / "verdict").is_dir() and not (root / "cache" / "summary").exists()
    with open_store(root) as store:
        doc = build_summary(store, LATE)
    assert _plain(first) == _plain(doc["verdict"]) and doc["verdict"]["findings"]
    shutil.rmtree(root / "cache" / "verdict")
    with open_store(root) as store:
        assert _plain(summary_verdict(store, LATE)) == _plain(doc["verdict"])  # from the document
    monkeypatch.setenv("STEPSCOPE_NO_CACHE", "1")
    with open_store(root) as store:
        assert _plain(summary_verdict(store, LATE)) == _plain(doc["verdict"])


def test_summary_json_from_the_cache_is_printed_as_computed(tmp_path: Path, sample_run: Callable[[str], Path]) -> None:
    root = copy_store(sample_run(LATE), tmp_path / "store")
    argv = [sys.executable, "-m", "stepscope.cli", "summary", "--store", str(root), "--format", "json"]
    computed = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert list((root / "cache" / "summary").rglob("*.json"))
    cached = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert cached == computed
    assert computed == json.dumps(json.loads(computed), indent=1) + "\n"
