"""Never hurt the job: the collector's one policy for its own failures.

A profiler that crashes or stalls a week-long run is uninstalled for good, so every failure of
stepscope's own work (store unwritable, disk full, a trace that will not convert) is caught,
logged once per cause class with the cause named, and the affected trace is dropped.
``strict=True`` turns the same failures into ``CollectorError`` so tests (and users who prefer
to know) see them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stepscope.errors import StepscopeError, StoreWriteError, TraceFormatError, os_error_text, write_problem

log = logging.getLogger("stepscope.collector")


class CollectorError(StepscopeError):
    """stepscope's own work failed while profiling (only raised with ``strict=True``)."""


def cause_of(exc: BaseException, store: object | None = None) -> tuple[str, str]:
    """``(cause class, cause text)`` of a failure: the class decides "once per cause", the text is
    what the warning says. Neither holds a temporary file's name, which differs every time.

    A write error is classed by its errno ("disk full", "store not writable", through the one
    classifier the CLI uses too) and names the store; a refused trace by its problem, naming only
    the trace's file name; anything else by its type and message.
    """
    if isinstance(exc, (OSError, StoreWriteError)):
        problem = write_problem(exc)
        detail = exc.detail if isinstance(exc, StoreWriteError) else os_error_text(exc)
        if problem == "write failed":
            return detail, detail
        where = f" in {store}" if store is not None else ""
        return problem, f"{problem}{where} ({detail})"
    if isinstance(exc, TraceFormatError):
        return f"TraceFormatError: {exc.problem}", f"TraceFormatError: {Path(exc.path).name}: {exc.problem}"
    text = f"{type(exc).__name__}: {exc}"
    return text, text


class FaultPolicy:
    """Decides what a failure of stepscope's work does: warn once and carry on, or raise.

    Thread-safe, because failures happen both on the training thread and in the writer thread.
    In strict mode a failure in the writer thread cannot raise into the training loop directly; it
    is kept and raised by ``raise_pending()`` when the profile closes.
    """

    def __init__(self, strict: bool = False, store: object | None = None) -> None:
        self.strict = strict
        self.store = store
        """The store the work writes to, named in write errors."""
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._pending: CollectorError | None = None
        self.dropped = 0
        """How many pieces of work (traces, tables) were dropped because of a failure."""

    def failed(self, what: str, exc: BaseException) -> None:
        """Record that ``what`` (e.g. "writing the trace of steps 7-9") failed with ``exc``."""
        cause, text = cause_of(exc, self.store)
        error = CollectorError(f"stepscope: {what} failed ({text})")
        with self._lock:
            self.dropped += 1
            first = cause not in self._warned
            self._warned.add(cause)
            if self.strict and self._pending is None:
                self._pending = error
        if self.strict:
            log.error("%s", error)
            return
        if first:
            log.warning("%s; dropped it, training continues (further failures with this cause "
                        "are logged at debug level)", error)
        else:
            log.debug("%s", error)

    @contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Run a block of stepscope work; a failure is handled by the policy.

        In strict mode the error is raised at once (the caller is on the training thread).
        """
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - the whole point: nothing may escape into the job
            self.failed(what, exc)
            if self.strict:
                self.raise_pending()

    def raise_pending(self) -> None:
        """Raise the first failure kept in strict mode (once)."""
        with self._lock:
            error, self._pending = self._pending, None
        if error is not None:
            raise error
