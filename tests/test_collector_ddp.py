"""A real 2-rank gloo DDP run under ``stepscope.profile``, checked against independent counts.

One run of the DDP example (``ddp_recording``: once per test run, shared with
test_analysis_comm's gloo tests) feeds every test here.
"""

from __future__ import annotations

import json
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stepscope.store import open_store  # noqa: E402
from tests.collector_support import element_count, gradient_ready_order, greedy_buckets  # noqa: E402

from tests.conftest import DDP_RECORDING, load_raw  # noqa: E402

pytestmark = pytest.mark.slow

WAIT, WARMUP, ACTIVE, STEPS = (DDP_RECORDING[k] for k in ("wait", "warmup", "active", "steps"))
RECORDED = list(range(WAIT + WARMUP, WAIT + WARMUP + ACTIVE))
BUCKET_CAP_MB = DDP_RECORDING["bucket_cap_mb"]


@pytest.fixture(scope="module")
def ddp_run(ddp_recording: Path) -> dict[str, Any]:
    """The session's DDP recording (tests/conftest.py), shared with test_analysis_comm."""
    return {"store": open_store(ddp_recording / "store"), "traces": ddp_recording / "traces",
            "run": "ddp-test-2-ranks"}


def test_one_run_with_two_ranks(ddp_run: dict[str, Any]) -> None:
    runs = ddp_run["store"].sql("SELECT run, name, ranks, world_size, backend FROM runs").to_pylist()
    assert runs == [{"run": ddp_run["run"], "name": "ddp test/2 ranks", "ranks": 2,
                     "world_size": 2, "backend": "gloo"}]
    files = sorted(p.name for p in ddp_run["traces"].iterdir())
    assert files == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]


