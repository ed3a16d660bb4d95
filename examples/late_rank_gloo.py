"""Three CPU ranks (gloo) where one rank sleeps before its all-reduce in every step.

    python examples/late_rank_gloo.py --store runs/ --run-name late --late-rank 2 --sleep-ms 30
    python examples/late_rank_gloo.py --store runs/ --run-name even --sleep-ms 0
    stepscope summary --store runs/ --run late

A known cause for the cross-rank diagnosis: every step, each rank computes a little (a few
matrix products), then all ranks all-reduce a tensor; ``--late-rank`` first sleeps
``--sleep-ms`` milliseconds, so the others wait about that long inside the all-reduce. With
``--sleep-ms 0`` the ranks stay together. ``sample_traces/gloo-3ranks-late`` and
``gloo-3ranks-even`` were recorded with this script.

``--ranks 2 --late-rank 1 --device-ms 10`` is what benchmarks/bench_whatif.py records for its
what-if pair: no more ranks than the machine's two cores, and every rank off the CPU for 10 ms a
step, as a GPU rank's host waiting for its device is, so that the even run's ranks do not queue
for cores that the late run's sleeping rank left free. With ``--alternate`` one recording holds
both runs: the late rank sleeps, and the ``--comm-mb`` buffer is twice as large, in odd steps
only, so the two configurations' steps interleave and see the same machine (the bench compares
odd steps with even ones).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import stepscope
from gloo_ranks import free_port


@dataclass(frozen=True)
class LateRun:
    """Everything a rank needs (picklable, for ``mp.spawn``)."""

    store: str
    run: str
    late_rank: int = 2
    sleep_ms: float = 30.0
    steps: int = 6
    trace_dir: str | None = None
    comm_mb: float = 0.0
    """Megabytes of an extra buffer every rank all-reduces after the step's all-reduce (0: none):
    a run whose step is mostly communication, to check ``comm_volume*2`` against a run with twice
    the megabytes (benchmarks/bench_whatif.py)."""
    device_ms: float = 0.0
    """Milliseconds every rank sleeps each step before its compute (0: none): the time a GPU rank's
    host spends waiting for its device, which takes no CPU. With it the ranks are off the CPU most
    of the step, as a GPU job's hosts are, so three ranks on a 2-core machine do not take each
    other's cores the way three always-busy ranks do (benchmarks/bench_whatif.py)."""
    alternate: bool = False
    """The late rank sleeps, and the extra buffer is twice ``comm_mb``, in odd steps only (even
    steps: no sleep, ``comm_mb``): both configurations in one recording."""

    def changed(self, index: int) -> bool:
        """Whether step ``index`` (0-based, as the profiler numbers it) is a changed one: every
        step, or the odd ones with :attr:`alternate`."""
        return not self.alternate or index % 2 == 1


def step(weights: torch.Tensor, data: torch.Tensor, rank: int, cfg: LateRun, extra: torch.Tensor | None,
         changed: bool) -> None:
    """The device's time (``--device-ms``), a little compute, the late rank's sleep (in a
    ``changed`` step), then the all-reduce everyone waits in (and the extra buffer's, when
    ``--comm-mb`` asks for one: with ``--alternate``, its first half in an unchanged step)."""
    if cfg.device_ms > 0:
        time.sleep(cfg.device_ms / 1000)
    out = data
    for _ in range(4):
        out = torch.tanh(out @ weights)
    if rank == cfg.late_rank and cfg.sleep_ms > 0 and changed:
        time.sleep(cfg.sleep_ms / 1000)
    dist.all_reduce(out)
    if extra is not None:
        dist.all_reduce(extra if changed or not cfg.alternate else extra[: extra.numel() // 2])


def train_rank(rank: int, world_size: int, port: int, cfg: LateRun) -> None:
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        gen = torch.Generator().manual_seed(rank)
        weights = torch.randn(128, 128, generator=gen) / 12
        data = torch.randn(64, 128, generator=gen)
        floats = int(cfg.comm_mb * 2**20) // 4 * (2 if cfg.alternate else 1)
        extra = torch.ones(floats) if cfg.comm_mb > 0 else None
        with stepscope.profile(store=cfg.store, run=cfg.run, wait=1, warmup=1, active=cfg.steps - 2, repeat=1,
                               trace_dir=cfg.trace_dir, strict=True, record_shapes=True, profile_memory=False,
                               tags={"example": "late_rank_gloo"}) as prof:
            for index in range(cfg.steps):
                step(weights, data, rank, cfg, extra, cfg.changed(index))
                prof.step()
    finally:
        dist.destroy_process_group()


def train(cfg: LateRun, world_size: int = 3) -> None:
    mp.spawn(train_rank, args=(world_size, free_port(), cfg), nprocs=world_size, join=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="runs")
    parser.add_argument("--run-name", default="late")
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--late-rank", type=int, default=2)
    parser.add_argument("--sleep-ms", type=float, default=30.0)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--trace-dir", default=None, help="also keep the exported Kineto JSON here")
    parser.add_argument("--comm-mb", type=float, default=0.0,
                        help="also all-reduce a buffer of this many megabytes every step")
    parser.add_argument("--device-ms", type=float, default=0.0,
                        help="every rank first sleeps this long each step (a GPU's time: no CPU taken)")
    parser.add_argument("--alternate", action="store_true",
                        help="the late rank sleeps, and the --comm-mb buffer is twice as large, in odd steps only")
    args = parser.parse_args()
    cfg = LateRun(store=args.store, run=args.run_name, late_rank=args.late_rank, sleep_ms=args.sleep_ms,
                  steps=args.steps, trace_dir=args.trace_dir, comm_mb=args.comm_mb,
                  device_ms=args.device_ms, alternate=args.alternate)
    train(cfg, args.ranks)
    print(f"run {args.run_name!r} ({args.ranks} ranks) is in {Path(args.store)}")


if __name__ == "__main__":
    main()
