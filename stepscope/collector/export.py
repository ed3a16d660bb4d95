"""Write a finished profiling cycle as a gzipped Kineto JSON file.

Works on the cycle's Kineto result object, not on the ``torch.profiler.profile`` that produced
it: the profiler replaces that object when the next cycle stops (and, without ``acc_events``,
creates a fresh per-cycle profiler), so the finished result can be exported from the writer
thread while training, and profiling, go on. Imports no torch: the conversion child process
uses ``gzip_file`` too.
"""

from __future__ import annotations

import errno
import gzip
import os
import shutil
from pathlib import Path
from typing import Any

from stepscope.store.atomic import atomic_write


def finished_cycle(prof: Any) -> Any:
    """The Kineto result of the cycle a ``torch.profiler.profile`` just finished.

    Taken at ``on_trace_ready`` time, on the training thread; cheap (an attribute read).
    """
    inner = getattr(prof, "profiler", None)
    results = getattr(inner, "kineto_results", None)
    if results is None:
        raise RuntimeError("the profiler holds no finished trace (was on_trace_ready called "
                           "outside a profiling cycle?)")
    return results


MIN_FREE_BYTES = 1 << 20
"""Less free space than this where an export came out incomplete means the disk is full."""


def save_plain(results: Any, path: Path) -> Path:
    """Kineto's own JSON export of ``results`` (possible once per result).

    Kineto reports no write error: on a full disk it leaves no file or a cut one. So the export
    is checked (present, ending in ``}``), and an incomplete one raises what the disk says,
    ENOSPC when it is full, rather than a later "no such file" or "not valid JSON".
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    results.save(str(path))
    if not _complete(path):
        path.unlink(missing_ok=True)
        if shutil.disk_usage(path.parent).free < MIN_FREE_BYTES:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        raise RuntimeError("Kineto's trace export came out missing or incomplete")
    return path


def _complete(path: Path) -> bool:
    """Whether ``path`` holds a whole JSON object: it ends, after whitespace, in ``}``."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - 256))
            return handle.read().rstrip().endswith(b"}")
    except OSError:
        return False


def gzip_file(plain: Path, target: Path) -> Path:
    """Compress ``plain`` into ``target`` atomically (temporary file, then rename); removes
    ``plain``. A full disk leaves no partial trace behind."""
    try:
        with open(plain, "rb") as src, atomic_write(target) as raw, \
                gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
    finally:
        plain.unlink(missing_ok=True)
    return target
