"""Capture windows opened on demand beside the scheduled one, and the budget that bounds them.

torch.profiler asks its schedule for the action of every step. ``CaptureSchedule`` answers with
the user's bounded schedule, except inside a capture window the watch planned: WARMUP for
``capture_warmup`` steps, RECORD, and RECORD_AND_SAVE on the last step. While the scheduled
profiler is open it follows the whole schedule; after it closed (as without the watch), a capture
opens a profiler of its own that follows ``captures_only``. Either way the profiler is built
with the same activities and flags, and ``ProfilerStep#N`` counts global steps.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from torch.profiler import ProfilerAction

from stepscope.collector.watch import Trigger
from stepscope.store.schema import CAPTURES, TABLES
from stepscope.store.writer import partition_dir

HOUR_S = 3600.0


@dataclass(frozen=True)
class CaptureWindow:
    """Steps ``warmup_step`` .. ``last_step``, recorded from ``first_step``; agreed by every rank
    at the end of step ``agreed_step`` because of ``trigger``."""

    warmup_step: int
    first_step: int
    last_step: int
    trigger: Trigger
    agreed_step: int

    def action(self, step: int) -> ProfilerAction:
        if step < self.first_step:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD_AND_SAVE if step == self.last_step else ProfilerAction.RECORD

    def table(self, source: str, last_step: int) -> pa.Table:
        """This rank's ``captures`` row under trace ``source``, whose last recorded step is
        ``last_step`` (before ``self.last_step`` when the run ended inside the window)."""
        t = self.trigger
        return pa.Table.from_pylist([{
            "source": source, "first_step": self.first_step, "last_step": last_step,
            "trigger_kind": t.kind, "trigger_rank": t.rank, "trigger_step": t.step,
            "observed_ns": t.observed_ns, "reference_ns": t.reference_ns,
            "agreed_step": self.agreed_step,
        }], schema=CAPTURES)


class CaptureSchedule:
    """The callable schedule given to torch.profiler: the scheduled window(s), plus at most one
    capture window at a time."""

    def __init__(self, scheduled: Callable[[int], ProfilerAction]) -> None:
        self._scheduled = scheduled
        self.window: CaptureWindow | None = None

    def __call__(self, step: int) -> ProfilerAction:
        window = self.window
        if window is not None and window.warmup_step <= step <= window.last_step:
            return window.action(step)
        return self._scheduled(step)

    def captures_only(self, step: int) -> ProfilerAction:
        """The capture window's actions, NONE elsewhere (for a profiler opened for a capture:
        torch asks it for step 0 too, which is never in a capture)."""
        window = self.window
        if window is not None and window.warmup_step <= step <= window.last_step:
            return window.action(step)
        return ProfilerAction.NONE

    def starts_after(self, step: int) -> bool:
        """A capture window begins (warm-up) at step ``step + 1``."""
        return self.window is not None and self.window.warmup_step == step + 1

    def busy(self, step: int) -> bool:
        """A capture is planned or running after step ``step``."""
        return self.window is not None and step < self.window.last_step

    def plan(self, agreed_step: int, steps: int, warmup: int, trigger: Trigger) -> CaptureWindow:
        """The first window after ``agreed_step`` that stays clear of the scheduled windows, with
        an idle step on either side (a scheduled trace is never cut, nor merged with a capture).
        Every rank computes the same window: the schedule is the same everywhere."""
        start = agreed_step + 1
        while any(self._scheduled(s) is not ProfilerAction.NONE
                  for s in range(start - 1, start + warmup + steps + 1)):
            start += 1
        self.window = CaptureWindow(start, start + warmup, start + warmup + steps - 1, trigger,
                                    agreed_step)
        return self.window

    def recording(self, step: int) -> CaptureWindow | None:
        """The capture window whose recorded steps include ``step``, if any."""
        window = self.window
        if window is not None and window.first_step <= step <= window.last_step:
            return window
        return None


class RateBudget:
    """At most ``per_hour`` captures in any rolling hour (on this rank's monotonic clock)."""

    def __init__(self, per_hour: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._per_hour = per_hour
        self._clock = clock
        self._spent: deque[float] = deque()

    def allows(self) -> bool:
        now = self._clock()
        while self._spent and now - self._spent[0] >= HOUR_S:
            self._spent.popleft()
        return len(self._spent) < self._per_hour

    def spend(self) -> None:
        self._spent.append(self._clock())


class DiskBudget:
    """No capture once this rank's partitions of the run hold ``limit_bytes``.

    ``measure()`` lists a handful of folders; it runs again only when ``stored`` (traces stored
    so far) changes, so the check is free between captures.
    """

    def __init__(self, limit_bytes: int, measure: Callable[[], int]) -> None:
        self._limit = limit_bytes
        self._measure = measure
        self._seen: int | None = None
        self.used_bytes = 0

    def allows(self, stored: int) -> bool:
        if stored != self._seen:
            self._seen = stored
            self.used_bytes = self._measure()
        return self.used_bytes < self._limit


def rank_bytes(store: Path, run: str, rank: int, trace_dir: Path | None) -> int:
    """Bytes of ``rank``'s partitions of ``run`` in every table, plus its kept trace files."""
    files = [p for table in TABLES for p in partition_dir(store, table, run, rank).glob("*")]
    if trace_dir is not None:
        files += trace_dir.glob(f"rank{rank}.*pt.trace.json.gz")
    total = 0
    for path in files:
        try:
            total += path.stat().st_size
        except OSError:  # removed meanwhile (a temporary part renamed into place)
            continue
    return total
