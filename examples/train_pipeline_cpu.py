"""Pipeline-parallel training of a small transformer on CPU ranks (gloo) under ``stepscope.profile``.

    torchrun --standalone --nproc-per-node 3 examples/train_pipeline_cpu.py --store runs/ \
        --run-name pp-1f1b --schedule 1f1b --microbatches 4
    python examples/train_pipeline_cpu.py --store runs/ --ranks 2 --schedule gpipe
    stepscope summary --store runs/ --run pp-1f1b

The model (an embedding, one pre-norm encoder layer with a causal mask per stage, an LM head) is
split into stages with ``torch.distributed.pipelining`` (``PipelineStage`` and ``ScheduleGPipe``,
``Schedule1F1B``, or ``ScheduleInterleaved1F1B`` with two stages per rank): the first stage
holds the embedding, the last the head and the loss. Activations go forward and gradients
backward over gloo send/recv, one transfer per microbatch and neighbour. After the schedule,
every rank clips its gradients by the whole model's norm (one all-reduce over the stages, as
Megatron-LM does): the step's one meeting point, where stages that finished early wait.

``--slow-stage S`` gives stage S an extra product per layer through a hidden layer
``--slow-factor`` times the model width, so the other stages wait for it: the case the
``pipeline.bubble`` finding must name. That compute also takes CPU from the other ranks when
there are more ranks than cores (three on two), slowing their own work and their gloo
transfers; ``--slow-kind sleep`` instead sleeps ``--slow-ms`` per layer in the stage's forward
and twice that in its backward, delaying its neighbours without taking their CPU, as a GPU
stage on its own device would. ``--device-ms M`` makes every stage sleep ``M`` per layer in its
forward and twice that in its backward (the sleep kind's slow stage ``M + --slow-ms``): a GPU
stage's device time, during which its host takes no CPU. ``benchmarks/bench_whatif.py``
validates ``on time`` with a sleeping stage 1 against the balanced run, both with
``--device-ms``: the two runs' stages then compute the same and all sleep between their
computations (on 2 shared cores, a stage that never sleeps computes at another speed than one
woken from a sleep: the sleeping stage's own compute took 60% longer than the balanced run's).
With ``--alternate`` the slow stage is slow in odd steps only: both runs in one recording, their
steps interleaved, so that both see the same machine.
Started plainly, the script spawns the ranks itself
(``mp.spawn``); under ``torchrun`` each process is one rank. One thread per rank: it runs on two
cores. ``sample_traces/pp-*`` were recorded with it (sample_traces/README.md).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

import stepscope
from gloo_ranks import free_port, join_gloo

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved1f1b": ScheduleInterleaved1F1B}
"""``--schedule`` name -> torch's schedule class."""
MULTI_STAGE = frozenset({"interleaved1f1b"})
"""Schedules that give each rank two stages (rank r holds stages r and r + ranks)."""


@dataclass(frozen=True)
class PipelineRun:
    """Everything a rank needs to know (picklable, for ``mp.spawn``)."""

    store: str
    run: str
    schedule: str = "1f1b"
    microbatches: int = 4
    steps: int = 8
    wait: int = 4
    warmup: int = 2
    active: int = 1
    d_model: int = 64
    heads: int = 4
    ff: int = 128
    seq: int = 32
    vocab: int = 256
    batch: int = 16
    layers_per_stage: int = 1
    max_grad_norm: float = 1.0
    slow_stage: int | None = None
    slow_factor: int = 64
    slow_kind: str = "compute"
    slow_ms: float = 6.0
    device_ms: float = 0.0
    """Every stage's sleep per layer in its forward (twice in its backward): a GPU stage's device
    time (0: none)."""
    alternate: bool = False
    """The slow stage is slow in odd steps only (even steps: balanced): both runs in one recording."""
    trace_dir: str | None = None


class SlowDown(nn.Module):
    """An extra matrix product through a ``factor`` times wider hidden layer whose result is added
    times zero: the stage's output is unchanged, only its forward (and backward) take longer; none
    of it while not ``slowed`` (:func:`set_slowed`)."""

    def __init__(self, d_model: int, factor: int) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, d_model * factor)
        self.down = nn.Linear(d_model * factor, d_model)
        self.slowed = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.0 * self.down(torch.tanh(self.up(x))) if self.slowed else x


