"""The background writer: converts and stores traces off the training thread.

Exporting, converting and writing a trace takes from tens of milliseconds to minutes; done inline
it would stall the training step that triggered it. One daemon thread works through a bounded
queue of jobs. When the queue is full the newest job is dropped (with the fault policy's warning)
rather than blocking training. At exit, pending jobs get a bounded wait and are then abandoned:
a profiler must never keep a finished job from exiting.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from stepscope.collector.faults import FaultPolicy

log = logging.getLogger("stepscope.collector")

DEFAULT_QUEUE_SIZE = 8
DEFAULT_FLUSH_TIMEOUT_S = 120.0


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
        """Jobs queued so far (with ``busy``, tells whether the writer worked during a step)."""
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

    @property
    def busy(self) -> bool:
        """Jobs are queued or running."""
        return self._queue.unfinished_tasks > 0

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
                try:
                    job.run()
                except Exception as exc:  # noqa: BLE001 - a failed job must not kill the thread
                    self._policy.failed(job.what, exc)
                else:
                    log.debug("stepscope: %s took %.3f s", job.what, time.perf_counter() - started)
            finally:
                self._queue.task_done()


def _close_at_exit(ref: weakref.ReferenceType[BackgroundWriter]) -> Callable[[], None]:
    """An atexit hook that closes the writer if it still exists (a weak reference, so that the
    hook does not keep a discarded writer alive)."""

    def hook() -> None:
        writer = ref()
        if writer is not None:
            writer.close(DEFAULT_FLUSH_TIMEOUT_S)

    return hook
