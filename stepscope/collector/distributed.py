"""Who this process is in a distributed job, and the run name every rank agrees on.

Every rank writes its own partition of one run, so all ranks must use the same run name with no
coordination beyond what the job already has: the name the user gave, the launcher's
environment (``TORCHELASTIC_RUN_ID`` from torchrun, ``RANK``/``WORLD_SIZE``), or the process
group (rank 0's generated name broadcast over it, one small collective when profiling starts).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job. ``rank_from`` says where it came from (for ``sources``)."""

    rank: int
    world_size: int
    backend: str | None
    rank_from: str


def rank_info() -> RankInfo:
    """Rank and world size from the process group when there is one, else from the launcher."""
    if dist.is_available() and dist.is_initialized():
        return RankInfo(dist.get_rank(), dist.get_world_size(), str(dist.get_backend()), "collector")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return RankInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, "collector")
    return RankInfo(0, 1, None, "collector")


def default_run_name() -> str:
    """A name for a run the user did not name: the script's name and the start time (UTC).

    Under torchrun with an explicit rendezvous id, the id is used instead, so that ranks that
    start profiling at slightly different seconds still agree without a process group.
    """
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "python"
    if elastic and elastic != "none":
        return f"{script}-{elastic}"
    return f"{script}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"


def agree_run_name(name: str | None) -> str:
    """The run name all ranks use, with as little coordination as possible.

    A given ``name`` is used as is: every rank was handed the same one, so nothing needs to be
    exchanged (and no collective can hang on a misconfigured device). Without a name, torchrun's
    ``TORCHELASTIC_RUN_ID`` names the run when there is one; otherwise rank 0's generated name is
    broadcast over the default process group, which every rank must then reach at the same point,
    like any collective.
    """
    if name is not None:
        return name
    local = default_run_name()
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none":
        return local
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local
    box: list[object] = [local]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])
