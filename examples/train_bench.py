"""A CPU training benchmark for the CI gate (docs/ci.md): a few steps of a small MLP under
``stepscope.profile``, stored as one run.

    OMP_NUM_THREADS=1 python examples/train_bench.py --steps 20 --stepscope-store perf-store --stepscope-run run-abc123
    stepscope compare main run-abc123 --store perf-store

CPU timings on a shared CI machine swing with the thread pool, so the script pins torch to one
thread (``torch.set_num_threads(1)``); pin OpenMP too with ``OMP_NUM_THREADS=1``. Every step is
timed (``step_times``), the last ``--steps - --warmup`` are profiled. Replace the model and the
step with your own; keep the loop's shape.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch
from torch import nn

import stepscope

WIDTH = 128
"""Hidden size of the MLP: the number a pull request changes in docs/ci.md's workflow test."""
DEPTH = 2
BATCH = 32


def build_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train(store: Path, run: str, steps: int, warmup: int) -> float:
    """``steps`` training steps (the first ``warmup`` not profiled); returns the last loss."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, optimizer = build_model()
    data = torch.randn(BATCH, WIDTH)
    target = torch.randn(BATCH, 1)
    loss = torch.zeros(())
    # convert="thread": the one trace is ready only after the last step, so converting it on the
    # writer thread delays no timed step, and spares a child process per run.
    with stepscope.profile(store=store, run=run, wait=0, warmup=warmup, active=steps - warmup,
                           model=model, optimizer=optimizer, tags={"example": "train_bench"},
                           convert="thread") as prof:
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(data), target)
            loss.backward()
            optimizer.step()
            prof.step(samples=BATCH)
    return float(loss.detach())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="of which not profiled (default 2)")
    parser.add_argument("--stepscope-store", type=Path, default=Path("perf-store"), help="store folder")
    parser.add_argument("--stepscope-run", default="train-bench", help="run name")
    args = parser.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        parser.error("--warmup must be at least 0 and below --steps")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    loss = train(args.stepscope_store, args.stepscope_run, args.steps, args.warmup)
    logging.info("trained %d steps, last loss %.4f; run %r is in %s", args.steps, loss, args.stepscope_run,
                 args.stepscope_store)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
