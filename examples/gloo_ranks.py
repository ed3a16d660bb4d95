"""The rank side of the examples' CPU multi-process runs: a free port for ``mp.spawn`` and joining
the gloo group (one thread per rank: the recordings are made on a 2-core machine)."""

from __future__ import annotations

import logging
import os
import socket

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def join_gloo(rank: int, world_size: int, port: int | None) -> None:
    """Join the gloo process group as ``rank``. ``port`` None: the launcher (torchrun) has set
    MASTER_ADDR/MASTER_PORT already."""
    torch.set_num_threads(1)
    if port is not None:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
    logging.basicConfig(level=logging.INFO, format=f"rank {rank} %(levelname)s %(name)s: %(message)s")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
