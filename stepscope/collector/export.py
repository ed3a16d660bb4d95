"""Write a finished profiling cycle as a gzipped Kineto JSON file.

Works on the cycle's Kineto result object, not on the ``torch.profiler.profile`` that produced
it: the profiler replaces that object when the next cycle stops (and, without ``acc_events``,
creates a fresh per-cycle profiler), so the finished result can be exported from the writer
thread while training, and profiling, go on. Imports no torch: the conversion child process
uses ``gzip_file`` too.
"""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path
from typing import Any


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


def save_plain(results: Any, path: Path) -> Path:
    """Kineto's own JSON export of ``results`` (possible once per result)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    results.save(str(path))
    return path


def gzip_file(plain: Path, target: Path) -> Path:
    """Compress ``plain`` into ``target`` atomically (temporary file, then rename); removes
    ``plain``. A full disk leaves no partial trace behind."""
    packed = target.with_name(target.name + ".tmp")
    try:
        with open(plain, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
        os.replace(packed, target)
    finally:
        packed.unlink(missing_ok=True)
        plain.unlink(missing_ok=True)
    return target
