"""The ``on_trace_ready`` callback: hand a finished trace to the writer thread and return.

Used directly by code that owns its ``torch.profiler.profile``
(``on_trace_ready=stepscope.trace_handler(store=..., run=...)``) and by ``stepscope.profile``.
On the training thread it takes what must be taken now (the finished Kineto result, the
addresses of parameters/gradients/optimizer state, the CUDA memory snapshot) and exports the
Kineto JSON; converting and writing happen in the background writer, the conversion in a niced
child process.

Why the export is not in the writer thread: Kineto's ``save`` holds the interpreter lock for
the whole export, so in another thread it stops the training thread just the same, only in the
middle of the next step and for longer (measured on the CPU example: 35-40 ms of export CPU
stopped the training thread for 80-140 ms at a time, and the first step after the window took
2.2x its neighbours; exporting from a forked child instead cost the training thread 1.6x its CPU
time in copy-on-write faults). Here it is paid once, inside the ``prof.step()`` that ends the
window, right after torch's own stop of the profiler, and the step timer marks that step as
disturbed by the collector (``step_times.disturbed_by``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from torch import nn

from stepscope.collector.distributed import agree_run_name, rank_info
from stepscope.collector.export import finished_cycle, save_plain
from stepscope.collector.faults import FaultPolicy
from stepscope.collector.memory_roles import RoleRecorder, RoleRow, roles_table
from stepscope.collector.memory_snapshot import SnapshotRecorder, snapshot_table
from stepscope.collector.metadata import run_metadata
from stepscope.collector.sink import CONVERT_MODES, Exported, StoreSink
from stepscope.collector.worker import DEFAULT_FLUSH_TIMEOUT_S, BackgroundWriter
from stepscope.errors import UsageError
from stepscope.store.location import store_location


class TraceHandler:
    """Callable for ``on_trace_ready`` that stores each finished trace as one rank of a run."""

    def __init__(
        self,
        store: str | Path = "runs/",
        run: str | None = None,
        *,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        tags: dict[str, str] | None = None,
        strict: bool = False,
        trace_dir: str | Path | None = None,
        memory_snapshot: bool = True,
        convert: str = "process",
        flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S,
    ) -> None:
        if convert not in CONVERT_MODES:
            raise UsageError(f"convert must be one of {', '.join(CONVERT_MODES)}, not {convert!r}")
        self._store = store_location(store) if isinstance(store, str) else Path(store)
        self.policy = FaultPolicy(strict, store=self._store)
        self.writer = BackgroundWriter(self.policy)
        self.flush_timeout_s = flush_timeout_s
        self._run = run
        self._tags = dict(tags) if tags else None
        self._trace_dir = Path(trace_dir) if trace_dir is not None else None
        self._convert = convert
        self.sink: StoreSink | None = None
        self._cycle = 0
        self.roles = RoleRecorder(model, optimizer)
        self.last_step: int | None = None
        """The last recorded step, set by ``stepscope.profile``; None for a bare handler."""
        self._lock = threading.Lock()
        self._sources: list[str] = []
        self.snapshots = (SnapshotRecorder()
                          if memory_snapshot and torch.cuda.is_available() else None)
        self.rearm_history = False
        """Restart allocator history after each snapshot: set for a bare handler, which cannot
        see when the next recorded window begins; ``stepscope.profile`` starts it per window."""
        self._next_tables: list[tuple[str, Callable[[str], pa.Table]]] = []

    @property
    def converts_in_process(self) -> bool:
        """Traces are converted in the writer thread (``convert="thread"``), not a child."""
        return self._convert == "thread"

    @property
    def sources(self) -> list[str]:
        """Source ids of the traces stored so far, in order."""
        with self._lock:
            return list(self._sources)

    def open(self) -> StoreSink:
        """Resolve rank, run name (agreed across ranks) and metadata; idempotent.

        ``stepscope.profile`` calls it when profiling starts; a bare handler calls it at its first
        trace, which every rank reaches at the same step, so the run-name broadcast still lines up.
        """
        if self.sink is None:
            info = rank_info()
            self.sink = StoreSink(self._store, agree_run_name(self._run), info.rank,
                                  info.rank_from, run_metadata(info), self._tags,
                                  self._trace_dir, self._convert)
            self.sink.start()
        return self.sink

    def note_gradients(self, step: int) -> None:
        """Record where the gradients are at the end of recorded step ``step``.

        ``stepscope.profile`` calls it at every recorded step, so that gradients re-allocated
        each step (``zero_grad(set_to_none=True)``) are labelled in every step of the trace, not
        only the last; a bare handler sees only the end of the window.
        """
        self.last_step = step
        self.roles.gradients(step)

    def add_table_for_next_trace(self, table: str, build: Callable[[str], pa.Table]) -> None:
        """Store ``build(source)`` as ``table`` with the next trace (e.g. its ``captures`` row)."""
        self._next_tables.append((table, build))

    def start_memory_history(self) -> None:
        """Turn CUDA allocator history on ahead of a recorded window (no-op without CUDA)."""
        if self.snapshots is not None:
            self.snapshots.start()

    def __call__(self, prof: Any) -> None:
        try:
            self._capture(prof)
        except Exception as exc:  # noqa: BLE001 - never hurt the job
            self.policy.failed(f"capturing trace {self._cycle}", exc)
            if self.policy.strict:
                self.policy.raise_pending()

    def _capture(self, prof: Any) -> None:
        tables, self._next_tables = self._next_tables, []
        sink = self.open()
        results = finished_cycle(prof)
        cycle = self._cycle
        self._cycle += 1
        roles: list[RoleRow] = []
        if self.roles.enabled:
            self.roles.everything(self.last_step)
            roles = self.roles.take()
        snapshot = None
        if self.snapshots is not None and self.snapshots.recording:
            snapshot = self.snapshots.take()
            if self.rearm_history:
                self.snapshots.start()
        what = f"writing trace {cycle} of run {sink.run_name!r} (rank {sink.rank})"
        try:
            exported = sink.export_trace(lambda path: save_plain(results, path), cycle)
        except Exception as exc:  # noqa: BLE001 - never hurt the job
            # Like a failed write: dropped, and in strict mode raised when the profile closes.
            self.policy.failed(what, exc)
            return
        if not self.writer.submit(what, lambda: self._write(sink, exported, roles, snapshot,
                                                            tables)):
            exported.discard()

    def _write(self, sink: StoreSink, exported: Exported, roles: list[RoleRow],
               snapshot: dict[str, Any] | None,
               tables: list[tuple[str, Callable[[str], pa.Table]]]) -> None:
        source = sink.convert_trace(exported, self.writer.elsewhere)
        with self._lock:
            self._sources.append(source)
        if roles:
            sink.store_table("memory_roles", source, roles_table(roles, source))
        if snapshot is not None:
            sink.store_table("memory_snapshot", source, snapshot_table(snapshot, source))
        for table, build in tables:
            sink.store_table(table, source, build(source))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait (bounded) until every trace handed over so far is stored."""
        return self.writer.flush(self.flush_timeout_s if timeout_s is None else timeout_s)

    def close(self) -> None:
        """Flush with the bounded wait and stop the writer; in strict mode raise a kept failure."""
        if self.snapshots is not None:
            self.snapshots.stop()
        self.writer.close(self.flush_timeout_s)
        if self.sink is not None:
            self.sink.close()
        if self.policy.strict:
            self.policy.raise_pending()


def trace_handler(store: str | Path = "runs/", run: str | None = None, **options: Any) -> TraceHandler:
    """``on_trace_ready`` callback storing each trace of a profiler you own into ``store``.

    ``options`` are those of ``TraceHandler`` (model, optimizer, tags, strict, trace_dir, ...).
    Pending writes are flushed at interpreter exit with a bounded wait, or call ``.close()``.
    """
    handler = TraceHandler(store, run, **options)
    handler.rearm_history = True
    handler.start_memory_history()
    return handler
