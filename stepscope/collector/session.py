"""``stepscope.profile``: one context manager around a training loop.

It drives ``torch.profiler`` with a bounded schedule, times every step, records which memory
belongs to the model and optimizer, and hands each finished trace to the background writer.
Everything it does is guarded by the fault policy: when stepscope fails, the loop goes on.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType
from typing import Any, Callable

import torch
from torch import nn
from torch.profiler import ProfilerAction

from stepscope.collector.capture import CaptureSchedule
from stepscope.collector.handler import TraceHandler
from stepscope.collector.faults import FaultPolicy
from stepscope.collector.options import PROFILING, RECORDING, Recording, Schedule, profiler_kwargs
from stepscope.collector.step_timer import StepTimer
from stepscope.collector.watch import Watch, watch_options
from stepscope.collector.watcher import Watcher, start_watch
from stepscope.collector.worker import DEFAULT_FLUSH_TIMEOUT_S, ELSEWHERE, HERE
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
    ``watch=True`` (or a ``stepscope.Watch``) watches every step and captures the steps after a
    slow one on every rank (docs/WATCH.md); the default, None, profiles the schedule only.
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
        watch: Watch | bool | None = None,
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
        self._activity = self.handler.writer.activity()
        self._boundary: str | None = None
        """What stepscope did in the step now running (``step_times.disturbed_by``): the
        ``profiler`` records it, or was stopped and its trace exported at its start; the watch's
        ``exchange`` ran at its start."""
        self._step_times_every_ns = int(step_times_every_s * 1e9)
        self._step_times_due_ns: int | None = None
        self.step_num = 0
        """The step now running, numbered like ``ProfilerStep#N`` (from 0)."""
        self._watch = watch_options(watch)
        self._captures = (CaptureSchedule(self.schedule.torch_schedule())
                          if self._watch is not None else None)
        self._actions = self._captures or self.schedule.torch_schedule()
        self._torch: torch.profiler.profile | None = None
        self._profiler_failed = False
        self.watcher: Watcher | None = None
        """The watch of this rank while ``watch`` is on (its ``anomalies``, ``captures``,
        ``not_captured``), else None."""

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
            self.handler.open()
            if self._actions(0) in PROFILING:
                self.handler.start_memory_history()
            self._torch = self._start_profiler(self._actions, 0)
        if self._captures is not None and self._watch is not None:
            self.watcher = start_watch(self._watch, self._captures, self.handler,
                                       profiler_ok=self._torch is not None)
        self.timer.begin()
        if self.watcher is not None:
            self.watcher.resumed()
        return self

    def step(self, tokens: int | None = None, samples: int | None = None) -> None:
        """End the current training step (``tokens``/``samples`` it processed, for throughput).

        Outside the profiled window this costs a clock read, a few appends and torch's own
        ``step()``; once the bounded schedule is done, torch's profiler is closed and only the
        step timer remains (about a microsecond); the watch adds a few microseconds, and
        opens a profiler again for each capture (docs/WATCH.md).
        """
        self._step(tokens, samples)
        if self.watcher is not None:
            self.watcher.resumed()

    def _start_profiler(self, actions: Callable[[int], ProfilerAction], step: int
                        ) -> torch.profiler.profile:
        """A torch profiler following ``actions``, entered during step ``step``: its
        ``ProfilerStep#N`` markers number steps globally (``step_num``), also when it is opened
        late in the run for a capture."""
        sink = self.handler.open()
        prof = torch.profiler.profile(**profiler_kwargs(self.schedule, self.recording, actions),
                                      on_trace_ready=self.handler)
        # The exported file describes itself too (versions, host, run, tags), for when it is
        # shared or ingested on its own; the store gets the same through ``metadata``.
        # Encoded: Kineto turns every backslash into a slash (see store.trace_metadata).
        prof.preset_metadata_json(trace_metadata.KEY, trace_metadata.encode(
            {**sink.metadata, "run_name": sink.run_name, "tags": sink.tags}))
        prof.step_num = step
        prof.__enter__()
        return prof

    def _open_for_capture(self, step: int) -> torch.profiler.profile | None:
        """Once the scheduled windows are over torch's profiler is closed (an idle one costs
        ~0.1 ms per step); a capture whose warm-up starts at step ``step + 1`` opens a new one,
        following the capture window alone, and it closes again after the window."""
        captures = self._captures
        if captures is None or self._profiler_failed or not captures.starts_after(step):
            return None
        try:
            self._torch = self._start_profiler(captures.captures_only, step)
        except Exception as exc:  # noqa: BLE001 - never hurt the job
            self._give_up("starting the profiler for a capture", exc)
        return self._torch

    def _step(self, tokens: int | None, samples: int | None) -> None:
        step = self.step_num
        action = self._actions(step)
        recording = action in RECORDING
        activity = self.handler.writer.activity()
        during, self._activity = self._activity.during(activity), activity
        self.timer.end_step(step, recording, tokens, samples, self._disturbed_by(during))
        self._boundary = None
        self.step_num = step + 1
        if self.watcher is not None and self.watcher.after_step(step, action, self.timer.last_ns,
                                                                during):
            self._boundary = "exchange"
        due = self._step_times_due_ns
        if due is not None and (self.timer.last_ns or 0) >= due:
            with self.policy.guard("queueing the step times"):
                self._submit_step_times()
        prof = self._torch
        if prof is None:
            prof = self._open_for_capture(step)
        if prof is None:
            return
        if action in PROFILING or self._actions(step + 1) in PROFILING:
            # The next step runs under the profiler, or pays for its stop and the export.
            self._boundary = "profiler"
        try:
            if recording and self.handler.roles.enabled:
                self.handler.note_gradients(step)
            if action not in PROFILING and self._actions(step + 1) in PROFILING:
                self.handler.start_memory_history()
            prof.step()
            if action is ProfilerAction.RECORD_AND_SAVE:
                # The trace was just exported and handed to the writer; the step times follow
                # it in the queue.
                self._submit_step_times()
            if step >= self.schedule.last_step and not (self._captures is not None
                                                        and self._captures.busy(step)):
                self._torch = None
                prof.__exit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 - never hurt the job
            self._give_up("a profiler step", exc)

    def _disturbed_by(self, during: frozenset[str]) -> str | None:
        """What the collector did during the step that just ended, for ``step_times``: its own
        work at the step's start, else the background writer's in this process, else the
        conversion child's (which competes only for cores)."""
        if self._boundary is not None:
            return self._boundary
        if HERE in during:
            return "writer"
        return "conversion" if ELSEWHERE in during else None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.watcher is not None:
            self.watcher.close(self.step_num)
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
        self._profiler_failed = True
        self.policy.failed(what, exc)
        if self.watcher is not None:
            self.watcher.profiler_failed()
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
