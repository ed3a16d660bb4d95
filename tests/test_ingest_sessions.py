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


# A run holds one job (issue 24): world size, device model and recording date.

EPOCH_US = 1_700_000_000 * 10**6
"""2023-11-14 22:13 UTC on the epoch clock, in us: the built traces' dates."""
HOUR_US = 60 * MINUTES_US
DAY_US = 24 * HOUR_US
A100 = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_000_000_000, "numSms": 108}]
V100 = [{"id": 0, "name": "Tesla V100-SXM2-16GB", "totalGlobalMem": 16_900_000_000, "numSms": 80}]


def _rank(folder: Path, name: str, rank: int, *, shift_us: int = 0, world: int | None = 8,
          devices: list[dict[str, Any]] | None = None, steps: tuple[int, ...] = (7, 8), pid: int | None = None) -> Path:
    dist = {"rank": rank, **({"world_size": world} if world is not None else {})}
    top: dict[str, Any] = {"distributedInfo": dist}
    if devices is not None:
        top["deviceProperties"] = devices
    return write_trace(folder / name, _events(EPOCH_US + shift_us, steps=steps, pid=100 + rank if pid is None else pid),
                       **top)


def test_a_trace_of_another_world_size_is_a_run_of_its_own_or_refused(tmp_path: Path, capsys) -> None:
    from stepscope.cli import main

    store = tmp_path / "store"
    assert ingest_paths([_rank(tmp_path / "job", "rank0.json", 0), _rank(tmp_path / "job", "rank1.json", 1)],
                        store, "job").ok
    other = _rank(tmp_path / "other", "rank2.json", 2, world=64)
    before = sorted(p.read_bytes() for p in store.rglob("*.parquet"))
    assert main(["ingest", str(other), "--store", str(store), "--run", "job", "--on-conflict", "refuse"]) == 3
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"{other}: not of the job of run job's ranks (world size 64, the run's 8 (")
    assert str(tmp_path / "job" / "rank0.json") in line and line.endswith("--on-conflict session stores it as a run of its own)")
    assert sorted(p.read_bytes() for p in store.rglob("*.parquet")) == before  # nothing stored, nothing lost
    assert main(["ingest", str(other), "--store", str(store), "--run", "job"]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith(str(other))]
    assert line.startswith(f"{other}: run job-session2 rank 2") and "world size 64, the run's 8" in line
    assert line.endswith("stored as run job-session2")
    assert _runs(store) == {"job": [0, 1], "job-session2": [2]}