class _Sleep(torch.autograd.Function):
    """The identity, sleeping ``seconds`` in its forward and twice that in its backward (a
    layer's backward costs about two of its forwards)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(2 * ctx.seconds)
        return grad, None


class SleepDown(nn.Module):
    """Time that takes no CPU (a GPU's): sleeps ``ms`` in the forward, ``2 * ms`` in the backward,
    ``slow_ms`` more (twice in the backward) while ``slowed`` (:func:`set_slowed`)."""

    def __init__(self, ms: float, slow_ms: float = 0.0) -> None:
        super().__init__()
        self.seconds, self.slow_seconds = ms / 1000, slow_ms / 1000
        self.slowed = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Sleep.apply(x, self.seconds + (self.slow_seconds if self.slowed else 0.0))


SLOW_KINDS = ("compute", "sleep")
"""``--slow-kind`` choices (:func:`after_layer`)."""


def after_layer(cfg: PipelineRun, index: int) -> nn.Module | None:
    """What stage ``index`` runs after each layer: its device time (``--device-ms``) as one
    :class:`SleepDown`, the sleep kind's slow stage sleeping ``--slow-ms`` longer in the same one
    (so it wakes as often as the other stages); the compute kind's slow stage also a
    :class:`SlowDown`. None when nothing."""
    slow = cfg.slow_stage == index
    slow_ms = cfg.slow_ms if slow and cfg.slow_kind == "sleep" else 0.0
    chain: list[nn.Module] = [SleepDown(cfg.device_ms, slow_ms)] if cfg.device_ms + slow_ms > 0 else []
    if slow and cfg.slow_kind == "compute":
        chain.append(SlowDown(cfg.d_model, cfg.slow_factor))
    return nn.Sequential(*chain) if chain else None


def set_slowed(module: nn.Module, on: bool) -> None:
    """Whether the slow stage's extra work runs in the next step (``--alternate``: odd steps only)."""
    for m in module.modules():
        if isinstance(m, (SleepDown, SlowDown)):
            m.slowed = on


class Stage(nn.Module):
    """One pipeline stage: the embedding on the first, encoder layers, the norm and head on the last."""

    def __init__(self, cfg: PipelineRun, index: int, count: int) -> None:
        super().__init__()
        self.first, self.last = index == 0, index == count - 1
        if self.first:
            self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
            self.pos = nn.Parameter(torch.zeros(cfg.seq, cfg.d_model))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(cfg.d_model, cfg.heads, cfg.ff, dropout=0.0, batch_first=True,
                                       norm_first=True)
            for _ in range(cfg.layers_per_stage)
        )
        self.after = after_layer(cfg, index)
        if self.last:
            self.norm = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, cfg.vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(cfg.seq), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.embed(x) + self.pos[: x.shape[1]]
        for block in self.blocks:
            x = block(x, src_mask=self.mask, is_causal=True)
            if self.after is not None:
                x = self.after(x)
        return self.head(self.norm(x)) if self.last else x


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def clip_grad_norm_across_stages(module: nn.Module, max_norm: float) -> float:
    """Clip by the norm of the whole model's gradient, which every stage holds a part of: one
    all-reduce over the stages per step (as Megatron-LM does). It is also the step's one point
    where all stages meet, so the stages that finish early wait there (the pipeline's drain)."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    squares = torch.stack([g.pow(2).sum() for g in grads]).sum()
    dist.all_reduce(squares)
    norm = float(squares.sqrt())
    scale = min(1.0, max_norm / (norm + 1e-6))
    for g in grads:
        g.mul_(scale)
    return norm


def train_rank(rank: int, world_size: int, port: int | None, cfg: PipelineRun) -> None:
    """One rank: join the gloo group, build its stage(s) and the schedule, train profiled.

    ``port`` None: the launcher (torchrun) has set MASTER_ADDR/MASTER_PORT already (:func:`gloo_ranks.join_gloo`).
    """
    join_gloo(rank, world_size, port)
    try:
        per_rank = 2 if cfg.schedule in MULTI_STAGE else 1
        count = per_rank * world_size
        indices = [rank + k * world_size for k in range(per_rank)]  # rank r: stages r, r + ranks, ...
        torch.manual_seed(rank)
        module = nn.ModuleList(Stage(cfg, i, count) for i in indices)
        stages = [PipelineStage(m, i, count, torch.device("cpu")) for m, i in zip(module, indices)]
        chosen = SCHEDULES[cfg.schedule]
        schedule = chosen(stages if per_rank > 1 else stages[0], cfg.microbatches, loss_fn=lm_loss)
        first, last = 0 in indices, count - 1 in indices
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
        data = torch.Generator().manual_seed(7)  # the same batches on every rank
        with stepscope.profile(store=cfg.store, run=cfg.run, wait=cfg.wait, warmup=cfg.warmup,
                               active=cfg.active, repeat=1, model=module, optimizer=optimizer,
                               trace_dir=cfg.trace_dir,
                               tags={"example": "train_pipeline_cpu", "schedule": cfg.schedule,
                                     "microbatches": str(cfg.microbatches),
                                     "slow_stage": "" if cfg.slow_stage is None else str(cfg.slow_stage),
                                     "slow_kind": "" if cfg.slow_stage is None else cfg.slow_kind}) as prof:
            for index in range(cfg.steps):
                set_slowed(module, not cfg.alternate or index % 2 == 1)
                tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=data)
                inputs, targets = tokens[:, :-1], tokens[:, 1:]
                optimizer.zero_grad(set_to_none=True)
                if first:
                    schedule.step(inputs)
                elif last:
                    schedule.step(target=targets)
                else:
                    schedule.step()
                clip_grad_norm_across_stages(module, cfg.max_grad_norm)
                optimizer.step()
                prof.step(tokens=targets.numel(), samples=cfg.batch)
    finally:
        dist.destroy_process_group()


def train(cfg: PipelineRun, world_size: int) -> None:
    """Start ``world_size`` ranks (stages) with ``mp.spawn`` and wait for them."""
    mp.spawn(train_rank, args=(world_size, free_port(), cfg), nprocs=world_size, join=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="runs")
    # Not ``--run``: torchrun's own parser would take it for an abbreviation of ``--run-path``.
    parser.add_argument("--run-name", default="pp-1f1b")
    parser.add_argument("--ranks", type=int, default=2, help="stages, when not started by torchrun")
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--wait", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--active", type=int, default=1)
    parser.add_argument("--slow-stage", type=int, default=None,
                        help="give this stage (index among all stages) extra products")
    parser.add_argument("--slow-factor", type=int, default=64,
                        help="width of the extra product, in multiples of the model width")
    parser.add_argument("--slow-kind", choices=SLOW_KINDS, default="compute",
                        help="compute: the extra product (takes CPU from the other ranks on a shared host); "
                             "sleep: --slow-ms per layer in the forward, twice in the backward (takes none)")
    parser.add_argument("--slow-ms", type=float, default=6.0, help="the sleep kind's forward sleep per layer")
    parser.add_argument("--device-ms", type=float, default=0.0,
                        help="every stage sleeps this per layer in its forward, twice in its backward (a GPU's time)")
    parser.add_argument("--alternate", action="store_true",
                        help="the slow stage is slow in odd steps only, balanced in even ones")
    parser.add_argument("--trace-dir", default=None, help="also keep the exported Kineto JSON here")
    args = parser.parse_args()
    cfg = PipelineRun(store=args.store, run=args.run_name, schedule=args.schedule,
                      microbatches=args.microbatches, steps=args.steps, wait=args.wait,
                      warmup=args.warmup, active=args.active, slow_stage=args.slow_stage,
                      slow_factor=args.slow_factor, slow_kind=args.slow_kind, slow_ms=args.slow_ms,
                      device_ms=args.device_ms, alternate=args.alternate, trace_dir=args.trace_dir)
    if cfg.batch % cfg.microbatches:
        parser.error(f"--microbatches must divide the batch ({cfg.batch})")
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun: this process is one rank
        train_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, cfg)
        return
    train(cfg, args.ranks)
    print(f"run {args.run_name!r} ({args.ranks} stages, {args.schedule}) is in {Path(args.store)}")


if __name__ == "__main__":
    main()
