"""The watch at run time: judge every step, exchange with the other ranks, open capture windows.

``stepscope.profile`` calls :meth:`Watcher.after_step` at every step boundary on the training
thread, before torch's profiler hears of it, so that a window agreed at the end of step E starts
at step E+1. Outside captures it costs a few comparisons and a rolling-median update per step,
and every ``every`` steps one all-gather of a row of int64 per rank: seven values and the
recent steps' times (docs/WATCH.md).

What is judged is the user's own work: the time from the return of one ``prof.step()`` to the
next call, so stepscope's own time at the boundary (the exchange, where a rank may wait for a
slower one; starting and stopping the profiler, exporting a trace) never counts. Steps that
stepscope disturbs are not judged against the rank's own rolling median, or a capture would slow
the steps after it and trigger the next: profiled steps (profiling slows them by design) are not
judged at all, nor, with ``convert="thread"``, are steps during which the background writer
worked in this process (converting there holds the interpreter for seconds). Steps during which
the writer worked otherwise (the niced child converting a trace: seconds, even minutes for a
large trace; queueing it, writing a table) are judged only on the other basis: at each exchange,
every idle step judged at all is also compared with the other ranks' times of the same step
(``watch.cross_rank_triggers``), which a conversion on every rank after the same window, or a
loaded machine, disturbs alike.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, deque

from torch.profiler import ProfilerAction

from stepscope.collector.capture import (
    CaptureSchedule,
    CaptureWindow,
    DiskBudget,
    RateBudget,
    rank_bytes,
)
from stepscope.collector.exchange import Exchange, open_exchange
from stepscope.collector.faults import FaultPolicy
from stepscope.collector.handler import TraceHandler
from stepscope.collector.watch import (
    BLOCKED_DISK,
    BLOCKED_PROFILER,
    BLOCKED_RATE,
    Decision,
    RankReport,
    StepDetector,
    Trigger,
    Watch,
    agree,
    row_length,
)
from stepscope.collector.worker import HERE

log = logging.getLogger("stepscope.collector")

_IDLE = ProfilerAction.NONE


class Watcher:
    """One rank's watch. ``anomalies`` counts agreed triggers, ``captures`` lists the windows
    opened for them, ``not_captured`` counts the rest by reason (``budget``, ``disk``,
    ``capturing``: a capture was already under way, ``profiler off``); ``enabled`` turns False
    for good when an exchange fails; ``blind_ns`` sums the steps it could not judge at all."""

    def __init__(self, options: Watch, schedule: CaptureSchedule, handler: TraceHandler,
                 exchange: Exchange, disk: DiskBudget, policy: FaultPolicy,
                 profiler_ok: bool = True) -> None:
        self.options = options
        self.schedule = schedule
        self.enabled = True
        self.anomalies = 0
        self.captures: list[CaptureWindow] = []
        self.not_captured: Counter[str] = Counter()
        self.blind_ns = 0
        """Work time of the idle steps judged on no basis (a conversion in this process)."""
        self._handler = handler
        self._exchange = exchange
        self._disk = disk
        self._policy = policy
        self._profiler_ok = profiler_ok
        self._detector = StepDetector(options, exchange.rank)
        self._rate = RateBudget(options.max_per_hour)
        self._solo = exchange.world_size == 1
        self._pending: Trigger | None = None
        self._due = False
        self._resumed_ns: int | None = None
        self._history: deque[tuple[int, int | None]] = deque(maxlen=options.step_history)

    @property
    def rank(self) -> int:
        return self._exchange.rank

    def resumed(self) -> None:
        """The training loop resumes: its next step's work starts now."""
        self._resumed_ns = time.perf_counter_ns()

    def after_step(self, step: int, action: ProfilerAction, end_ns: int | None,
                   during: frozenset[str] = frozenset()) -> bool:
        """Step ``step``, run under ``action``, ended at ``end_ns`` (``perf_counter_ns``) while
        the background writer did ``during`` (``worker.HERE``, ``ELSEWHERE``). True when the
        ranks exchanged at its end."""
        try:
            if action is ProfilerAction.RECORD_AND_SAVE:
                self._label_capture(step)
            if self.enabled:
                return self._watch(step, action, end_ns, during)
        except Exception as exc:  # noqa: BLE001 - never hurt the job
            self.enabled = False
            self._policy.failed(f"watching step {step}", exc)
            if self._policy.strict:
                self._policy.raise_pending()
        return False

    def _watch(self, step: int, action: ProfilerAction, end_ns: int | None,
               during: frozenset[str]) -> bool:
        timed: int | None = None
        if action is _IDLE and end_ns is not None and self._resumed_ns is not None:
            timed = self._judge(step, end_ns - self._resumed_ns, during)
        self._history.append((step, timed))
        if self._solo:
            self._due = self._pending is not None
        elif (step + 1) % self.options.every == 0:
            self._due = True
        # An exchange never runs inside a profiled step (it would appear in the trace); one
        # that falls due there waits for the first idle step, on every rank alike.
        if self._due and action is _IDLE:
            return self._exchange_at(step)
        return False

    def _judge(self, step: int, work_ns: int, during: frozenset[str]) -> int | None:
        """Judge one idle step on the basis its disturbance leaves (see the module's doc); the
        work time the other ranks will judge it by, None when it is judged on no basis."""
        if HERE in during and self._handler.converts_in_process:
            self.blind_ns += work_ns
            return None
        if not during:
            trigger = self._detector.observe(step, work_ns)
            if trigger is not None and self._pending is None:
                self._pending = trigger
        return work_ns

    def _step_history(self, step: int) -> tuple[int | None, ...]:
        """The times of the ``step_history`` steps up to ``step`` (None where not timed), and
        forget them: each is sent once."""
        times = dict(self._history)
        self._history.clear()
        first = step - self.options.step_history + 1
        return tuple(times.get(s) for s in range(first, step + 1))

    def _exchange_at(self, step: int) -> bool:
        report = RankReport(self.rank, step, self._pending, self._detector.take_recent(),
                            self._blocked(), self._step_history(step))
        try:
            rows = self._exchange.all_gather(report.encode())
        except Exception as exc:  # noqa: BLE001 - a peer died or hung: the watch stops, not the job
            self._disable(step, exc)
            return True
        self._pending = None
        self._due = False
        self._act(step, agree([RankReport.decode(rank, row) for rank, row in enumerate(rows)],
                              self.options))
        return True

    def _blocked(self) -> int:
        bits = 0 if self._profiler_ok else BLOCKED_PROFILER
        if not self._rate.allows():
            bits |= BLOCKED_RATE
        if not self._disk.allows(len(self._handler.sources)):
            bits |= BLOCKED_DISK
        return bits

    def _act(self, step: int, decision: Decision) -> None:
        trigger = decision.trigger
        if trigger is None:
            return
        self.anomalies += 1
        reason = "capturing" if self.schedule.busy(step) else decision.reason_not_captured
        if reason is not None:
            self.not_captured[reason] += 1
            log.info("stepscope: %s; not captured (%s)", trigger.describe(), reason)
            return
        window = self.schedule.plan(step, self.options.capture_steps, self.options.capture_warmup,
                                    trigger)
        self._rate.spend()
        self.captures.append(window)
        log.info("stepscope: %s; every rank captures steps %d-%d", trigger.describe(),
                 window.first_step, window.last_step)

    def _label_capture(self, step: int) -> None:
        """Attach the ``captures`` row to the trace the profiler saves after ``step``: the last
        step of the capture window, or the step the run ended in (a capture cut short)."""
        window = self.schedule.recording(step)
        if window is not None:
            self._handler.add_table_for_next_trace(
                "captures", lambda source: window.table(source, step))

    def _disable(self, step: int, exc: Exception) -> None:
        self.enabled = False
        log.warning("stepscope: the watch is off from step %d on: its exchange with the other "
                    "ranks failed (%s: %s); training continues without further captures",
                    step, type(exc).__name__, exc)

    def profiler_failed(self) -> None:
        """This rank's profiler is gone: keep exchanging (so no rank waits for this one), but
        block every capture."""
        self._profiler_ok = False

    def close(self, step: int) -> None:
        """The run ends during step ``step``: a capture cut short is still labelled (the
        profiler saves what it recorded), and the side group is released."""
        self._label_capture(step)
        if self.enabled:
            try:
                self._exchange.close()
            except Exception:  # noqa: BLE001 - exiting anyway
                log.debug("stepscope: releasing the watch's process group failed", exc_info=True)
        log.info("stepscope: rank %d watch: %d anomalies, %d captured, not captured: %s",
                 self.rank, self.anomalies, len(self.captures), dict(self.not_captured) or "none")


def start_watch(options: Watch, schedule: CaptureSchedule, handler: TraceHandler,
                profiler_ok: bool) -> Watcher | None:
    """The watch of this rank, or None (with one warning) when its process group cannot be
    created. Collective under torch.distributed: every rank calls it at the same point."""
    sink = handler.sink
    rank = sink.rank if sink is not None else 0
    try:
        exchange = open_exchange(row_length(options), options.timeout_s, rank)
    except Exception as exc:  # noqa: BLE001 - never hurt the job
        log.warning("stepscope: the watch is off: creating its gloo group failed (%s: %s); "
                    "training continues", type(exc).__name__, exc)
        return None
    if exchange.world_size == 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        log.warning("stepscope: torch.distributed is not initialised, so the watch cannot "
                    "coordinate ranks: it watches and captures rank %d alone", rank)

    def measure() -> int:
        return 0 if sink is None else rank_bytes(sink.store, sink.run, sink.rank, sink.trace_dir)

    disk = DiskBudget(int(options.disk_budget_mb * 1e6), measure)
    return Watcher(options, schedule, handler, exchange, disk, handler.policy,
                   profiler_ok=profiler_ok and sink is not None)
