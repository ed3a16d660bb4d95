"""The watch's options and its decisions: which step is slow, and what all ranks agree to do.

Pure logic on integers (nanoseconds, step numbers), no torch and no clock: the runtime
(``watcher.py``) feeds it the step times and the all-gathered reports, so every rule here is
unit-tested without a process group. Two triggers (docs/WATCH.md):

- ``slow_step``: on one rank, a step slower than ``slow_factor`` times the rolling median of that
  rank's recent steps, and by at least ``min_slow_ms``, once ``warmup_steps`` have passed;
- ``straggler``: at an exchange, a rank whose median step since the previous exchange is slower
  than ``slow_factor`` times the median of the other ranks' (and by ``min_slow_ms``);
- ``slow_vs_ranks``: at an exchange, a step slow against the other ranks' times of the same
  step (the basis that a conversion, which competes for cores and so disturbs the rolling
  median, disturbs alike on every rank of a synchronous job).

Every rank applies :func:`agree` to the same gathered reports, so every rank reaches the same
decision without another round trip.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from stepscope.errors import UsageError

TRIGGER_KINDS = {
    "slow_step": "slow step {step} on rank {rank} ({observed:.1f} ms, {ratio:.1f}x the rolling "
                 "median {reference:.1f} ms)",
    "straggler": "rank {rank} straggling at step {step} (median step {observed:.1f} ms, "
                 "{ratio:.1f}x the other ranks' median {reference:.1f} ms)",
    "slow_vs_ranks": "slow step {step} on rank {rank} against the other ranks "
                     "({observed:.1f} ms, {ratio:.1f}x the {reference:.1f} ms their times of that "
                     "step predict)",
}
"""Values of ``captures.trigger_kind``, with how a log line describes each."""
_KIND_CODES = tuple(TRIGGER_KINDS)

MIN_HISTORY = 5
"""Steps in the rolling median before a step is judged against it."""

MAX_STEP_HISTORY = 256
"""At most this many steps before an exchange have their times in its row (``every`` of them
when ``every`` is smaller): the other ranks' basis for ``slow_vs_ranks``."""

BLOCKED_RATE = 1
BLOCKED_DISK = 2
BLOCKED_PROFILER = 4
BLOCKED_REASONS = {BLOCKED_RATE: "budget", BLOCKED_DISK: "disk", BLOCKED_PROFILER: "profiler off"}
"""Why a rank cannot capture now (bits of ``RankReport.blocked``), as counted in ``not_captured``."""


@dataclass(frozen=True)
class Watch:
    """``stepscope.profile(..., watch=Watch(...))``: watch every step, capture the slow ones.

    ``slow_factor``, ``min_slow_ms``, ``warmup_steps``: a step is slow when it takes more than
    ``slow_factor`` times the rolling median of the rank's last ``window`` steps and at least
    ``min_slow_ms`` more, from step ``warmup_steps`` on. ``every``: ranks exchange a few numbers
    (an all-gather over a side gloo group) every ``every`` steps; a local trigger is acted on at
    the next exchange, so it is also the worst-case delay, in steps, before a capture starts.
    ``capture_steps``: steps recorded per capture, after ``capture_warmup`` profiler warm-up
    steps. ``max_per_hour``: captures per rolling hour (0: detect and count only);
    ``disk_budget_mb``: no capture starts once any rank's partitions of the run (and the traces
    it keeps in ``trace_dir``) hold this much. ``timeout_s`` bounds every wait on other ranks: a
    rank that dies or hangs turns the watch off (one warning), never the training.
    """

    slow_factor: float = 1.5
    min_slow_ms: float = 5.0
    warmup_steps: int = 10
    every: int = 50
    capture_steps: int = 3
    max_per_hour: int = 4
    window: int = 100
    capture_warmup: int = 1
    disk_budget_mb: float = 2048.0
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        checks = (
            (self.slow_factor > 1, "slow_factor must be > 1"),
            (self.min_slow_ms >= 0, "min_slow_ms must be >= 0"),
            (self.warmup_steps >= 0, "warmup_steps must be >= 0"),
            (self.every >= 1, "every must be >= 1"),
            (self.capture_steps >= 1, "capture_steps must be >= 1"),
            (self.max_per_hour >= 0, "max_per_hour must be >= 0 (0 detects without capturing)"),
            (self.window >= MIN_HISTORY, f"window must be >= {MIN_HISTORY}"),
            (self.capture_warmup >= 0, "capture_warmup must be >= 0"),
            (self.disk_budget_mb > 0, "disk_budget_mb must be > 0"),
            (self.timeout_s > 0, "timeout_s must be > 0"),
        )
        for ok, message in checks:
            if not ok:
                raise UsageError(f"stepscope.Watch: {message}")

    @property
    def step_history(self) -> int:
        """Steps before an exchange whose times each rank sends with it."""
        return min(self.every, MAX_STEP_HISTORY)

    @property
    def min_slow_ns(self) -> int:
        return round(self.min_slow_ms * 1e6)

    def is_slow(self, observed_ns: int, reference_ns: int) -> bool:
        """``observed`` exceeds ``slow_factor`` x ``reference`` and by at least ``min_slow_ms``."""
        return (observed_ns > self.slow_factor * reference_ns
                and observed_ns - reference_ns >= self.min_slow_ns)


