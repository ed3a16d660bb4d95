"""Every training step timed, not only the profiled ones.

The profiler sees a few steps; the step timer sees all of them, cheaply enough to leave on for a
week: three clock reads and a few appends to typed arrays per step (8 bytes per value, so a million
steps cost ~50 MB, not the ~250 MB of Python lists of ints). On GPU it also records one CUDA
event per step boundary (the end event of a step is the start event of the next) and resolves
elapsed times only once an event has completed (``Event.query()``), so it never synchronises the
device during training.

Beside the wall time it reads the CPU time of the thread that calls ``step()`` (the training
thread; ``time.thread_time_ns``, ``CLOCK_THREAD_CPUTIME_ID``): on a machine shared with other
processes a step's wall time includes the time the thread waited for a core, its CPU time does
not, so the CI gate judges CPU runs on it (docs/ci.md says why). It also counts the thread's
involuntary context switches per step (``getrusage(RUSAGE_THREAD).ru_nivcsw``, Linux): a step that
no other process preempted has a CPU time that load did not inflate, so the gate needs to allow
for load only on the steps that were preempted (:func:`stepscope.analysis.compare.stats.preemption`).
And it reads how much CPU time the rest of the machine used during each step (``others_cpu_ns``:
the busy time of every CPU in ``/proc/stat`` less this process's own CPU time; ~6 us a step on
this project's 2-core machine, where the rest of ``end_step`` takes ~2 us: 0.2 % of a 3 ms step): a
thread that no one preempted can still be slowed by a neighbour on the other hyperthread or
core (shared caches), so only a run on which the rest of the machine was measured quiet is known
to be undisturbed (:attr:`stepscope.analysis.compare.stats.Preemption.others`).
"""

from __future__ import annotations

import functools
import os
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import torch

from stepscope.store.schema import STEP_TIMES

_MISSING = -1
"""Internal placeholder in the typed arrays; becomes null in the table (never stored)."""
_NO_OTHERS = -(2**63)
"""The placeholder of ``others_cpu_ns``, whose values can be negative (-1 included)."""

def _thread_switches() -> Callable[[], int] | None:
    """A reader of the calling thread's involuntary context switches so far, or None where the
    platform has no per-thread resource usage (``resource`` is Unix-only, ``RUSAGE_THREAD``
    Linux-only): the column is then null, and the gate falls back on the wall-over-CPU load."""
    try:
        import resource

        who = resource.RUSAGE_THREAD
    except (ImportError, AttributeError):
        return None
    return lambda: resource.getrusage(who).ru_nivcsw


_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
"""Fields of ``/proc/stat``'s ``cpu`` line (after the name) that count busy time: user, nice,
system, irq, softirq, steal (a hypervisor's other guests on this machine's CPUs); not idle and
iowait."""


@functools.cache
def _machine_busy() -> Callable[[], int] | None:
    """A reader of the CPU time (ns) every CPU of the machine has been busy so far, from
    ``/proc/stat`` (kept open: one ``pread`` a call), or None where there is none (not Linux).
    Its unit is the kernel's tick (``SC_CLK_TCK``, 10 ms), so a single step's difference is
    coarse; summed over a run's steps it is exact to a few ticks."""
    try:
        fd = os.open("/proc/stat", os.O_RDONLY)
        tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None

    def read() -> int:
        fields = os.pread(fd, 256, 0).split(b"\n", 1)[0].split()[1:]
        return sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields)) * tick_ns

    try:
        read()
    except (OSError, ValueError):
        os.close(fd)
        return None
    return read


DISTURBANCES = ("profiler", "exchange", "writer", "conversion")
"""Values of ``step_times.disturbed_by``: what the collector itself did during a step that may
have slowed it (docs/STORE.md); stored here as 1 + their index, 0 for none."""


