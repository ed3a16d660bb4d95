"""``stepscope.profile``: one context manager around a training loop.

It drives ``torch.profiler`` with a bounded schedule, times every step, records which memory
belongs to the model and optimizer, and hands each finished trace to the background writer.
Everything it does is guarded by the fault policy: when stepscope fails, the loop goes on.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerAction

from stepscope.collector.handler import TraceHandler
from stepscope.collector.faults import FaultPolicy
from stepscope.collector.options import PROFILING, RECORDING, Recording, Schedule, profiler_kwargs
from stepscope.collector.step_timer import StepTimer
from stepscope.collector.worker import DEFAULT_FLUSH_TIMEOUT_S
from stepscope.store import trace_metadata

log = logging.getLogger("stepscope.collector")


class Profile:
    """What ``stepscope.profile(...)`` returns; call ``step()`` once per training step.

    Options: ``wait/warmup/active/repeat/skip_first`` are torch's schedule (``repeat >= 1``);
    ``model``/``optimizer`` enable memory roles; ``record_shapes``, ``profile_memory`` (on by
    default), ``with_stack``, ``with_flops``, ``with_modules`` are torch's flags;
    ``memory_snapshot`` records a CUDA allocator snapshot per trace (CUDA only); ``tags`` are
    user strings stored with the run; ``trace_dir`` also keeps the exported Kineto files;
    ``convert`` is ``"process"`` (default) or ``"thread"``; ``flush_timeout_s`` bounds the wait
    for pending writes at exit; ``step_times_every_s`` is how often the step times are rewritten
    once a trace is stored; ``strict=True`` raises ``CollectorError`` instead of warning.
    """

    def __init__(
        self,
        store: str | Path = "runs/",
        run: str | None = None,
        *,
        wait: int = 5,
        warmup: int = 2,
        active: int = 3,
        repeat: int = 1,
        skip_first: int = 0,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        record_shapes: bool = True,
        profile_memory: bool = True,
        with_stack: bool = False,
        with_flops: bool = False,
        with_modules: bool = False,
        memory_snapshot: bool = True,
        tags: dict[str, str] | None = None,
        strict: bool = False,
        trace_dir: str | Path | None = None,
        convert: str = "process",
        flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S,
        step_times_every_s: float = 300.0,
    ) -> None:
        self.schedule = Schedule(wait, warmup, active, repeat, skip_first)
        self.recording = Recording(record_shapes, profile_memory, with_stack, with_flops,
                                   with_modules)
        self.handler = TraceHandler(store, run, model=model, optimizer=optimizer, tags=tags,
                                    strict=strict, trace_dir=trace_dir,
                                    memory_snapshot=memory_snapshot and profile_memory,
                                    convert=convert,
                                    flush_timeout_s=flush_timeout_s)
        self.timer = StepTimer()
        self._step_times_every_ns = int(step_times_every_s * 1e9)
        self._step_times_due_ns: int | None = None
        self.step_num = 0
        """The step now running, numbered like ``ProfilerStep#N`` (from 0)."""
        self._actions = self.schedule.torch_schedule()
        self._torch: torch.profiler.profile | None = None

    @property
    def policy(self) -> FaultPolicy:
        """The fault policy (``policy.dropped`` counts what was dropped after a failure)."""
        return self.handler.policy

    @property
    def run(self) -> str | None:
        """The run's id in the store (None until profiling started)."""
        return self.handler.sink.run if self.handler.sink is not None else None

    @property
    def rank(self) -> int | None:
        """This process's rank (None until profiling started)."""
        return self.handler.sink.rank if self.handler.sink is not None else None

    def __enter__(self) -> Profile:
        with self.policy.guard("starting the profiler"):
            sink = self.handler.open()
            if self._actions(0) in PROFILING:
                self.handler.start_memory_history()
            prof = torch.profiler.profile(**profiler_kwargs(self.schedule, self.recording),
                                          on_trace_ready=self.handler)
            # The exported file describes itself too (versions, host, run, tags), for when it is
            # shared or ingested on its own; the store gets the same through ``metadata``.
            # Encoded: Kineto turns every backslash into a slash (see store.trace_metadata).
            prof.preset_metadata_json(trace_metadata.KEY, trace_metadata.encode(
                {**sink.metadata, "run_name": sink.run_name, "tags": sink.tags}))
            prof.__enter__()
            self._torch = prof
        self.timer.begin()
        return self

    def step(self, tokens: int | None = None, samples: int | None = None) -> None:
        """End the current training step (``tokens``/``samples`` it processed, for throughput).

        Outside the profiled window this costs a clock read, a few appends and torch's own
        ``step()``; once the bounded schedule is done, torch's profiler is closed and only the
        step timer remains (about a microsecond).
        """
        step = self.step_num
        action = self._actions(step)
        recording = action in RECORDING
        self.timer.end_step(step, recording, tokens, samples)
        self.step_num = step + 1
        due = self._step_times_due_ns
        if due is not None and (self.timer.last_ns or 0) >= due:
            with self.policy.guard("queueing the step times"):
                self._submit_step_times()
        prof = self._torch
        if prof is None:
            return
        try:
            if recording and self.handler.roles.enabled:
                self.handler.note_gradients(step)
            if action not in PROFILING and self._actions(step + 1) in PROFILING:
                self.handler.start_memory_history()
            prof.step()
            if action is ProfilerAction.RECORD_AND_SAVE:
                # The trace was just handed to the writer; the step times follow it in the queue.
                self._submit_step_times()
            if step >= self.schedule.last_step:
                self._torch = None
                prof.__exit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 - never hurt the job
            self._give_up("a profiler step", exc)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._torch is not None:
            try:
                self._torch.__exit__(exc_type, exc, tb)
            except Exception as error:  # noqa: BLE001 - never hurt the job
                self._give_up("stopping the profiler", error)
        self._submit_step_times(wait_for_gpu=True)
        # A failure kept in strict mode is raised only when the loop itself succeeded, so it
        # never hides the job's own exception.
        try:
            self.handler.close()
        except Exception:
            if exc_type is None:
                raise

    def _give_up(self, what: str, exc: Exception) -> None:
        """Stop profiling for good after a failure of the profiler itself; timing goes on."""
        prof, self._torch = self._torch, None
        self.policy.failed(what, exc)
        if prof is not None:
            try:
                prof.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - already failing; the first cause was reported
                log.debug("stepscope: stopping the profiler after a failure also failed",
                          exc_info=True)
        if self.policy.strict:
            self.policy.raise_pending()

    def _submit_step_times(self, wait_for_gpu: bool = False) -> None:
        """Queue a rewrite of this rank's ``step_times`` (every step so far).

        Called after each trace, every ``step_times_every_s`` from then on (so that a job that
        dies after a week keeps its timings up to the last few minutes), and at exit. Rows live
        under the first stored trace's source, since the store shows a table's rows only
        once their source is committed; rewriting that one part keeps a single, growing copy.
        Without any stored trace there is nothing to attach them to, and they are not written.
        """
        now = self.timer.last_ns
        self._step_times_due_ns = None if now is None else now + self._step_times_every_ns
        rows = self.timer.snapshot(wait_for_gpu)
        sink = self.handler.sink
        if sink is None or len(rows) == 0:
            return

        def write() -> None:
            sources = self.handler.sources
            if not sources:
                # After a dropped trace this is a consequence of the failure already reported.
                level = logging.DEBUG if self.policy.dropped else logging.WARNING
                log.log(level, "stepscope: rank %d stored no trace (the schedule records from "
                        "step %d; %d steps ran), so its step times were not written either",
                        sink.rank, self.schedule.skip_first + self.schedule.wait +
                        self.schedule.warmup, len(rows))
                return
            sink.store_table("step_times", sources[0], rows.table(sources[0]))

        self.handler.writer.submit(f"writing the step times of rank {sink.rank}", write)


def profile(store: str | Path = "runs/", run: str | None = None, **options: Any) -> Profile:
    """Profile a training loop into ``store`` as run ``run``; see ``Profile`` for the options.

    ``with stepscope.profile(store="runs/", run="llama", model=model, optimizer=opt) as prof:``
    then ``prof.step()`` after every training step.
    """
    return Profile(store, run, **options)
