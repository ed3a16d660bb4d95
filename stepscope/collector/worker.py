"""The background writer: converts and stores traces off the training thread.

Exporting, converting and writing a trace takes from tens of milliseconds to minutes; done inline
it would stall the training step that triggered it. One daemon thread works through a bounded
queue of jobs. When the queue is full the newest job is dropped (with the fault policy's warning)
rather than blocking training. At exit, pending jobs get a bounded wait and are then abandoned:
a profiler must never keep a finished job from exiting.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from stepscope.collector.faults import FaultPolicy

log = logging.getLogger("stepscope.collector")

DEFAULT_QUEUE_SIZE = 8
DEFAULT_FLUSH_TIMEOUT_S = 120.0


IDLE, HERE, ELSEWHERE = "idle", "here", "elsewhere"
"""What the writer is doing: nothing, work in this process (it competes with training for the
interpreter), or waiting while another process (the niced conversion child) works."""


@dataclass(frozen=True)
class Activity:
    """The writer's state at one moment: jobs queued so far, how often it entered each kind of
    work, and what it is doing now. Two of them bracket a training step (``during``)."""

    submitted: int
    here: int
    elsewhere: int
    phase: str

    def during(self, later: Activity) -> frozenset[str]:
        """Which kinds of work (``HERE``, ``ELSEWHERE``) ran at some point between this moment
        and ``later``: running at either end, or entered in between (a job queued meanwhile
        starts in this process)."""
        kinds = set()
        if HERE in (self.phase, later.phase) or later.here > self.here or \
                later.submitted > self.submitted:
            kinds.add(HERE)
        if ELSEWHERE in (self.phase, later.phase) or later.elsewhere > self.elsewhere:
            kinds.add(ELSEWHERE)
        return frozenset(kinds)


@dataclass(frozen=True)
class Job:
    """One piece of work: ``run()`` it; ``what`` names it in warnings."""

    what: str
    run: Callable[[], object]


class BackgroundWriter:
    """A single worker thread draining a bounded queue of ``Job``s under a ``FaultPolicy``."""

    def __init__(self, policy: FaultPolicy, max_pending: int = DEFAULT_QUEUE_SIZE) -> None:
        self._policy = policy
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_pending)
        self._thread = threading.Thread(target=self._loop, name="stepscope-writer", daemon=True)
        self._thread.start()
        self._closed = False
        self.submitted = 0
        """Jobs queued so far."""
        self._state = threading.Lock()
        self._phase = IDLE
        self._entered = {HERE: 0, ELSEWHERE: 0}
        # An interpreter exiting without close() (an exception escaping the with-block is
        # handled by close(); os._exit is not) still gets its bounded flush.
        self._atexit = _close_at_exit(weakref.ref(self))
        atexit.register(self._atexit)

    def submit(self, what: str, run: Callable[[], object]) -> bool:
        """Queue ``run`` without blocking; returns False (and warns) when the queue is full."""
        if self._closed:
            self._policy.failed(what, RuntimeError("the stepscope writer is closed"))
            return False
        try:
            self._queue.put_nowait(Job(what, run))
            self.submitted += 1
        except queue.Full:
            self._policy.failed(what, RuntimeError(
                f"{self._queue.maxsize} earlier traces are still being written"))
            return False
        return True

    def activity(self) -> Activity:
        """What the writer is doing now, and has done so far (cheap: one uncontended lock)."""
        with self._state:
            return Activity(self.submitted, self._entered[HERE], self._entered[ELSEWHERE],
                            self._phase)

    def _enter(self, phase: str) -> None:
        with self._state:
            self._phase = phase
            if phase != IDLE:
                self._entered[phase] += 1

    @contextlib.contextmanager
    def elsewhere(self) -> Iterator[None]:
        """Around the part of a job that only waits for another process (the conversion child),
        so that the steps meanwhile are known to compete only with that process."""
        self._enter(ELSEWHERE)
        try:
            yield
        finally:
            self._enter(HERE)

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every queued job to finish; True when all did."""
        deadline = time.monotonic() + timeout_s
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True

    def close(self, timeout_s: float) -> bool:
        """Flush with a bounded wait, then stop the thread. Returns False when jobs were abandoned."""
        if self._closed:
            return True
        self._closed = True
        atexit.unregister(self._atexit)
        done = self.flush(timeout_s)
        if not done:
            log.warning("stepscope: %d trace write(s) still pending after %.0f s; abandoned so the "
                        "job can exit", self._queue.unfinished_tasks, timeout_s)
            return False
        self._queue.put(None)
        self._thread.join(timeout=max(1.0, timeout_s))
        return True

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                started = time.perf_counter()
                self._enter(HERE)
                try:
                    job.run()
                except Exception as exc:  # noqa: BLE001 - a failed job must not kill the thread
                    self._policy.failed(job.what, exc)
                else:
                    log.debug("stepscope: %s took %.3f s", job.what, time.perf_counter() - started)
            finally:
                self._enter(IDLE)
                self._queue.task_done()


def _close_at_exit(ref: weakref.ReferenceType[BackgroundWriter]) -> Callable[[], None]:
    """An atexit hook that closes the writer if it still exists (a weak reference, so that the
    hook does not keep a discarded writer alive)."""

    def hook() -> None:
        writer = ref()
        if writer is not None:
            writer.close(DEFAULT_FLUSH_TIMEOUT_S)

    return hook