class StepTimer:
    """Times the steps between calls to ``begin()`` and successive ``end_step()`` calls."""

    def __init__(self, use_cuda: bool | None = None) -> None:
        self.use_cuda = torch.cuda.is_available() if use_cuda is None else use_cuda
        # Epoch offset of the monotonic clock, taken once: step starts are stored on the same
        # absolute (Unix epoch, ns) clock as trace events, durations come from the monotonic one.
        self._epoch_offset = time.time_ns() - time.perf_counter_ns()
        self._step = array("q")
        self._start = array("q")
        self._wall = array("q")
        self._cpu = array("q")
        self._switches = array("q")
        self._others = array("q")
        self._gpu = array("q")
        self._profiled = array("b")
        self._tokens = array("q")
        self._samples = array("q")
        self._disturbed = array("b")
        self._t0: int | None = None
        self._cpu0 = 0
        self._read_switches = _thread_switches()
        self._switches0 = 0
        self._read_busy = _machine_busy()
        self._others0 = 0
        self._event: torch.cuda.Event | None = None
        self._pending: deque[tuple[int, torch.cuda.Event, torch.cuda.Event]] = deque()

    def begin(self) -> None:
        """Start timing the first step (called when profiling starts)."""
        self._t0 = time.perf_counter_ns()
        self._cpu0 = time.thread_time_ns()
        self._switches0 = self._switches_now()
        self._others0 = self._others_now()
        if self.use_cuda:
            self._event = self._record_event()

    def end_step(self, step: int, profiled: bool, tokens: int | None = None,
                 samples: int | None = None, disturbed_by: str | None = None) -> None:
        """Close step ``step`` and start the next one (``disturbed_by``: one of
        ``DISTURBANCES``, or None)."""
        now = time.perf_counter_ns()
        cpu = time.thread_time_ns()
        switches = self._switches_now()
        others = self._others_now()
        if self._t0 is None:
            self._t0, self._cpu0, self._switches0, self._others0 = now, cpu, switches, others
            return
        self._step.append(step)
        self._start.append(self._epoch_offset + self._t0)
        self._wall.append(now - self._t0)
        self._cpu.append(cpu - self._cpu0)
        self._switches.append(_MISSING if switches == _MISSING else switches - self._switches0)
        self._others.append(_NO_OTHERS if others is None else others - self._others0)
        self._gpu.append(_MISSING)
        self._profiled.append(1 if profiled else 0)
        self._tokens.append(_MISSING if tokens is None else int(tokens))
        self._samples.append(_MISSING if samples is None else int(samples))
        self._disturbed.append(0 if disturbed_by is None else DISTURBANCES.index(disturbed_by) + 1)
        self._t0, self._cpu0, self._switches0, self._others0 = now, cpu, switches, others
        if self.use_cuda and self._event is not None:
            end = self._record_event()
            self._pending.append((len(self._step) - 1, self._event, end))
            self._event = end
            self._resolve(block=False)

    def _switches_now(self) -> int:
        """The training thread's involuntary context switches so far (``_MISSING`` where unknown)."""
        return _MISSING if self._read_switches is None else self._read_switches()

    def _others_now(self) -> int | None:
        """The CPU time (ns) the rest of the machine has used so far: every CPU's busy time less
        this process's CPU time (None where unknown). A step's difference can be negative: the
        busy time is counted in ticks, the process's own time in ns."""
        return None if self._read_busy is None else self._read_busy() - time.process_time_ns()

    def __len__(self) -> int:
        return len(self._step)

    @property
    def last_ns(self) -> int | None:
        """Monotonic time (ns) at which the last step ended (or timing began)."""
        return self._t0

    def snapshot(self, wait_for_gpu: bool = False) -> StepRows:
        """A copy of the steps timed so far, cheap enough for the training thread (memcpy).

        GPU times of steps whose CUDA events have not completed yet stay null unless
        ``wait_for_gpu`` (used once, when profiling ends).
        """
        self._resolve(block=wait_for_gpu)
        return StepRows(*(array(a.typecode, a) for a in (
            self._step, self._start, self._wall, self._cpu, self._switches, self._others, self._gpu, self._profiled,
            self._tokens, self._samples, self._disturbed)))

    def _record_event(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _resolve(self, block: bool) -> None:
        """Fill ``gpu_ns`` for steps whose end event has completed (all of them when ``block``)."""
        while self._pending:
            index, start, end = self._pending[0]
            if block:
                end.synchronize()
            elif not end.query():
                return
            self._gpu[index] = round(start.elapsed_time(end) * 1_000_000)  # ms -> ns
            self._pending.popleft()


@dataclass(frozen=True)
class StepRows:
    """A frozen copy of timed steps; turned into a table in the writer thread."""

    step: array
    start_ns: array
    wall_ns: array
    cpu_ns: array
    preemptions: array
    others_cpu_ns: array
    gpu_ns: array
    profiled: array
    tokens: array
    samples: array
    disturbed: array

    def __len__(self) -> int:
        return len(self.step)

    def table(self, source: str) -> pa.Table:
        """The rows as a ``step_times`` table of trace ``source``."""
        return pa.table(
            {
                "source": pa.array([source] * len(self), pa.string()).dictionary_encode(),
                "step": pa.array(self.step, pa.int64()),
                "start_ns": pa.array(self.start_ns, pa.int64()),
                "wall_ns": pa.array(self.wall_ns, pa.int64()),
                "cpu_ns": pa.array(self.cpu_ns, pa.int64()),
                "preemptions": _nullable(self.preemptions),
                "gpu_ns": _nullable(self.gpu_ns),
                "profiled": pa.array([bool(v) for v in self.profiled], pa.bool_()),
                "tokens": _nullable(self.tokens),
                "samples": _nullable(self.samples),
                "disturbed_by": pa.array([DISTURBANCES[v - 1] if v else None
                                          for v in self.disturbed], pa.string()),
                "others_cpu_ns": _nullable(self.others_cpu_ns, _NO_OTHERS),
            }
        ).cast(STEP_TIMES)


def _nullable(values: array, missing: int = _MISSING) -> pa.Array:
    return pa.array([None if v == missing else v for v in values], pa.int64())
