"""Two recordings of one rank are two sessions, stored as two runs and never pooled.

The project-made pair: one small GPU trace recorded twice (the second minutes later, with the
same step numbers), as a rerun of a job writes it; and the kineto ResNet-50 sample folder, whose
two ``worker0`` files were recorded 4.5 minutes apart by two processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stepscope.errors import TraceFormatError
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths, ingest_trace_file
from tests.conftest import write_trace

REPO = Path(__file__).resolve().parents[1]
MINUTES_US = 60 * 10**6


def _events(shift_us: int = 0, steps: tuple[int, ...] = (7, 8), pid: int = 1) -> list[dict[str, Any]]:
    """Two steps of one launch and one kernel each, ``shift_us`` later."""
    events = []
    for k, step in enumerate(steps):
        base = 1_000 + k * 200 + shift_us
        corr = 40 + k
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": pid, "tid": 1,
             "ts": base, "dur": 100},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": 1, "ts": base + 10,
             "dur": 5, "args": {"correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": base + 150, "dur": 20,
             "args": {"correlation": corr, "stream": 7, "device": 0}},
        ]
    return events


def _runs(store: Path) -> dict[str, list[int]]:
    rows = open_store(store).sql("SELECT run, list(rank ORDER BY rank) AS ranks FROM sources GROUP BY run").to_pylist()
    return {r["run"]: r["ranks"] for r in rows}


def test_a_rerun_minutes_later_with_the_same_steps_is_a_run_of_its_own(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    write_trace(folder / "a" / "rank0.json", _events(), distributedInfo={"rank": 0})
    write_trace(folder / "b" / "rank0.json", _events(shift_us=8 * MINUTES_US), distributedInfo={"rank": 0})
    store = tmp_path / "store"
    done = subprocess.run([sys.executable, "-m", "stepscope.cli", "ingest", str(folder), "--store", str(store),
                           "--run", "job"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert _runs(store) == {"job": [0], "job-session2": [0]}
    [line] = [line for line in done.stdout.splitlines() if "session2" in line]
    assert line.startswith(f"{folder / 'b' / 'rank0.json'}: run job-session2 rank 0")
    assert "another recording of rank 0" in line and "both hold step 7, 8" in line
    assert str(folder / "a" / "rank0.json") in line
    # Whole-trace totals stay inside one session: each run's GPU span is its own recording's.
    spans = open_store(store).sql(
        "SELECT run, max(ts_ns + dur_ns) - min(ts_ns) AS span FROM events WHERE kind = 'kernel' GROUP BY run"
    ).to_pylist()
    assert {r["run"]: r["span"] for r in spans} == {"job": 220_000, "job-session2": 220_000}  # 1150..1370 us
    # The same file again: skipped where it is, not stored a third time.
    again = ingest_trace_file(folder / "b" / "rank0.json", store, "job")
    assert again.skipped and again.run == "job-session2"
    assert _runs(store) == {"job": [0], "job-session2": [0]}


def test_the_ranks_of_a_second_recording_gather_in_one_run(tmp_path: Path) -> None:
    store = tmp_path / "store"
    files = []
    for session, shift in (("first", 0), ("second", 5 * MINUTES_US)):
        for rank in range(3):
            files.append(write_trace(tmp_path / session / f"rank{rank}.json", _events(shift, pid=100 + rank),
                                     distributedInfo={"rank": rank}))
    report = ingest_paths(files, store, "job")
    assert report.ok, report.errors
    assert _runs(store) == {"job": [0, 1, 2], "job-session2": [0, 1, 2]}
    assert [t.note is not None for t in report.stored] == [False] * 3 + [True] * 3


def test_another_process_is_another_session_and_refuse_says_so(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = write_trace(tmp_path / "a.json", _events(pid=118), distributedInfo={"rank": 0})
    other = write_trace(tmp_path / "b.json", _events(shift_us=2_000, steps=(9, 10), pid=119),
                        distributedInfo={"rank": 0})
    ingest_trace_file(first, store, "job")
    with pytest.raises(TraceFormatError) as info:
        ingest_trace_file(other, store, "job", on_conflict="refuse")
    message = str(info.value)
    assert message.startswith(f"{other}: another recording of rank 0: run job holds {first}")
    assert "pid 119" in message and "pid 118" in message and "--on-conflict" in message
    assert _runs(store) == {"job": [0]}
    assert not list((store / "events").glob("run=*/rank=0/part-*.parquet"))[1:], "the refused parts are gone"
    stored = ingest_trace_file(other, store, "job")
    assert stored.run == "job-session2"


def test_cycles_of_one_process_stay_one_run(tmp_path: Path) -> None:
    """Profiling cycles: one process, new step numbers, seconds apart (what the collector writes)."""
    store = tmp_path / "store"
    for cycle in range(3):
        path = write_trace(tmp_path / f"cycle{cycle}.json", _events(shift_us=cycle * 30 * 10**6,
                                                                    steps=(10 * cycle, 10 * cycle + 1)),
                           distributedInfo={"rank": 0})
        assert ingest_trace_file(path, store, "job").run == "job"
    assert _runs(store) == {"job": [0, 0, 0]}


def test_traces_without_a_process_id_are_two_sessions_when_far_apart(tmp_path: Path) -> None:
    def unnamed(shift_us: int, steps: tuple[int, ...]) -> list[dict[str, Any]]:
        return [dict(e, pid="Spans") if e["pid"] == 1 else e for e in _events(shift_us, steps)]

    store = tmp_path / "store"
    near = write_trace(tmp_path / "near.json", unnamed(0, (1, 2)), distributedInfo={"rank": 0})
    close = write_trace(tmp_path / "close.json", unnamed(10_000, (3, 4)), distributedInfo={"rank": 0})
    far = write_trace(tmp_path / "far.json", unnamed(20 * MINUTES_US, (5, 6)), distributedInfo={"rank": 0})
    assert [ingest_trace_file(p, store, "job").run for p in (near, close, far)] == ["job", "job", "job-session2"]


@pytest.mark.shared
def test_the_kineto_resnet_folder_is_two_sessions(shared_traces: Path, tmp_path: Path) -> None:
    folder = shared_traces / "kineto_tb_plugin" / "old_2021-02"
    store = tmp_path / "store"
    report = ingest_paths([folder], store)
    assert report.ok, report.errors
    assert _runs(store) == {"old_2021-02": [0], "old_2021-02-session2": [0]}
    [note] = [t.note for t in report.stored if t.note]
    assert "pid 119771" in note and "pid 118664" in note
    # Neither run's GPU span covers the gap between the recordings (470,896 ms when pooled).
    spans = open_store(store).sql(
        "SELECT run, (max(ts_ns + dur_ns) - min(ts_ns)) / 1e6 AS ms FROM events WHERE kind = 'kernel' GROUP BY run"
    ).to_pylist()
    assert all(r["ms"] < 10_000 for r in spans), spans
    summary = subprocess.run([sys.executable, "-m", "stepscope.cli", "summary", "--run", "old_2021-02-session2",
                              "--store", str(store), "--format", "json"], cwd=REPO, capture_output=True,
                             text=True, timeout=300)
    assert summary.returncode == 0, summary.stderr
    assert json.loads(summary.stdout)


def test_jobs_commit_in_the_batchs_order_with_the_same_rules(tmp_path: Path) -> None:
    """``--jobs 2`` stores what ``--jobs 1`` stores: ranks by position, dedupe, sessions, lines."""
    folder = tmp_path / "traces"
    write_trace(folder / "a.json", _events())                         # rank from position 0
    write_trace(folder / "b.json", _events(pid=2))                    # position 1
    write_trace(folder / "c.json", _events(shift_us=9 * MINUTES_US))  # position 2
    (folder / "d.json.gz").write_bytes(__import__("gzip").compress((folder / "a.json").read_bytes()))
    (folder / "e.json").write_text("{not json")
    outcomes = {}
    for jobs in (1, 2):
        store = tmp_path / f"store{jobs}"
        done = subprocess.run([sys.executable, "-m", "stepscope.cli", "ingest", str(folder), "--store", str(store),
                               "--run", "job", "--jobs", str(jobs)], cwd=REPO, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 3, done.stderr
        outcomes[jobs] = (done.stdout.replace(str(store), "STORE"), done.stderr, _runs(store))
    assert outcomes[1] == outcomes[2]
    stdout, stderr, runs = outcomes[1]
    assert runs == {"job": [0, 1, 2]} and "same trace as" in stdout and stderr.count("\n") == 1
