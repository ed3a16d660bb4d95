"""What the run was: versions, hardware, host, command line, code version, user tags.

Recorded once per rank into ``sources.metadata`` so that two runs can later be compared knowing
what differed between them (a new torch, another GPU, a dirty working tree).
"""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from stepscope.collector.distributed import RankInfo

GIT_TIMEOUT_S = 2.0


def run_metadata(info: RankInfo) -> dict[str, Any]:
    """Metadata of this process; every value is JSON-serialisable, missing ones are None."""
    cuda = torch.cuda.is_available()
    return {
        "collector": "stepscope",
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "nccl_version": _nccl_version() if cuda else None,
        "python_version": platform.python_version(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "command_line": list(sys.argv),
        "cwd": str(Path.cwd()),
        "git_commit": git_commit(Path.cwd()),
        "gpu_model": torch.cuda.get_device_name() if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "torch_threads": torch.get_num_threads(),  # intra-op threads: the compare gate checks them
        "rank": info.rank,
        "world_size": info.world_size,
        "backend": info.backend,
    }


def git_commit(directory: Path) -> str | None:
    """The commit checked out in ``directory`` (``+dirty`` when it has local changes), or None.

    Runs git with a short timeout: a missing git or a slow network filesystem must not delay the
    job by more than that.
    """
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True,
                              text=True, timeout=GIT_TIMEOUT_S, check=False)
        if head.returncode != 0:
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=directory, capture_output=True, text=True,
                                timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = head.stdout.strip()
    return f"{commit}+dirty" if status.returncode == 0 and status.stdout.strip() else commit


def _nccl_version() -> str | None:
    """NCCL's version as "major.minor.patch", or None when this torch has no NCCL."""
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    return str(version)
