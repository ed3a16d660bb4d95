"""Train a small transformer with DDP on 2 CPU ranks (gloo) under ``stepscope.profile``.

    python examples/train_ddp_cpu.py --store runs/ --run-name ddp-gloo-2ranks
    torchrun --standalone --nproc-per-node 2 examples/train_ddp_cpu.py --store runs/
    stepscope runs --store runs/

Every rank writes its own partition of the same run. Started plainly, the script spawns the
ranks with ``mp.spawn``; under ``torchrun`` each process is one rank, from the environment.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import stepscope
from gloo_ranks import free_port, join_gloo
from toy_transformer import ToyConfig, build, synthetic_batch, train_step


@dataclass(frozen=True)
class DDPRun:
    """Everything a rank needs to know (picklable, for ``mp.spawn``)."""

    store: str
    run: str
    steps: int = 12
    wait: int = 5
    warmup: int = 2
    active: int = 2
    bucket_cap_mb: float = 0.5
    """Small buckets, so that the small model's gradients travel in several all-reduces."""
    trace_dir: str | None = None
    strict: bool = False
    convert: str = "process"


def train_rank(rank: int, world_size: int, port: int | None, cfg: DDPRun) -> None:
    """One rank: join the gloo group, wrap the model in DDP, train under stepscope.profile.

    ``port`` None: the launcher (torchrun) has set MASTER_ADDR/MASTER_PORT already (:func:`gloo_ranks.join_gloo`).
    """
    join_gloo(rank, world_size, port)
    try:
        model_cfg = ToyConfig()
        model, optimizer = build(model_cfg)
        ddp = DistributedDataParallel(model, bucket_cap_mb=cfg.bucket_cap_mb)
        data = torch.Generator().manual_seed(100 + rank)
        with stepscope.profile(store=cfg.store, run=cfg.run, wait=cfg.wait, warmup=cfg.warmup,
                               active=cfg.active, repeat=1, model=ddp, optimizer=optimizer,
                               trace_dir=cfg.trace_dir, strict=cfg.strict, convert=cfg.convert,
                               tags={"example": "train_ddp_cpu"}) as prof:
            for _ in range(cfg.steps):
                batch = synthetic_batch(model_cfg, data)
                train_step(ddp, optimizer, batch)
                prof.step(tokens=batch[:, 1:].numel(), samples=batch.shape[0])
    finally:
        dist.destroy_process_group()


def train(cfg: DDPRun, world_size: int = 2) -> None:
    """Start ``world_size`` ranks with ``mp.spawn`` and wait for them."""
    mp.spawn(train_rank, args=(world_size, free_port(), cfg), nprocs=world_size, join=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="runs")
    # Not ``--run``: torchrun's own parser would take it for an abbreviation of ``--run-path``.
    parser.add_argument("--run-name", default="ddp-gloo-2ranks")
    parser.add_argument("--ranks", type=int, default=2)
    for name, value in asdict(DDPRun(store="", run="")).items():
        if isinstance(value, int) and not isinstance(value, bool):
            parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--trace-dir", default=None, help="also keep the exported Kineto JSON here")
    args = parser.parse_args()
    cfg = DDPRun(store=args.store, run=args.run_name, steps=args.steps, wait=args.wait,
                 warmup=args.warmup, active=args.active, trace_dir=args.trace_dir)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun: this process is one rank
        train_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, cfg)
        return
    train(cfg, args.ranks)
    print(f"run {args.run_name!r} ({args.ranks} ranks) is in {Path(args.store)}")


if __name__ == "__main__":
    main()
