"""Where the collector's output goes: one rank's partitions of one run in a store.

The single place where the collector touches the store, through the store's own ingest path
(one parser for live and offline traces) and its atomic partition writer.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from stepscope.collector import convert_job, exports
from stepscope.store.writer import run_id, write_partition
from stepscope.store.location import is_url

CONVERT_MODES = ("process", "thread")

log = logging.getLogger("stepscope.collector")


@dataclass(frozen=True)
class Exported:
    """A trace exported as ``plain`` JSON, to become ``target`` (gzipped); ``folder`` is the
    temporary export folder holding it (None when kept in ``trace_dir``)."""

    plain: Path
    target: Path
    folder: Path | None

    def discard(self) -> None:
        """Remove what the export left: the plain file, and its temporary folder."""
        self.plain.unlink(missing_ok=True)
        if self.folder is not None:
            exports.remove_export_folder(self.folder)


@dataclass(frozen=True)
class StoreSink:
    """Writes traces and collector tables for ``rank`` of the run named ``run_name``.

    ``convert="process"`` (default) compresses and ingests each trace in a child process, so the
    training process's GIL is not held by conversion; ``"thread"`` does it in the writer thread
    (for environments that forbid starting processes). ``trace_dir``, when given, keeps the
    exported Kineto JSON files there (``rank<r>.pt.trace.json.gz``, then
    ``rank<r>.cycle<k>.pt.trace.json.gz`` for later cycles of a repeating schedule); otherwise
    they are exported to a temporary folder inside the store (same filesystem, so a full disk
    shows up as what it is; see ``exports``) and removed once ingested.
    """

    store: Path | str
    run_name: str
    rank: int
    rank_from: str
    metadata: dict[str, Any]
    tags: dict[str, str] | None
    trace_dir: Path | None = None
    convert: str = "process"
    convert_timeout_s: float = 3600.0
    children: ConversionChildren = field(default_factory=lambda: ConversionChildren(),
                                         compare=False)
    placed: dict[str, str] = field(default_factory=dict, compare=False)
    """The run each stored trace (by source) went to: the sink's own, or a session run of it
    when the store already held another recording of this rank (``store.sessions``)."""

    @property
    def run(self) -> str:
        """The run's id in the store (its name reduced to safe characters)."""
        return run_id(self.run_name)

    def trace_name(self, cycle: int) -> str:
        suffix = "" if cycle == 0 else f".cycle{cycle}"
        return f"rank{self.rank}{suffix}.pt.trace.json.gz"

    def export_trace(self, export: Callable[[Path], object], cycle: int) -> Exported:
        """Export a trace as plain JSON with ``export(path)``, now (on the training thread: see
        ``handler``), for ``convert_trace`` to compress and ingest later."""
        folder = None
        if self.trace_dir is not None:
            self.trace_dir.mkdir(parents=True, exist_ok=True)
            target = self.trace_dir / self.trace_name(cycle)
        else:
            folder = exports.make_export_folder(self._exports_in())
            target = folder / self.trace_name(cycle)
        exported = Exported(target.with_name(target.name + ".export.json"), target, folder)
        started = time.perf_counter()
        try:
            export(exported.plain)
        except BaseException:
            exported.discard()
            raise
        log.debug("stepscope: Kineto export of %s took %.3f s (%d bytes)", target.name,
                  time.perf_counter() - started, exported.plain.stat().st_size)
        return exported

    def convert_trace(self, exported: Exported,
                      elsewhere: Callable[[], AbstractContextManager[None]] = nullcontext
                      ) -> str:
        """Compress and ingest an exported trace (in the writer thread); returns its ``source``
        id. ``elsewhere()`` brackets the wait for the conversion child (``BackgroundWriter``)."""
        try:
            return self._convert(exported, elsewhere)
        finally:
            exported.discard()

    def _exports_in(self) -> Path:
        """Where traces are exported before their conversion: the store's folder, or this
        machine's temporary folder for a store on object storage (``s3://...``)."""
        return Path(tempfile.gettempdir()) if is_url(self.store) else Path(self.store)

    def start(self) -> None:
        """Before the first trace: remove export folders that dead processes left in the store,
        and have SIGTERM remove this process's own."""
        exports.remove_stale(self._exports_in())
        exports.clean_up_on_sigterm()
        if self.convert == "process":
            self.children.start()

    def close(self) -> None:
        """After the last conversion: let the spare conversion child go."""
        self.children.close()

    def store_table(self, table: str, source: str, data: pa.Table) -> Path:
        """Write one of the collector's tables as the part of trace ``source`` (in its run)."""
        return write_partition(self.store, table, self.placed.get(source, self.run), self.rank, source, data)

    def _convert(self, exported: Exported,
                 elsewhere: Callable[[], AbstractContextManager[None]]) -> str:
        job = {"plain": str(exported.plain), "target": str(exported.target),
               "store": str(self.store), "run_name": self.run_name, "rank": self.rank,
               "rank_from": self.rank_from, "metadata": self.metadata, "tags": self.tags}
        if self.convert == "thread":
            return self._placed(convert_job.convert(job))
        child = self.children.take()
        with elsewhere():
            try:
                stdout, stderr = child.communicate(json.dumps(job), timeout=self.convert_timeout_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.communicate()
                raise RuntimeError(f"converting {exported.target.name} took more than "
                                   f"{self.convert_timeout_s:.0f} s") from None
        self.children.start()  # the next trace's child, started while nothing waits for it
        if child.returncode != 0:
            convert_job.raise_failure(stdout, stderr, child.returncode, exported.target.name)
        return self._placed(json.loads(stdout))

    def _placed(self, result: dict[str, Any]) -> str:
        source = str(result["source"])
        self.placed[source] = str(result["run"])
        return source


class ConversionChildren:
    """The conversion child of the next trace, started ahead of time: starting a process (the
    fork and exec of a large training process, then an interpreter starting up before it lowers
    its priority) during the steps after a window slowed the first of them 1.5-2x on a loaded
    2-core machine. The spare waits on its stdin for its job; it exits when the job ends without
    one (stdin closed, also when the training process dies)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spare: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """Start the spare child unless one waits already."""
        with self._lock:
            if self._spare is None or self._spare.poll() is not None:
                self._spare = _spawn()

    def take(self) -> subprocess.Popen[str]:
        """The spare child for a job (a fresh one when none waits, or it died)."""
        with self._lock:
            child, self._spare = self._spare, None
        return child if child is not None and child.poll() is None else _spawn()

    def close(self) -> None:
        with self._lock:
            child, self._spare = self._spare, None
        if child is not None:
            try:
                child.communicate(timeout=10)  # stdin closed without a job: it exits
            except subprocess.TimeoutExpired:
                child.kill()
                child.communicate()


_NICE = shutil.which("nice")


def _spawn() -> subprocess.Popen[str]:
    """A conversion child at the lowest CPU priority from its first instruction (``nice``
    where the system has it; ``convert_job`` lowers its own priority too)."""
    command = [sys.executable, "-m", convert_job.__name__]
    return subprocess.Popen(([_NICE, "-n", "19"] if _NICE else []) + command,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_child_environment())


def _child_environment() -> dict[str, str]:
    """The job's environment, with the folder this ``stepscope`` was imported from first on
    ``PYTHONPATH``: the child must import the same stepscope even when the training script
    found it through a ``sys.path`` tweak rather than an installation."""
    package_root = str(Path(convert_job.__file__).resolve().parents[2])
    inherited = os.environ.get("PYTHONPATH")
    return {**os.environ,
            "PYTHONPATH": package_root if not inherited else package_root + os.pathsep + inherited}
