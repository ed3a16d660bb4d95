"""Measure one thing in a fresh process: wall time, time of the work alone, and peak RSS.

Shared by the scripts in benchmarks/ (ingest, analysis, dashboard). Each measured thing runs in
its own child process so that its peak RSS is its own: the parent reads it from ``os.wait4``'s
resource usage for that one child (which also covers the child's own waited-for children, such
as a multiprocessing pool), never from RUSAGE_CHILDREN, which keeps the maximum of every child
seen so far. Keep the measuring process itself small: on Linux, exec keeps the larger of the
old and the new image's high-water mark, so a child started by a big parent reports at least the
parent's peak; ``run_process`` warns when a child's peak is not above the parent's.

Two timings come out of one child:

- ``wall_s``: the whole process, from spawn to exit, interpreter start and imports included
  (what a user of a CLI waits for);
- ``work_s``: for Python snippets, the time the child measured around the work alone, after
  its imports (``run_snippet``'s ``setup`` runs first and is not counted).

Each comes with its CPU time (user + system; ``cpu_s`` for the whole process from ``wait4``,
``work_cpu_s`` from the child's ``process_time``): on a shared machine wall times swing with
other people's load, CPU times much less, so benchmarks print both.

Usage from a benchmark script (benchmarks/ is on sys.path when the script runs)::

    from _measure import run_snippet, run_process, median_measurement
    m = run_snippet("import orjson", "orjson.loads(open(p, 'rb').read())", label="orjson")
    print(m.work_s, m.wall_s, m.peak_rss_mb)
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The repository root: benchmarks/ sits directly under it."""

# The child program run by run_snippet. Code travels as argv (no templating, no quoting issues);
# the result travels through a file so that whatever the measured code prints is left alone.
_CHILD = r"""
import json, resource, sys, time
_setup, _work, _out = sys.argv[1:4]
_ns = {"__name__": "__measured__"}
exec(compile(_setup, "<setup>", "exec"), _ns)
_setup_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
_c0, _t0 = time.process_time(), time.perf_counter()
exec(compile(_work, "<work>", "exec"), _ns)
_work_s, _work_cpu_s = time.perf_counter() - _t0, time.process_time() - _c0
with open(_out, "w") as _f:
    json.dump({"work_s": _work_s, "work_cpu_s": _work_cpu_s, "setup_rss_kib": _setup_rss,
               "result": _ns.get("RESULT")}, _f)
"""


class MeasureError(RuntimeError):
    """A measured process failed or ran past its time limit; the message says which and why."""


@dataclass(frozen=True)
class Measurement:
    """What one measured process cost. ``work_s`` is None for whole commands (no snippet)."""

    label: str
    wall_s: float
    peak_rss_bytes: int
    cpu_s: float | None = None
    work_s: float | None = None
    work_cpu_s: float | None = None
    setup_rss_bytes: int | None = None
    result: object = None

    @property
    def peak_rss_mb(self) -> float:
        """Peak RSS in MB (10^6 bytes), as the benchmarks print it."""
        return self.peak_rss_bytes / 1e6


def run_process(
    argv: Sequence[str],
    *,
    label: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout_s: float = 600.0,
) -> Measurement:
    """Run ``argv`` to completion and return its wall time and its own peak RSS.

    stdout/stderr go to temporary files (a pipe nobody reads could stall the child and inflate
    its time). A non-zero exit or a timeout raises MeasureError with the tail of stderr.
    """
    label = label or " ".join(argv)
    parent_peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=cwd)
        killed = threading.Event()
        timer = threading.Timer(timeout_s, lambda: (killed.set(), proc.kill()))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall_s = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # already reaped: tell Popen
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read()[-2000:].decode(errors="replace")
            why = f"killed after {timeout_s:g} s" if killed.is_set() else "failed"
            raise MeasureError(f"{label}: {why} (exit {proc.returncode})\n{tail}")
    if usage.ru_maxrss <= parent_peak_kib:
        warnings.warn(f"{label}: peak RSS {usage.ru_maxrss / 1024:.0f} MiB is not above the "
                      f"measuring process's own peak ({parent_peak_kib / 1024:.0f} MiB) and may be "
                      "inherited from it; keep the measuring process small", stacklevel=2)
    # Linux reports ru_maxrss in KiB.
    return Measurement(label=label, wall_s=wall_s, peak_rss_bytes=usage.ru_maxrss * 1024,
                       cpu_s=usage.ru_utime + usage.ru_stime)


