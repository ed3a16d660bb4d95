"""Train a small transformer on one CPU process under ``stepscope.profile``.

    python examples/train_cpu.py --store runs/ --run cpu-transformer
    stepscope runs --store runs/

``--trace-dir`` also keeps the exported Kineto JSON (this is how ``sample_traces/`` is made).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

import stepscope
from toy_transformer import ToyConfig, build, synthetic_batch, train_step


def train(store: Path, run: str, steps: int, wait: int, warmup: int, active: int,
          trace_dir: Path | None = None, with_stack: bool = False) -> list[float]:
    """Run ``steps`` training steps, profiling per the schedule; returns the losses."""
    torch.set_num_threads(1)
    cfg = ToyConfig()
    model, optimizer = build(cfg)
    data = torch.Generator().manual_seed(1)
    losses = []
    with stepscope.profile(store=store, run=run, wait=wait, warmup=warmup, active=active,
                           repeat=1, model=model, optimizer=optimizer, with_stack=with_stack,
                           trace_dir=trace_dir, tags={"example": "train_cpu"}) as prof:
        for _ in range(steps):
            batch = synthetic_batch(cfg, data)
            losses.append(train_step(model, optimizer, batch))
            prof.step(tokens=batch[:, 1:].numel(), samples=batch.shape[0])
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=Path("runs"))
    parser.add_argument("--run", default="cpu-transformer")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--wait", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--active", type=int, default=2)
    parser.add_argument("--trace-dir", type=Path, default=None,
                        help="also keep the exported Kineto JSON files here")
    parser.add_argument("--with-stack", action="store_true", help="record Python stacks")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    losses = train(args.store, args.run, args.steps, args.wait, args.warmup, args.active,
                   args.trace_dir, args.with_stack)
    logging.info("trained %d steps, last loss %.3f; run %r is in %s", len(losses), losses[-1],
                 args.run, args.store)


if __name__ == "__main__":
    main()