def watch_options(watch: Watch | bool | None) -> Watch | None:
    """``profile(watch=...)``: True for the defaults, a ``Watch`` as given, None/False for off."""
    if watch is None or watch is False:
        return None
    if watch is True:
        return Watch()
    if isinstance(watch, Watch):
        return watch
    raise UsageError(f"watch must be True, None or a stepscope.Watch, not {type(watch).__name__}")


@dataclass(frozen=True)
class Trigger:
    """Why a capture was asked for: ``kind`` on ``rank`` at ``step``, ``observed_ns`` against
    ``reference_ns`` (the rolling median, or the other ranks' median for a straggler)."""

    kind: str
    rank: int
    step: int
    observed_ns: int
    reference_ns: int

    @property
    def ratio(self) -> float:
        return self.observed_ns / self.reference_ns if self.reference_ns > 0 else float("inf")

    def describe(self) -> str:
        return TRIGGER_KINDS[self.kind].format(step=self.step, rank=self.rank,
                                               observed=self.observed_ns / 1e6,
                                               reference=self.reference_ns / 1e6, ratio=self.ratio)


class RollingMedian:
    """Median of the last ``size`` values: a FIFO and a sorted list (O(size) memmove per value,
    about a microsecond at the default 100, instead of sorting every step)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._order: deque[int] = deque()
        self._sorted: list[int] = []

    def __len__(self) -> int:
        return len(self._order)

    def add(self, value: int) -> None:
        if len(self._order) == self._size:
            del self._sorted[bisect_left(self._sorted, self._order.popleft())]
        self._order.append(value)
        insort(self._sorted, value)

    @property
    def median(self) -> int | None:
        return _median_of_sorted(self._sorted)


def _median_of_sorted(values: Sequence[int]) -> int | None:
    n = len(values)
    if n == 0:
        return None
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) // 2


class StepDetector:
    """One rank's judge of its own steps (fed only with steps stepscope did not disturb)."""

    def __init__(self, options: Watch, rank: int) -> None:
        self.options = options
        self.rank = rank
        self._median = RollingMedian(options.window)
        self._recent: list[int] = []

    def observe(self, step: int, work_ns: int) -> Trigger | None:
        """Judge step ``step`` (``work_ns`` long) against the median of the steps before it."""
        reference = self._median.median
        self._median.add(work_ns)
        self._recent.append(work_ns)
        if step < self.options.warmup_steps or len(self._median) <= MIN_HISTORY or reference is None:
            return None
        if self.options.is_slow(work_ns, reference):
            return Trigger("slow_step", self.rank, step, work_ns, reference)
        return None

    def take_recent(self) -> int | None:
        """Median of the steps observed since the last call (the straggler check's summary)."""
        recent, self._recent = sorted(self._recent), []
        return _median_of_sorted(recent)


@dataclass(frozen=True)
class RankReport:
    """What one rank contributes to an exchange: a fixed-size row of int64 (``encode``).

    ``history``: the work times of the ``Watch.step_history`` steps up to ``step``, oldest
    first (None for a step without one: profiled, or not judged)."""

    rank: int
    step: int
    trigger: Trigger | None
    recent_ns: int | None
    blocked: int
    history: tuple[int | None, ...] = ()

    _NONE = -1
    """Placeholder for a missing value inside the exchanged row only (never stored)."""

    def encode(self) -> list[int]:
        t = self.trigger
        kind = 0 if t is None else _KIND_CODES.index(t.kind) + 1
        return [self.step, kind, t.step if t else self._NONE, t.observed_ns if t else self._NONE,
                t.reference_ns if t else self._NONE,
                self._NONE if self.recent_ns is None else self.recent_ns, self.blocked,
                *(self._NONE if h is None else h for h in self.history)]

    @classmethod
    def decode(cls, rank: int, row: Sequence[int]) -> RankReport:
        step, kind, t_step, observed, reference, recent, blocked = (int(v) for v in row[:_FIXED])
        trigger = (None if kind == 0 else
                   Trigger(_KIND_CODES[kind - 1], rank, t_step, observed, reference))
        history = tuple(None if v == cls._NONE else v for v in (int(x) for x in row[_FIXED:]))
        return cls(rank, step, trigger, None if recent == cls._NONE else recent, blocked, history)

    def step_time(self, step: int) -> int | None:
        """This rank's time of ``step``, when it is in ``history``."""
        index = step - (self.step - len(self.history) + 1)
        return self.history[index] if 0 <= index < len(self.history) else None