def run_snippet(
    setup: str,
    work: str,
    *,
    label: str,
    python: str | os.PathLike[str] = sys.executable,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout_s: float = 600.0,
) -> Measurement:
    """Run ``setup`` then ``work`` (Python source) in a fresh ``python`` and time ``work`` alone.

    ``setup`` holds the imports and anything that should not count; ``work`` is the measured
    part. Both share one namespace; ``work`` may set ``RESULT`` to a JSON-able value that comes
    back as ``Measurement.result`` (e.g. a row count, to check the work really happened).
    """
    with tempfile.TemporaryDirectory(prefix="stepscope-measure-") as tmp:
        out = Path(tmp) / "result.json"
        argv = [os.fspath(python), "-c", _CHILD, setup, work, str(out)]
        proc = run_process(argv, label=label, env=env, cwd=cwd, timeout_s=timeout_s)
        reported = json.loads(out.read_text())
    return Measurement(
        label=label,
        wall_s=proc.wall_s,
        peak_rss_bytes=proc.peak_rss_bytes,
        cpu_s=proc.cpu_s,
        work_s=reported["work_s"],
        work_cpu_s=reported["work_cpu_s"],
        setup_rss_bytes=reported["setup_rss_kib"] * 1024,
        result=reported["result"],
    )


def median_measurement(samples: Sequence[Measurement]) -> Measurement:
    """The median of each field over repeated runs of one thing (fields taken independently)."""
    if not samples:
        raise ValueError("no samples")

    def med(get: Callable[[Measurement], float | int | None]) -> float | None:
        values = [v for v in map(get, samples) if v is not None]
        return statistics.median(values) if values else None

    first = samples[0]
    setup_rss = med(lambda m: m.setup_rss_bytes)
    return Measurement(
        label=first.label,
        wall_s=float(med(lambda m: m.wall_s) or 0.0),
        peak_rss_bytes=int(med(lambda m: m.peak_rss_bytes) or 0),
        cpu_s=med(lambda m: m.cpu_s),
        work_s=med(lambda m: m.work_s),
        work_cpu_s=med(lambda m: m.work_cpu_s),
        setup_rss_bytes=None if setup_rss is None else int(setup_rss),
        result=first.result,
    )


def shared_traces_dir(override: str | os.PathLike[str] | None = None) -> Path | None:
    """Where the shared real traces are: ``override`` if given, else ``<repo>/../shared/traces``.

    Returns None when the folder is absent, so a benchmark can say so and exit cleanly.
    """
    path = Path(override) if override else REPO_ROOT.parent / "shared" / "traces"
    return path if path.is_dir() else None


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table (first column left-aligned, the rest right-aligned); None prints '-'."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        first, *rest = values
        return "  ".join([first.ljust(widths[0]), *(v.rjust(w) for v, w in zip(rest, widths[1:]))])

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(list(headers)), rule, *(line(r) for r in cells)])


def verdict(label: str, value: float, target: float, *, at_least: bool, unit: str = "x") -> str:
    """One ratio line: ``label: 12.3x (target >= 10x) PASS``; MISS when the target is not met."""
    ok = value >= target if at_least else value <= target
    op = ">=" if at_least else "<="
    return f"{label}: {value:.2f}{unit} (target {op} {target:g}{unit}) {'PASS' if ok else 'MISS'}"
