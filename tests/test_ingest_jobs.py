"""How many worker processes a batch gets when ``--jobs`` is not given (``default_jobs``).

Starting a worker costs a fresh interpreter (~0.5 s); a conversion costs ~0.45 s whatever the
trace's size plus its size. So a batch of many small ranks is split like one large trace, and a
batch of one or two small files converts in the process that was asked.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stepscope.store import ingest


def _files(folder: Path, count: int, size: int, suffix: str = ".json.gz") -> list[Path]:
    """``count`` files of ``size`` bytes (sparse: only their size is read)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(count):
        path = folder / f"rank{k}{suffix}"
        with path.open("wb") as handle:
            handle.truncate(size)
        out.append(path)
    return out


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)


SMALL = 130_000
"""A small rank's gzipped trace (hta/trace_filter/sampled_rank-0: 4,855 events, 129 KB)."""


def test_eight_small_ranks_are_split_over_the_cores(tmp_path: Path, two_cores: None) -> None:
    files = _files(tmp_path, 8, SMALL)
    expected = 8 * ingest.CONVERT_FIXED_S + 8 * SMALL / 2**20 * ingest.CONVERT_S_PER_MB
    assert ingest.expected_convert_s(files) == pytest.approx(expected)
    assert ingest.default_jobs(files) == 2


def test_one_or_two_small_files_convert_here(tmp_path: Path, two_cores: None) -> None:
    assert ingest.default_jobs(_files(tmp_path / "one", 1, SMALL)) == 1
    assert ingest.default_jobs(_files(tmp_path / "two", 2, SMALL)) == 1


def test_one_file_converts_here_however_large(tmp_path: Path, two_cores: None) -> None:
    assert ingest.default_jobs(_files(tmp_path, 1, 200 << 20)) == 1


def test_two_large_files_are_split(tmp_path: Path, two_cores: None) -> None:
    """Two traces like df_index_resolver (3 MB gzipped, 2.8 s each) are worth two workers."""
    assert ingest.default_jobs(_files(tmp_path, 2, 3 << 20)) == 2


def test_plain_json_costs_as_its_gzip_would(tmp_path: Path, two_cores: None) -> None:
    """Three plain files of 2 MB (about 130 KB gzipped each) are three small traces: here."""
    plain = _files(tmp_path / "plain", 3, 2 << 20, suffix=".json")
    assert ingest.expected_convert_s(plain) < ingest.AUTO_JOBS_MIN_S
    assert ingest.default_jobs(plain) == 1
    assert ingest.default_jobs(_files(tmp_path / "gz", 3, 2 << 20)) == 2
