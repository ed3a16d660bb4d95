"""Helpers for the collector tests: the examples on the import path and independent counts.

The independent side of each check is computed here from the model itself or from the raw
trace JSON, never from the store.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"

PATIENT_FLUSH_S = 900.0
"""The flush bound for tests that check what reached the store, not how fast: the conversion
child runs at nice 19, and on a loaded 2-core machine (two xdist workers, or other jobs) it can
wait minutes for the CPU, past the collector's 120 s default, after which writes are abandoned."""
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))


def gradient_ready_order(model: Any, batch: Any) -> list[Any]:
    """Parameters in the order their gradients are accumulated in one backward pass.

    DDP rebuilds its buckets after the first iteration in exactly this order, so it is the
    independent basis for the expected all-reduce sizes.
    """
    import torch

    order: list[Any] = []
    handles = [p.register_post_accumulate_grad_hook(order.append) for p in model.parameters()]
    try:
        logits = model(batch[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                          batch[:, 1:].reshape(-1)).backward()
    finally:
        for handle in handles:
            handle.remove()
    return order


def greedy_buckets(params: list[Any], cap_bytes: int) -> list[int]:
    """Element counts of buckets filled in order until each reaches ``cap_bytes`` (DDP's rule:
    a bucket closes once its size is at least the cap; the rest forms the last bucket)."""
    buckets: list[int] = []
    size = elements = 0
    for param in params:
        size += param.numel() * param.element_size()
        elements += param.numel()
        if size >= cap_bytes:
            buckets.append(elements)
            size = elements = 0
    if elements:
        buckets.append(elements)
    return buckets


def element_count(input_dims: list[Any]) -> int:
    """Elements of the first tensor (list) argument in a Kineto ``Input Dims`` value."""
    first = input_dims[0]
    shapes = first if first and isinstance(first[0], list) else [first]
    total = 0
    for shape in shapes:
        count = 1
        for dim in shape:
            count *= dim
        total += count
    return total


def agree_in_group(rank: int, world_size: int, port: int, results: Any) -> None:
    """``mp.spawn`` body: join a gloo group where every rank would name the run differently,
    and report the name ``agree_run_name(None)`` settles on."""
    import os

    import torch.distributed as dist

    from stepscope.collector import distributed

    os.environ.pop("TORCHELASTIC_RUN_ID", None)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        distributed.default_run_name = lambda: f"named-by-rank-{rank}"
        results.put((rank, distributed.agree_run_name(None), distributed.agree_run_name("given")))
    finally:
        dist.destroy_process_group()
