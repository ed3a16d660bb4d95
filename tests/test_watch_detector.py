"""The watch's rules without a process group: rolling median, slow steps, stragglers, agreement,
capture placement and budgets. Expected values are computed here with ``statistics`` or by hand,
never with the code under test."""

from __future__ import annotations

import random
import statistics

import pytest

from stepscope.collector.watch import (
    BLOCKED_DISK,
    BLOCKED_RATE,
    MIN_HISTORY,
    RankReport,
    RollingMedian,
    StepDetector,
    Trigger,
    Watch,
    _median_without,
    agree,
    cross_rank_triggers,
    row_length,
    straggler_triggers,
    watch_options,
)
from stepscope.errors import UsageError

MS = 1_000_000


def test_rolling_median_matches_statistics_over_the_last_values() -> None:
    rng = random.Random(7)
    for size in (5, 6, 100):
        rolling = RollingMedian(size)
        seen: list[int] = []
        for _ in range(400):
            value = rng.randrange(1, 10**9)
            rolling.add(value)
            seen.append(value)
            # Integer nanoseconds: the mean of the two middle values, rounded down.
            assert rolling.median == int(statistics.median(seen[-size:]) // 1)


def test_one_slow_step_triggers_against_the_median_before_it() -> None:
    rng = random.Random(1)
    options = Watch(slow_factor=1.5, min_slow_ms=5, warmup_steps=10, window=20)
    detector = StepDetector(options, rank=3)
    times = [rng.randrange(19 * MS, 21 * MS) for _ in range(60)]
    times[40] = 35 * MS
    found = [t for step, ns in enumerate(times) if (t := detector.observe(step, ns)) is not None]
    reference = int(statistics.median(times[20:40]) // 1)
    assert found == [Trigger("slow_step", 3, 40, 35 * MS, reference)]


def test_no_trigger_during_warmup_below_the_margin_or_without_history() -> None:
    options = Watch(slow_factor=1.5, min_slow_ms=5, warmup_steps=10, window=20)
    detector = StepDetector(options, rank=0)
    # A 10x step during warm-up, then a 2x step that is only 2 ms slower: neither counts.
    steps = [2 * MS] * 5 + [20 * MS] + [2 * MS] * 10 + [4 * MS] + [2 * MS] * 5
    assert [s for s, ns in enumerate(steps) if detector.observe(s, ns)] == []
    fresh = StepDetector(Watch(warmup_steps=0), rank=0)
    # The first MIN_HISTORY steps only fill the median.
    assert [fresh.observe(s, (100 if s == MIN_HISTORY - 1 else 1) * MS) for s in range(MIN_HISTORY)] \
        == [None] * MIN_HISTORY


def test_recent_median_covers_the_steps_since_the_last_exchange() -> None:
    detector = StepDetector(Watch(), rank=0)
    for step, ns in enumerate([5, 1, 3, 100]):
        detector.observe(step, ns * MS)
    assert detector.take_recent() == 4 * MS  # median of 1, 3, 5, 100
    assert detector.take_recent() is None


def test_options_are_checked() -> None:
    assert watch_options(True) == Watch()
    assert watch_options(None) is None and watch_options(False) is None
    custom = Watch(slow_factor=2, every=5)
    assert watch_options(custom) is custom
    for bad in ({"slow_factor": 1.0}, {"every": 0}, {"capture_steps": 0}, {"max_per_hour": -1},
                {"window": MIN_HISTORY - 1}, {"timeout_s": 0}, {"disk_budget_mb": 0}):
        with pytest.raises(UsageError):
            Watch(**bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        watch_options("yes")  # type: ignore[arg-type]


def test_reports_survive_the_exchange_row() -> None:
    for report in (RankReport(2, 49, Trigger("slow_step", 2, 40, 90 * MS, 20 * MS), 21 * MS, BLOCKED_DISK),
                   RankReport(0, 9, None, None, 0)):
        assert RankReport.decode(report.rank, report.encode()) == report


def _report(rank: int, trigger_step: int | None = None, observed_ms: int = 100, reference_ms: int = 20,
            recent_ms: int | None = 20, blocked: int = 0, step: int = 49) -> RankReport:
    trigger = (None if trigger_step is None
               else Trigger("slow_step", rank, trigger_step, observed_ms * MS, reference_ms * MS))
    return RankReport(rank, step, trigger, None if recent_ms is None else recent_ms * MS, blocked)


def test_the_earliest_slow_step_names_the_rank_where_it_began() -> None:
    """Rank 1 is slow at step 40; rank 0, waiting for it in the next all-reduce, at step 41."""
    decision = agree([_report(0, 41, observed_ms=200), _report(1, 40, observed_ms=120)], Watch())
    assert (decision.trigger.rank, decision.trigger.step, decision.blocked) == (1, 40, 0)
    assert decision.reason_not_captured is None


def test_same_step_goes_to_the_more_severe_then_the_lower_rank() -> None:
    severe = agree([_report(0, 40, observed_ms=60), _report(1, 40, observed_ms=90)], Watch())
    assert severe.trigger.rank == 1
    tie = agree([_report(2, 40), _report(1, 40)], Watch())
    assert tie.trigger.rank == 1


def test_any_blocked_rank_blocks_the_capture_everywhere() -> None:
    decision = agree([_report(0, 40), _report(1, None, blocked=BLOCKED_RATE)], Watch())
    assert decision.trigger is not None and decision.reason_not_captured == "budget"
    assert agree([_report(0, None), _report(1, None)], Watch()) == agree([], Watch())


def test_a_rank_slower_than_the_others_median_is_a_straggler() -> None:
    options = Watch(slow_factor=1.5, min_slow_ms=5, warmup_steps=10)
    reports = [_report(r, recent_ms=ms) for r, ms in enumerate([20, 21, 19, 45, 20])]
    # Rank 3 against the median of the other four (19, 20, 20, 21 -> 20 ms).
    assert straggler_triggers(reports, options) == [Trigger("straggler", 3, 49, 45 * MS, 20 * MS)]
    decision = agree(reports, options)
    assert decision.trigger == Trigger("straggler", 3, 49, 45 * MS, 20 * MS)
    # A local slow step before the exchange is earlier than the straggler (the exchange step).
    reports[0] = _report(0, 44, recent_ms=20)
    assert agree(reports, options).trigger.step == 44
    # Two ranks: each is judged against the other; ranks without steps are left out.
    two = [_report(0, recent_ms=20), _report(1, recent_ms=31), _report(2, recent_ms=None)]
    assert [t.rank for t in straggler_triggers(two, options)] == [1]
    early = [_report(0, recent_ms=20, step=5), _report(1, recent_ms=90, step=5)]
    assert straggler_triggers(early, options) == []


def test_median_without_one_value_matches_brute_force() -> None:
    rng = random.Random(3)
    for n in range(2, 12):
        values = sorted(rng.randrange(100) for _ in range(n))
        for i in range(n):
            rest = values[:i] + values[i + 1:]
            assert _median_without(values, i) == int(statistics.median(rest) // 1)


# ---- capture windows and budgets (torch.profiler's actions, no process group) ---------------


def test_a_capture_window_keeps_clear_of_the_scheduled_one() -> None:
    pytest.importorskip("torch")
    from torch.profiler import ProfilerAction as A

    from stepscope.collector.capture import CaptureSchedule
    from stepscope.collector.options import Schedule

    trigger = Trigger("slow_step", 1, 2, 50 * MS, 10 * MS)
    schedule = CaptureSchedule(Schedule(wait=3, warmup=1, active=2).torch_schedule())
    scheduled = [schedule(s) for s in range(12)]
    assert scheduled[:7] == [A.NONE] * 3 + [A.WARMUP, A.RECORD, A.RECORD_AND_SAVE, A.NONE]
    # Agreed at the end of step 2: steps 3-5 are the scheduled window and 6 its trailing idle
    # step, so the capture (1 warm-up + 3 recorded steps) starts at 7, not 3.
    window = schedule.plan(2, steps=3, warmup=1, trigger=trigger)
    assert (window.warmup_step, window.first_step, window.last_step) == (7, 8, 10)
    assert [schedule(s) for s in range(12)] == scheduled[:7] + [
        A.WARMUP, A.RECORD, A.RECORD, A.RECORD_AND_SAVE, A.NONE]
    assert schedule.busy(9) and not schedule.busy(10)
    assert schedule.recording(7) is None and schedule.recording(10) is window
    # A profiler opened for the capture alone (at the end of step 6) sees only its window.
    assert schedule.starts_after(6) and not schedule.starts_after(5)
    assert [schedule.captures_only(s) for s in range(12)] == [A.NONE] * 7 + [
        A.WARMUP, A.RECORD, A.RECORD, A.RECORD_AND_SAVE, A.NONE]
    # Far from the scheduled window, it starts right after the agreement.
    later = schedule.plan(19, steps=2, warmup=0, trigger=trigger)
    assert (later.warmup_step, later.first_step, later.last_step) == (20, 20, 21)
    assert [schedule(s) for s in (19, 20, 21, 22)] == [A.NONE, A.RECORD, A.RECORD_AND_SAVE, A.NONE]


def test_rate_budget_is_a_rolling_hour_and_disk_is_measured_only_after_a_write() -> None:
    pytest.importorskip("torch")
    from stepscope.collector.capture import DiskBudget, RateBudget

    now = [0.0]
    rate = RateBudget(2, clock=lambda: now[0])
    assert rate.allows()
    rate.spend()
    now[0] = 1800.0
    rate.spend()
    assert not rate.allows()
    now[0] = 3600.0  # the first capture is an hour old
    assert rate.allows()
    assert not RateBudget(0).allows()

    sizes = iter([10, 500, 2000])
    calls: list[int] = []

    def measure() -> int:
        calls.append(1)
        return next(sizes)

    disk = DiskBudget(1000, measure)
    assert disk.allows(0) and disk.allows(0) and len(calls) == 1
    assert disk.allows(1) and not disk.allows(2) and not disk.allows(2)
    assert len(calls) == 3


def test_reports_with_their_step_history_survive_the_exchange_row() -> None:
    history = (None, 6 * MS, 256 * MS, 0)
    report = RankReport(1, 39, None, 6 * MS, 0, history)
    row = report.encode()
    assert len(row) == 7 + len(history)
    assert RankReport.decode(1, row) == report
    assert [report.step_time(s) for s in (35, 36, 37, 38, 39, 40)] == [None, *history, None]
    assert row_length(Watch(every=10)) == 17 and row_length(Watch(every=1000)) == 7 + 256


def _timed(rank: int, times_ms: list[float], step: int = 39) -> RankReport:
    """A rank's report whose history holds ``times_ms`` for the steps up to ``step``."""
    return RankReport(rank, step, None, None, 0, tuple(round(t * MS) for t in times_ms))


def test_a_stall_names_the_rank_where_it_began_against_the_other_ranks() -> None:
    """DDP: rank 1 sleeps 250 ms after its collectives at step 35, rank 0 waits for it in step
    36's all-reduce (both ranks' traces being converted, neither judged its own steps)."""
    rng = random.Random(3)
    rank0 = [rng.uniform(5.5, 7.5) for _ in range(10)]
    rank1 = [rng.uniform(5.5, 7.5) for _ in range(10)]
    rank1[5] += 250  # step 30 + 5
    rank0[6] += 250
    options = Watch(slow_factor=2, min_slow_ms=150, warmup_steps=10, every=10)
    reports = [_timed(0, rank0), _timed(1, rank1)]
    usual = statistics.median(a / b for a, b in zip((round(t * MS) for t in rank1),
                                                    (round(t * MS) for t in rank0)))
    expected = round(usual * round(rank0[5] * MS))
    found = cross_rank_triggers(reports, options)
    assert Trigger("slow_vs_ranks", 1, 35, round(rank1[5] * MS), expected) in found
    assert {(t.rank, t.step) for t in found} == {(1, 35), (0, 36)}
    decision = agree(reports, options)
    assert (decision.trigger.kind, decision.trigger.rank, decision.trigger.step) == (
        "slow_vs_ranks", 1, 35)


def test_no_cross_rank_trigger_for_a_rank_that_is_always_slower_or_a_slow_machine() -> None:
    options = Watch(slow_factor=1.5, min_slow_ms=5, warmup_steps=0, every=10)
    # A pipeline stage twice as slow as the other at every step.
    assert cross_rank_triggers([_timed(0, [10] * 10), _timed(1, [20] * 10)], options) == []
    # The whole machine slows every rank 5x for two steps (what the rolling median would flag).
    loaded = [10] * 4 + [50, 50] + [10] * 4
    assert cross_rank_triggers([_timed(0, loaded), _timed(1, loaded)], options) == []
    stalled = [10] * 5 + [300] + [10] * 4
    assert cross_rank_triggers([_timed(0, [10] * 10), _timed(1, stalled)], options) == [
        Trigger("slow_vs_ranks", 1, 35, 300 * MS, 10 * MS)]
    # Steps not judged (None) are not compared; before warmup_steps, or with too few steps to
    # know how the ranks usually compare: nothing.
    assert cross_rank_triggers([_timed(0, [10] * 10),
                                RankReport(1, 39, None, None, 0, (10 * MS,) * 5 + (None,) * 5)],
                               options) == []
    assert cross_rank_triggers([_timed(0, [10] * 10), _timed(1, stalled)],
                               Watch(warmup_steps=40, every=10)) == []
    assert cross_rank_triggers([_timed(0, [10] * 3), _timed(1, [10, 300, 10])], options) == []


def test_writer_activity_between_two_moments() -> None:
    from stepscope.collector.worker import ELSEWHERE, HERE, IDLE, Activity

    idle = Activity(3, 5, 2, IDLE)
    assert idle.during(Activity(3, 5, 2, IDLE)) == frozenset()
    assert idle.during(Activity(4, 5, 2, IDLE)) == {HERE}  # a job was queued meanwhile
    assert idle.during(Activity(3, 6, 2, IDLE)) == {HERE}  # one ran and finished meanwhile
    assert idle.during(Activity(3, 5, 2, ELSEWHERE)) == {ELSEWHERE}
    assert Activity(3, 5, 3, ELSEWHERE).during(Activity(3, 5, 3, ELSEWHERE)) == {ELSEWHERE}
    assert Activity(3, 5, 3, ELSEWHERE).during(Activity(3, 6, 3, HERE)) == {HERE, ELSEWHERE}