def test_a_trace_on_another_device_model_is_another_job(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert ingest_paths([_rank(tmp_path, "rank0.json", 0, devices=A100)], store, "job").ok
    with pytest.raises(TraceFormatError, match="device Tesla V100-SXM2-16GB, the run's NVIDIA A100-SXM4-80GB"):
        ingest_trace_file(_rank(tmp_path, "rank1.json", 1, devices=V100), store, "job", on_conflict="refuse")
    assert ingest_trace_file(_rank(tmp_path, "rank1.json", 1, devices=V100), store, "job").run == "job-session2"
    # Facts a trace does not record are not held against it: no world size, no device.
    assert ingest_trace_file(_rank(tmp_path, "rank2.json", 2, world=None), store, "job").run == "job"
    assert _runs(store) == {"job": [0, 2], "job-session2": [1]}


def test_a_trace_recorded_further_than_the_runs_span_plus_a_day_is_another_job(tmp_path: Path) -> None:
    """One process's profiling cycles 20 h apart stay one run for two days (each within the run's
    span plus a day); a rank recorded more than that after them is another job."""
    store = tmp_path / "store"
    for cycle in range(3):
        outcome = ingest_trace_file(_rank(tmp_path / f"cycle{cycle}", "rank0.json", 0, shift_us=cycle * 20 * HOUR_US,
                                          steps=(10 * cycle + 1, 10 * cycle + 2), pid=7), store, "job")
        assert outcome.run == "job" and outcome.note is None
    # The run spans 40 h: a trace recorded 40 h + 1 day + 1 h after its last end is too far, 1 h less is not.
    late = _rank(tmp_path, "rank1.json", 1, shift_us=40 * HOUR_US + 40 * HOUR_US + DAY_US + HOUR_US)
    with pytest.raises(TraceFormatError, match=r"recorded 2023-11-19 07:13 UTC, 2\.7 days after the run's ranks") as refused:
        ingest_trace_file(late, store, "job", on_conflict="refuse")
    assert str(tmp_path / "cycle2" / "rank0.json") in str(refused.value) and "the run spans 1.7 days" in str(refused.value)
    near = _rank(tmp_path, "rank2.json", 2, shift_us=40 * HOUR_US + 40 * HOUR_US + DAY_US - HOUR_US)
    assert ingest_trace_file(near, store, "job").run == "job"
    # A trace whose clock is not a date (relative ts, no baseTimeNanoseconds) has no date to compare.
    relative = write_trace(tmp_path / "rank3.json", _events(), distributedInfo={"rank": 3, "world_size": 8})
    assert ingest_trace_file(relative, store, "job").run == "job"
    assert _runs(store) == {"job": [0, 0, 0, 2, 3]}


def test_the_job_record_is_rebuilt_from_the_runs_ranks_when_missing(tmp_path: Path) -> None:
    """A run stored before the record existed (or copied without its index) has its job read
    from its ``sources`` rows."""
    store = tmp_path / "store"
    assert ingest_paths([_rank(tmp_path, "rank0.json", 0), _rank(tmp_path, "rank1.json", 1)], store, "job").ok
    record = store / ".content" / "run=job" / "job.json"
    assert json.loads(record.read_text())["world_size"]["value"] == 8
    record.unlink()
    with pytest.raises(TraceFormatError, match="world size 16, the run's 8"):
        ingest_trace_file(_rank(tmp_path, "rank2.json", 2, world=16), store, "job", on_conflict="refuse")
    assert ingest_trace_file(_rank(tmp_path, "rank2.json", 2), store, "job").run == "job"
    assert json.loads(record.read_text())["world_size"]["value"] == 8


def test_the_jobs_of_two_batches_gather_in_their_runs(tmp_path: Path) -> None:
    """Ranks of a second job ingested into the same run gather in one run of their own."""
    store = tmp_path / "store"
    first = [_rank(tmp_path / "a", f"rank{r}.json", r, devices=A100) for r in range(2)]
    second = [_rank(tmp_path / "b", f"rank{r}.json", r, world=2, devices=V100, shift_us=90 * DAY_US) for r in range(2)]
    report = ingest_paths(first + second, store, "job")
    assert report.ok, report.errors
    assert _runs(store) == {"job": [0, 1], "job-session2": [0, 1]}
    notes = [t.note for t in report.stored if t.note]
    assert len(notes) == 2 and all("world size 2, the run's 8" in n and "device Tesla V100-SXM2-16GB" in n
                                   and "90.0 days after" in n for n in notes)


@pytest.mark.shared
def test_hta_trace_diff_control_is_not_a_rank_of_the_trace_filter_run(shared_traces: Path, tmp_path: Path,
                                                                     ingested, capsys) -> None:
    """The case reported: ``trace_diff/control`` (rank 3 of 8, A100, 2022-08-22) ingested into a
    run holding the two ``trace_filter`` ranks (of 128, no device recorded, 2023-04-28) was stored
    as rank 3 of it. World sizes from MANIFEST.md; dates read from the traces' first events. The
    run is a copy of the session's store of the ``trace_filter`` folder (run ``t``), which is what
    ``stepscope ingest`` of the folder writes (tests/test_suite_setup.py)."""
    from stepscope.cli import main
    from tests.conftest import copy_store

    sampled = shared_traces / "hta" / "trace_filter"
    store = copy_store(ingested("hta/trace_filter"), tmp_path / "store")
    control = shared_traces / "hta" / "trace_diff" / "control" / "control.json.gz"
    assert _runs(store) == {"t": [0, 1]}
    assert main(["ingest", str(control), "--store", str(store), "--run", "t", "--on-conflict", "refuse"]) == 3
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"{control}: not of the job of run t's ranks (world size 8, the run's 128 "
                           f"({sampled / 'sampled_rank-0.json.gz'}); recorded 2022-08-22 21:24 UTC, ")
    assert "days before the run's ranks" in line and "2023-04-28 23:51 UTC" in line
    assert _runs(store) == {"t": [0, 1]}
    assert main(["ingest", str(control), "--store", str(store), "--run", "t"]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith(str(control))]
    assert line.startswith(f"{control}: run t-session2 rank 3 (rank from distributedInfo)")
    assert line.endswith("stored as run t-session2")
    assert _runs(store) == {"t": [0, 1], "t-session2": [3]}
