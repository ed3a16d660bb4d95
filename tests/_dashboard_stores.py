"""Stores the dashboard tests open: the bundled sample traces, or a tiny generated run."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from stepscope.store.ingest import ingest_paths
from tests.conftest import REPO, SHARED_TRACES, built_once, copy_run, ingested_store, sample_store, write_trace

SHARED_RUNS = {
    "control": ["hta/trace_diff/control/control.json.gz"],
    "test": ["hta/trace_diff/test/test.json.gz"],
    "sampled": ["hta/trace_filter/sampled_rank-0.json.gz", "hta/trace_filter/sampled_rank-1.json.gz"],
    "dfir": ["hta/df_index_resolver/df_index_resolver.json.gz"],
}
"""The runs of shared traces that the dashboard tests open (run name -> its files in
../shared/traces), all in one store (:func:`build_shared_store`)."""


def _tiny_trace(path: Path, rank: int) -> Path:
    """Two profiled steps with a compute kernel, an NCCL all-reduce and an H2D copy each."""
    events: list[dict[str, Any]] = []
    for step in range(2):
        t = 1_000 * step
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": t, "dur": 900, "pid": 1, "tid": 1},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 10, "dur": 5, "pid": 1, "tid": 1,
             "args": {"correlation": 10 * step + 1}},
            {"ph": "X", "cat": "kernel", "name": "volta_sgemm", "ts": t + 20, "dur": 300, "pid": 0, "tid": 7,
             "args": {"correlation": 10 * step + 1, "stream": 7, "device": 0}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 30, "dur": 5, "pid": 1, "tid": 1,
             "args": {"correlation": 10 * step + 2}},
            {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ts": t + 400 + rank * 7,
             "dur": 200, "pid": 0, "tid": 20, "args": {"correlation": 10 * step + 2, "stream": 20, "device": 0}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": t + 40, "dur": 5, "pid": 1, "tid": 1,
             "args": {"correlation": 10 * step + 3}},
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": t + 650, "dur": 100,
             "pid": 0, "tid": 21, "args": {"correlation": 10 * step + 3, "stream": 21, "device": 0, "bytes": 1 << 24}},
            {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "ts": t + 15, "pid": 1, "tid": 1,
             "args": {"Addr": 4096 + step, "Bytes": 1 << 20, "Total Allocated": (step + 1) << 20,
                      "Total Reserved": 4 << 20, "Device Type": 1, "Device Id": 0}},
        ]
    return write_trace(path, events, distributedInfo={"rank": rank, "world_size": 2, "backend": "nccl"},
                       deviceProperties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85899345920}])


def build_sample_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled sample traces (``sample_traces/<run>/``), or a tiny generated run when absent:
    built once per test run and shared by every file and xdist worker that opens it."""
    return built_once(tmp_path_factory, "dash-sample", functools.partial(_ingest_samples, tmp_path_factory))


def build_shared_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs of :data:`SHARED_RUNS` in one store, made once per test run and shared by
    every file and xdist worker that opens them (the AppTests read it; the browser's store
    copies its runs from it)."""
    return built_once(tmp_path_factory, "dash-shared", functools.partial(_copy_shared_runs, tmp_path_factory))


def _copy_shared_runs(tmp_path_factory: pytest.TempPathFactory, root: Path) -> None:
    """Each run of :data:`SHARED_RUNS` in ``root``, copied from the test run's store of its file,
    or of the folder that holds its files and nothing else (:func:`tests.conftest.ingested_store`:
    the every-trace sweep, the HTA cross-checks and others ingest the same inputs). A copied run
    keeps the ingest time of the store it comes from, so which run is the newest (the one the
    dashboard opens on) is not fixed: the tests name the run they open."""
    for run, files in SHARED_RUNS.items():
        folder = Path(files[0]).parent
        if len(files) > 1:
            assert sorted(p.name for p in (SHARED_TRACES / folder).iterdir()) == sorted(Path(f).name for f in files)
        copy_run(ingested_store(tmp_path_factory, files[0] if len(files) == 1 else folder.as_posix()), root, "t", run)


def _ingest_samples(tmp_path_factory: pytest.TempPathFactory, root: Path) -> None:
    """Every sample run (``sample_traces/<run>/``) in ``root``, copied from its own store of the
    test run (:func:`tests.conftest.sample_store`, ingested once for every test that reads it),
    or two tiny generated ranks when there are no samples."""
    folders = sorted(p for p in (REPO / "sample_traces").glob("*") if p.is_dir())
    if not folders:
        traces = tmp_path_factory.mktemp("tiny")
        for rank in range(2):
            _tiny_trace(traces / f"rank{rank}.json", rank)
        report = ingest_paths([traces], root, traces.name)
        assert report.ok, report.errors
    for folder in folders:
        copy_run(sample_store(tmp_path_factory, folder.name), root, folder.name)