_FIXED = 7
"""Values of a row before its step history."""


def row_length(options: Watch) -> int:
    """The exchanged row's length: the fixed values and ``options.step_history`` step times."""
    return _FIXED + options.step_history


@dataclass(frozen=True)
class Decision:
    """What every rank concludes from one exchange: the trigger to act on (None: nothing slow)
    and why capturing is not possible now (``blocked`` bits of any rank, 0 when it is)."""

    trigger: Trigger | None
    blocked: int

    @property
    def reason_not_captured(self) -> str | None:
        for bit, reason in BLOCKED_REASONS.items():
            if self.blocked & bit:
                return reason
        return None


def straggler_triggers(reports: Sequence[RankReport], options: Watch) -> list[Trigger]:
    """Ranks whose recent median step is slow against the median of the other ranks' (only
    from ``warmup_steps`` on). The median of the others is read off one sorted list per rank
    position, so the check is O(n log n) in the number of ranks."""
    have = sorted((r.recent_ns, r.rank, r.step) for r in reports if r.recent_ns is not None)
    values = [v for v, _, _ in have]
    found = []
    for index, (recent, rank, step) in enumerate(have):
        if step < options.warmup_steps or len(values) < 2:
            continue
        reference = _median_without(values, index)
        if options.is_slow(recent, reference):
            found.append(Trigger("straggler", rank, step, recent, reference))
    return found


def _median_without(values: Sequence[int], index: int) -> int:
    """Median of the sorted ``values`` with the element at ``index`` left out (len >= 2)."""
    m = len(values) - 1

    def at(j: int) -> int:
        return values[j] if j < index else values[j + 1]

    mid = m // 2
    return at(mid) if m % 2 else (at(mid - 1) + at(mid)) // 2


def cross_rank_triggers(reports: Sequence[RankReport], options: Watch) -> list[Trigger]:
    """Steps slow against the other ranks' times of the same step: the basis that a conversion
    running on every rank after the same window, or a loaded machine, disturbs alike in a
    synchronous job, where a rank's own rolling median is disturbed (or inflated).

    A rank's step is slow when it exceeds ``slow_factor`` x its reference, and by
    ``min_slow_ms``: the median of the other ranks' times of that step, scaled by how this rank
    usually compares with them (the median ratio over the steps of the exchange, so that a rank
    that is always slower, a pipeline stage, is not slow for that). In a synchronous job a rank
    that stalls after its collectives is slow at that step and the others wait for it in the
    next one, so the earliest trigger still names the rank where it began.
    """
    found = []
    for report in reports:
        first = report.step - len(report.history) + 1
        against: list[tuple[int, int, int]] = []
        for index, mine in enumerate(report.history):
            others = sorted(t for other in reports if other.rank != report.rank
                            if (t := other.step_time(first + index)) is not None)
            reference = _median_of_sorted(others)
            if mine is not None and reference:
                against.append((first + index, mine, reference))
        if len(against) <= MIN_HISTORY:
            continue
        usual = statistics.median(mine / reference for _, mine, reference in against)
        for step, mine, reference in against:
            expected = round(usual * reference)
            if step >= options.warmup_steps and options.is_slow(mine, expected):
                found.append(Trigger("slow_vs_ranks", rank=report.rank, step=step,
                                     observed_ns=mine, reference_ns=expected))
    return found


def agree(reports: Sequence[RankReport], options: Watch) -> Decision:
    """The decision every rank takes from the same gathered reports.

    The trigger acted on is the earliest (lowest step); among triggers of the same step the most
    severe (largest observed/reference), then the lowest rank. In a synchronous job a straggler's
    delay shows up on the other ranks one step later, as they wait for it in the next collective,
    so "earliest" names the rank where it began.
    """
    candidates = [r.trigger for r in reports if r.trigger is not None]
    candidates += straggler_triggers(reports, options)
    candidates += cross_rank_triggers(reports, options)
    blocked = 0
    for report in reports:
        blocked |= report.blocked
    trigger = min(candidates, key=lambda t: (t.step, -t.ratio, t.rank), default=None)
    return Decision(trigger, blocked)
