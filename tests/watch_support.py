"""A 2-rank gloo job under ``stepscope.profile(watch=...)``, for tests/test_collector_watch.py.

Each rank trains a tiny model (with DDP, so the capture holds real cross-rank collectives, or
alone) and pads every step with a short sleep so that step times are steady on a shared 2-core
machine. Rank ``slow_rank`` can sleep 4x its median step at given steps (the step then takes 5x
its usual time), and rank 1 can die while rank 0 waits for it in the watch's all-gather. Each
surviving rank reports what it saw through a queue; the independent side of every check (which
steps were slowed, by how much) comes from here, not from stepscope: ``walls_ns`` times each
whole step (``prof.step()`` included), ``works_ns`` the user's own work in it (up to the call of
``prof.step()``, what the watch judges).
"""

from __future__ import annotations

import logging
import os
import signal
import statistics
import time
from dataclasses import dataclass
from typing import Any

import stepscope
from tests.collector_support import PATIENT_FLUSH_S  # also puts examples/ (toy_transformer) on the path

REPORTED = logging.INFO


@dataclass(frozen=True)
class WatchJob:
    """Everything a rank needs (picklable, for ``spawn``)."""

    store: str
    run: str
    watch: stepscope.Watch
    steps: int = 120
    slow_rank: int = 1
    slow_at: tuple[int, ...] = ()
    """Steps at whose end ``slow_rank`` sleeps 4x its median step (after its collectives)."""
    stall_s: float | None = None
    """Sleep this long at those steps instead."""
    die_at: int | None = None
    """Step at whose end rank 1 dies, half a second after rank 0 entered the exchange."""
    ddp: bool = True
    pad_s: float = 0.05
    wait: int = 3
    warmup: int = 1
    active: int = 2
    trace_dir: str | None = None
    strict: bool = True
    convert: str = "process"
    """The default: the niced child can take many seconds on a loaded 2-core machine, and the
    steps meanwhile are judged against the other rank's (in the writer thread the whole
    conversion would be blind)."""


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(REPORTED)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelname, record.getMessage()))


def watch_rank(rank: int, world_size: int, port: int, job: WatchJob, results: Any) -> None:
    """One rank of the job (the ``Process`` target)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from toy_transformer import ToyConfig, build, synthetic_batch, train_step

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    records = _Records()
    logger = logging.getLogger("stepscope")
    logger.addHandler(records)
    logger.setLevel(REPORTED)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    cfg = ToyConfig(vocab=128, d_model=32, heads=2, layers=1, ff=64, seq=16, batch=4)
    model, optimizer = build(cfg)
    trained = DistributedDataParallel(model) if job.ddp else model
    data = torch.Generator().manual_seed(rank)
    walls: list[int] = []
    works: list[int] = []
    slept: dict[int, int] = {}
    started = time.perf_counter()
    with stepscope.profile(store=job.store, run=job.run, wait=job.wait, warmup=job.warmup,
                           active=job.active, watch=job.watch, trace_dir=job.trace_dir,
                           strict=job.strict, convert=job.convert,
                           flush_timeout_s=PATIENT_FLUSH_S) as prof:
        for step in range(job.steps):
            t0 = time.perf_counter_ns()
            train_step(trained, optimizer, synthetic_batch(cfg, data))
            time.sleep(job.pad_s)
            if rank == job.slow_rank and step in job.slow_at:
                s0 = time.perf_counter_ns()
                time.sleep(job.stall_s if job.stall_s is not None
                           else 4 * statistics.median(walls) / 1e9)
                slept[step] = time.perf_counter_ns() - s0
            if rank == 1 and step == job.die_at:
                time.sleep(0.5)
                os.kill(os.getpid(), signal.SIGKILL)
            works.append(time.perf_counter_ns() - t0)
            prof.step()
            walls.append(time.perf_counter_ns() - t0)
    watcher = prof.watcher
    results.put({
        "rank": rank,
        "elapsed_s": time.perf_counter() - started,
        "walls_ns": walls,
        "works_ns": works,
        "slept_ns": slept,
        "anomalies": watcher.anomalies if watcher else None,
        "captures": [(w.first_step, w.last_step, w.trigger.rank, w.trigger.step)
                     for w in (watcher.captures if watcher else [])],
        "not_captured": dict(watcher.not_captured) if watcher else None,
        "enabled": watcher.enabled if watcher else None,
        "blind_ns": watcher.blind_ns if watcher else None,
        "log": records.lines,
    })
    dist.destroy_process_group()


def run_job(job: WatchJob, timeout_s: float = PATIENT_FLUSH_S + 180.0
            ) -> tuple[dict[int, dict[str, Any]], list[int | None]]:
    """Start both ranks; return the reports of the ranks that finished and every exit code.

    A rank reports once its traces reached the store, which on a loaded machine can take minutes
    (the conversion child runs at nice 19): the default bound leaves it the patient flush."""
    import queue

    import torch.multiprocessing as mp
    from train_ddp_cpu import free_port

    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=watch_rank, args=(r, 2, port, job, results)) for r in range(2)]
    for process in ranks:
        process.start()
    reports: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    expected = 1 if job.die_at is not None else 2
    while len(reports) < expected and time.monotonic() < deadline:
        try:
            report = results.get(timeout=1.0)
        except queue.Empty:
            if all(p.exitcode is not None for p in ranks):
                break
            continue
        reports[report["rank"]] = report
    for process in ranks:
        process.join(max(1.0, deadline - time.monotonic()))
        if process.exitcode is None:
            process.kill()
            process.join()
    return reports, [p.exitcode for p in ranks]