def test_profiled_steps_are_the_scheduled_ones(ddp_run: dict[str, Any]) -> None:
    rows = ddp_run["store"].sql("SELECT rank, list(step ORDER BY step) AS steps FROM steps "
                                "GROUP BY rank ORDER BY rank").to_pylist()
    assert rows == [{"rank": 0, "steps": RECORDED}, {"rank": 1, "steps": RECORDED}]
    for rank in (0, 1):
        raw = load_raw(ddp_run["traces"] / f"rank{rank}.pt.trace.json.gz")
        names = sorted(e["name"] for e in raw["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
        assert names == [f"ProfilerStep#{s}" for s in RECORDED]
        assert raw["distributedInfo"]["rank"] == rank


def test_every_step_is_timed(ddp_run: dict[str, Any]) -> None:
    import toy_transformer

    cfg = toy_transformer.ToyConfig()
    rows = ddp_run["store"].sql(
        "SELECT rank, step, wall_ns, gpu_ns, profiled, tokens, samples FROM step_times ORDER BY rank, step"
    ).to_pylist()
    assert [(r["rank"], r["step"]) for r in rows] == [(k, s) for k in (0, 1) for s in range(STEPS)]
    assert [r["step"] for r in rows if r["profiled"]] == RECORDED * 2
    assert all(r["wall_ns"] > 0 and r["gpu_ns"] is None for r in rows)
    assert {(r["tokens"], r["samples"]) for r in rows} == {(cfg.batch * cfg.seq, cfg.batch)}


def test_allreduce_sizes_match_ddp_buckets(ddp_run: dict[str, Any]) -> None:
    """Each recorded step all-reduces DDP's buckets: sizes computed from the model, not the trace."""
    import toy_transformer

    cfg = toy_transformer.ToyConfig()
    model, _ = toy_transformer.build(cfg)
    batch = toy_transformer.synthetic_batch(cfg, torch.Generator().manual_seed(0))
    order = gradient_ready_order(model, batch)
    expected = sorted(greedy_buckets(order, int(BUCKET_CAP_MB * 1024 * 1024)))
    assert sum(expected) == sum(p.numel() for p in model.parameters())
    assert len(expected) > 1, "the cap must split the gradients, or the check proves little"

    stored = ddp_run["store"].sql(
        "SELECT rank, step, list(in_nelems ORDER BY in_nelems) AS sizes, list(DISTINCT collective) AS kinds "
        "FROM events WHERE name = 'c10d::allreduce_' AND category = 'communication' "
        "GROUP BY ALL ORDER BY ALL").to_pylist()
    assert stored == [{"rank": k, "step": s, "sizes": expected, "kinds": ["all_reduce"]}
                      for k in (0, 1) for s in RECORDED]
    for rank in (0, 1):  # hand count from the raw JSON
        raw = load_raw(ddp_run["traces"] / f"rank{rank}.pt.trace.json.gz")
        sizes = Counter(element_count(e["args"]["Input Dims"]) for e in raw["traceEvents"]
                        if e.get("name") == "c10d::allreduce_")
        assert sizes == Counter(expected * len(RECORDED))
        gloo = Counter(element_count(e["args"]["Input Dims"]) for e in raw["traceEvents"]
                       if e.get("name") == "gloo:all_reduce")
        assert gloo == sizes
    # The gloo thread's annotation carries the element type: fp32, so 4 bytes per element.
    gloo_rows = ddp_run["store"].sql(
        "SELECT DISTINCT dtype, bytes = 4 * in_nelems AS four_bytes_each FROM events "
        "WHERE name = 'gloo:all_reduce'").to_pylist()
    assert gloo_rows == [{"dtype": "float", "four_bytes_each": True}]


def test_metadata_is_recorded(ddp_run: dict[str, Any]) -> None:
    rows = ddp_run["store"].sql("SELECT rank, rank_from, metadata, tags, distributed_info "
                                "FROM sources ORDER BY rank").to_pylist()
    assert [r["rank"] for r in rows] == [0, 1]
    for row in rows:
        meta = json.loads(row["metadata"])
        assert row["rank_from"] == "collector"
        assert meta["torch_version"] == torch.__version__
        assert meta["hostname"] == socket.gethostname()
        assert meta["rank"] == row["rank"] and meta["world_size"] == 2
        assert meta["backend"] == "gloo"
        assert meta["gpu_count"] == 0 and meta["cuda_version"] == torch.version.cuda
        assert isinstance(meta["command_line"], list) and meta["command_line"]
        assert "git_commit" in meta
        assert json.loads(row["tags"]) == {"example": "train_ddp_cpu"}
        assert "pg_config" in json.loads(row["distributed_info"])


def test_memory_events_are_labelled_by_role(ddp_run: dict[str, Any]) -> None:
    """Every recorded step allocates each gradient once (zero_grad(set_to_none=True)); the events
    matched to the ``gradient`` role must be exactly those: one per parameter, its exact size."""
    import toy_transformer

    model, _ = toy_transformer.build(toy_transformer.ToyConfig())
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    n_params = len(list(model.parameters()))
    labelled = ddp_run["store"].sql(
        """
        WITH last_alloc AS (
          SELECT m.*, row_number() OVER (PARTITION BY run, rank, source, step, addr
                                         ORDER BY ts_ns DESC) AS k
          FROM memory m WHERE bytes > 0)
        SELECT a.rank, a.step, r.role, count(*) AS n, sum(a.bytes) AS bytes
        FROM last_alloc a JOIN memory_roles r
          ON a.run = r.run AND a.rank = r.rank AND a.source = r.source AND a.step = r.step
         AND a.addr = r.addr AND a.bytes = r.bytes
        WHERE a.k = 1
        GROUP BY ALL ORDER BY ALL
        """).to_pylist()
    assert labelled == [{"rank": k, "step": s, "role": "gradient", "n": n_params, "bytes": param_bytes}
                        for k in (0, 1) for s in RECORDED]
    roles = ddp_run["store"].sql(
        "SELECT rank, step, role, count(*) AS n, sum(bytes) AS bytes FROM memory_roles "
        "GROUP BY ALL ORDER BY ALL").to_pylist()
    # AdamW keeps exp_avg and exp_avg_sq (parameter-sized) and a 4-byte float32 step per parameter.
    expected = {"gradient": (n_params, param_bytes), "parameter": (n_params, param_bytes),
                "optimizer_state": (3 * n_params, 2 * param_bytes + 4 * n_params)}
    # Gradients are seen at every recorded step, parameters and optimizer state at the last.
    assert roles == [{"rank": k, "step": s, "role": role, "n": n, "bytes": b}
                     for k in (0, 1) for s in RECORDED for role, (n, b) in sorted(expected.items())
                     if role == "gradient" or s == RECORDED[-1]]
    other = ddp_run["store"].sql(
        "SELECT count(*) AS n FROM memory WHERE bytes > 0 AND step IS NOT NULL").to_pylist()[0]["n"]
    assert other > 2 * len(RECORDED) * n_params, "activations and temporaries remain unlabelled"


def test_torchrun_ranks_write_one_run(tmp_path: Path) -> None:
    """Under torchrun (each process one rank, rank from the environment) the ranks agree on one
    run, and each writes its own partition."""
    import subprocess
    import sys

    from tests.collector_support import EXAMPLES

    store = tmp_path / "store"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node=2", str(EXAMPLES / "train_ddp_cpu.py"), "--steps", "5",
                    "--wait", "1", "--warmup", "1", "--active", "1", "--store", str(store),
                    "--run-name", "via torchrun"],
                   check=True, capture_output=True, timeout=240)
    opened = open_store(store)
    assert opened.sql("SELECT run, ranks, world_size, backend FROM runs").to_pylist() == [
        {"run": "via-torchrun", "ranks": 2, "world_size": 2, "backend": "gloo"}]
    assert opened.sql("SELECT rank, count(*) AS n FROM step_times GROUP BY rank ORDER BY rank"
                      ).to_pylist() == [{"rank": 0, "n": 5}, {"rank": 1, "n": 5}]


def test_unnamed_run_takes_rank_zeros_name() -> None:
    import torch.multiprocessing as mp
    import train_ddp_cpu

    from tests.collector_support import agree_in_group

    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.spawn(agree_in_group, args=(2, train_ddp_cpu.free_port(), results), nprocs=2, join=True)
    got = sorted(results.get() for _ in range(2))
    assert got == [(0, "named-by-rank-0", "given"), (1, "named-by-rank-0", "given")]
