"""tests/hta_runner.py, the HTA side of the cross-checks: does it load what we think it loads?

The analysis tests compare stepscope's numbers with HTA's; these tests make sure the runner
hands them the right ranks and that both ways of naming traces give HTA the same input.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import load_raw
from tests.hta_runner import HTA_PYTHON_ENV, find_hta_python, run_hta

TWO_RANKS = "hta/trace_filter"  # sampled_rank-0/-1 of a 128-rank NCCL job; small and fast


@pytest.mark.shared
def test_ranks_come_from_distributed_info(hta_python: Path, shared_traces: Path) -> None:
    folder = shared_traces / TWO_RANKS
    expected = sorted(load_raw(f)["distributedInfo"]["rank"] for f in folder.glob("*.json.gz"))
    result = run_hta(hta_python, trace_dir=folder)
    assert result["ranks"] == expected == [0, 1]
    for table in ("temporal_breakdown", "comm_comp_overlap"):
        assert sorted(row["rank"] for row in result[table]) == expected, table
    # Idle time for every rank, not HTA's default of rank 0 only.
    assert {row["rank"] for row in result["idle_time_breakdown"]} == set(expected)


@pytest.mark.shared
def test_trace_files_mode_matches_trace_dir_mode(hta_python: Path, shared_traces: Path) -> None:
    folder = shared_traces / TWO_RANKS
    files = {load_raw(f)["distributedInfo"]["rank"]: f for f in folder.glob("*.json.gz")}
    by_dir = run_hta(hta_python, trace_dir=folder)
    by_files = run_hta(hta_python, trace_files=files)
    assert by_files == by_dir


def test_runner_needs_exactly_one_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        run_hta("python", trace_dir=tmp_path, trace_files={0: tmp_path / "a.json"})
    with pytest.raises(ValueError):
        run_hta("python")


def test_find_hta_python_honours_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.setenv(HTA_PYTHON_ENV, str(tmp_path / "missing" / "python"))
    assert find_hta_python() is None
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(HTA_PYTHON_ENV, str(fake))
    assert find_hta_python() == fake
