"""Comparability counts the ranks a run stores, not only the world size its traces claim.

An 8-rank and a 16-rank run were judged comparable because both traces claimed the same world
size. Here two generated runs claim world size 4; one stores 2 ranks, the other 3.
"""

from __future__ import annotations

import json
from pathlib import Path

from stepscope.cli import main
from tests.conftest import write_trace


def _rank_events(step_count: int = 4) -> list[dict]:
    events = []
    for step in range(step_count):
        base = 1_000 + step * 1_000
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
             "ts": base, "dur": 900},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": base + 10,
             "dur": 5, "args": {"correlation": step + 1}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": base + 20, "dur": 500,
             "args": {"correlation": step + 1, "stream": 7, "device": 0}},
        ]
    return events


def _run(folder: Path, ranks: int) -> Path:
    for rank in range(ranks):
        write_trace(folder / f"rank{rank}.json", _rank_events(),
                    distributedInfo={"rank": rank, "world_size": 4, "backend": "nccl"},
                    deviceProperties=[{"id": 0, "name": "NVIDIA H100", "totalGlobalMem": 80 << 30}])
    return folder


def test_runs_storing_different_rank_counts_are_inconclusive(tmp_path: Path, capsys) -> None:
    store = tmp_path / "store"
    assert main(["ingest", str(_run(tmp_path / "two", 2)), "--store", str(store), "--run", "two", "--quiet"]) == 0
    assert main(["ingest", str(_run(tmp_path / "three", 3)), "--store", str(store), "--run", "three", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["compare", "two", "three", "--store", str(store), "--format", "json"]) == 4
    doc = json.loads(capsys.readouterr().out)
    checks = {c["check"]: c for c in doc["comparability"]["checks"]}
    assert checks["world_size"]["ok"] is True  # both claim 4
    assert checks["ranks"] == {"check": "ranks", "ok": False, "baseline": 2, "candidate": 3,
                               "reason": "stored rank count differs: baseline 2, candidate 3"}
    assert "stored rank count differs: baseline 2, candidate 3" in doc["verdict"]["reasons"]
    assert main(["compare", "two", "two", "--store", str(store), "--format", "json"]) == 0
    assert next(c for c in json.loads(capsys.readouterr().out)["comparability"]["checks"]
                if c["check"] == "ranks")["ok"] is True
