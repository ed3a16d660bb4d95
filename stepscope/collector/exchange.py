"""The watch's exchange: one tiny all-gather of int64 rows, on a side gloo group, with a deadline.

Why a side group and not the job's: under NCCL the default group only takes CUDA tensors, and
its collectives are ordered with the training's on the same communicator, so a watch collective
there would interleave with (and could delay or deadlock against) gradient all-reduces. A gloo
group of its own runs on the CPU, over its own connections, and its deadline (``timeout_s``)
applies to the watch alone: when a rank dies, its connections close and the others' all-gather
fails at once; when a rank hangs, the others give up after ``timeout_s``. Either way the caller
turns the watch off and training goes on.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist


class Exchange(Protocol):
    """All-gather of one fixed-length row of ints per rank, in rank order."""

    rank: int
    world_size: int

    def all_gather(self, row: list[int]) -> list[list[int]]: ...

    def close(self) -> None: ...


class SoloExchange:
    """A process alone (no process group, or a world of one): its own row is the whole world."""

    world_size = 1

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def all_gather(self, row: list[int]) -> list[list[int]]:
        return [row]

    def close(self) -> None:
        return None


class GlooExchange:
    """All-gather over a gloo group of every rank, created for the watch (a collective call:
    every rank must construct it at the same point, as ``stepscope.profile`` does on entry)."""

    def __init__(self, row_length: int, timeout_s: float) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._timeout = timedelta(seconds=timeout_s)
        self._group: dist.ProcessGroup | None = dist.new_group(backend="gloo",
                                                                timeout=self._timeout)
        self._row_length = row_length

    def all_gather(self, row: list[int]) -> list[list[int]]:
        """The rows of every rank; raises when a rank failed or missed the deadline."""
        mine = torch.tensor(row, dtype=torch.int64)
        gathered = [torch.empty(self._row_length, dtype=torch.int64) for _ in range(self.world_size)]
        work = dist.all_gather(gathered, mine, group=self._group, async_op=True)
        work.wait(timeout=self._timeout)
        return [t.tolist() for t in gathered]

    def close(self) -> None:
        """Release the group (local; a rank still waiting on it gets an error, not a hang)."""
        group, self._group = self._group, None
        if group is not None and dist.is_initialized():
            dist.destroy_process_group(group)


def open_exchange(row_length: int, timeout_s: float, rank: int) -> Exchange:
    """A gloo side group when torch.distributed runs more than one rank, else a solo exchange."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return GlooExchange(row_length, timeout_s)
    return SoloExchange(rank)
