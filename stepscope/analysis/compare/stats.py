"""Small, dependency-free statistics for the regression gate: spread and Mann-Whitney U.

Why not scipy: it is a heavy dependency for two formulas, and the gate must give the same answer
on every machine. Everything here is exact arithmetic on Python floats, no randomness.

The Mann-Whitney U test asks whether values drawn from one run tend to be larger than values
drawn from the other, without assuming a distribution (step times are skewed and have outliers).
For small samples without ties the p-value is exact (the distribution of U is counted by dynamic
programming); otherwise the normal approximation with tie and continuity corrections is used
(the same approximation as ``scipy.stats.mannwhitneyu(method="asymptotic")``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from stepscope.analysis.quantiles import median, quantile

EXACT_MAX_N = 50
"""Below this many values per side (and without ties) the p-value is exact, not approximated."""


@dataclass(frozen=True)
class Spread:
    """Median and spread of a sample: quartiles (linear interpolation), extremes and size."""

    n: int
    median: float
    p25: float
    p75: float
    min: float
    max: float

    def to_json(self) -> dict[str, float | int]:
        return {"n": self.n, "median": self.median, "p25": self.p25, "p75": self.p75,
                "min": self.min, "max": self.max}


def spread(values: Sequence[float]) -> Spread:
    """Median, quartiles and extremes of ``values`` (at least one), by the one quantile rule of
    :mod:`stepscope.analysis.quantiles` (an even count's median is the mean of the middle two)."""
    s = sorted(values)
    return Spread(len(s), median(s), quantile(s, 0.25), quantile(s, 0.75), s[0], s[-1])


@dataclass(frozen=True)
class MannWhitney:
    """Result of a one-sided Mann-Whitney U test that ``y`` tends to exceed ``x``.

    ``u`` counts the pairs (x_i, y_j) with y_j > x_i (ties count one half); ``p_value`` is the
    one-sided p-value of that count under "same distribution"; ``method`` is ``exact`` or
    ``normal``; ``min_p`` is the smallest p-value these sample sizes can ever give (when it is
    above the significance level, the test cannot detect anything and says so).
    """

    n_x: int
    n_y: int
    u: float
    p_value: float
    method: str
    min_p: float


def _ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Mid-ranks (1-based, ties get their average rank) and the sizes of the tie groups."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    ties: list[int] = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        rank = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[order[k]] = rank
        ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


def _exact_upper_tail(n_x: int, n_y: int, u: int) -> float:
    """P(U >= u) under "same distribution", counted exactly.

    The number of arrangements of the two samples with U = k is the coefficient of q^k in the
    Gaussian binomial [n_x + n_y choose n_y]_q = prod_{i=1..n_y} (1 - q^(n_x+i)) / (1 - q^i):
    integer polynomial products and exact divisions, O(n_y * n_x * n_y) operations.
    """
    poly = [1]
    for i in range(1, n_y + 1):
        shift = n_x + i
        grown = poly + [0] * shift
        for k in range(len(grown) - 1, shift - 1, -1):
            grown[k] -= grown[k - shift]
        # Divide by (1 - q^i): r[k] = grown[k] + r[k - i]; the division is exact.
        for k in range(i, len(grown)):
            grown[k] += grown[k - i]
        poly = grown[: len(grown) - i]
    return sum(poly[u:]) / math.comb(n_x + n_y, n_x)


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> MannWhitney:
    """One-sided Mann-Whitney U test of "y tends to be larger than x" (both non-empty)."""
    n_x, n_y = len(x), len(y)
    if n_x == 0 or n_y == 0:
        raise ValueError("Mann-Whitney needs values on both sides")
    ranks, ties = _ranks([*x, *y])
    rank_sum_y = sum(ranks[n_x:])
    u = rank_sum_y - n_y * (n_y + 1) / 2
    min_p = 1 / math.comb(n_x + n_y, n_x)
    if max(n_x, n_y) <= EXACT_MAX_N and all(t == 1 for t in ties):
        return MannWhitney(n_x, n_y, u, _exact_upper_tail(n_x, n_y, int(u)), "exact", min_p)
    n = n_x + n_y
    mean = n_x * n_y / 2
    tie_term = sum(t**3 - t for t in ties) / (n * (n - 1))
    var = n_x * n_y / 12 * ((n + 1) - tie_term)
    if var <= 0:  # every value equal: nothing differs
        return MannWhitney(n_x, n_y, u, 1.0, "normal", min_p)
    z = (u - mean - 0.5) / math.sqrt(var)
    return MannWhitney(n_x, n_y, u, 0.5 * math.erfc(z / math.sqrt(2)), "normal", min_p)


def mann_whitney_less(x: Sequence[float], y: Sequence[float]) -> MannWhitney:
    """One-sided test of "y tends to be smaller than x" (the mirror of :func:`mann_whitney_greater`)."""
    return mann_whitney_greater([-v for v in x], [-v for v in y])


MIN_NOISE = 0.02
"""Smallest run-to-run noise of a timed metric, as a fraction of the baseline's value: three runs
can agree by chance more closely than runs of that code do (2 %: a quiet machine's spread)."""

UNSEEN_NOISE = 0.05
"""Run-to-run noise a timed metric is assumed to have when neither side has two runs to measure
it (5 % of the baseline's value); the gate says it assumed it."""


LOAD_INFLATION = 0.9
"""How much more CPU time the training thread can use for the same code when other processes
take its core, as a fraction: after each preemption its caches refill, and at a high load every
step is preempted. Measured on this project's 2-core machine (20-step runs of one unchanged
3 ms loop, with 0 to 3 busy processes and other jobs; docs/ci.md): a run's median step CPU time
reached 1.86x that of the least disturbed run. The gate assumes no more than this."""

LOAD_FULL = 1.5
"""The :class:`Load` (wall over CPU time) from which the full :data:`LOAD_INFLATION` is assumed;
below it the assumed inflation falls linearly to 0 at 1.0 (a thread that never waited for a core
was never preempted). On the machine above, runs at 1.1-1.4 were already inflated by up to 48 %."""


LOAD_CEILING = 6.0
"""The :class:`Load` (a run's median step wall time over its median step CPU time) from which the
gate no longer trusts :data:`LOAD_INFLATION`: a side with a run that loaded is too loaded to judge
in the direction its load could fake (:func:`stepscope.analysis.compare.gate.evaluate_budget`).
Measured on this project's 2-core machine at a load average of 7.5-8 (one unchanged MLP step,
30 000 steps of 0.6, 1.3 and 3.3 ms, each preempted step against the same run's unpreempted
ones): the median preempted step's CPU time was 1.13-1.56x its unpreempted one where the step
took under 3x its CPU time in wall time, 1.41-1.80x at 3-6x, and 1.92x for the 0.6 ms step at
6-12x, already past the 1.9x allowed (its 90th percentile 2.9x). Past 6x the allowance is a
guess, and safety against a false alarm would rest on it alone: every run loaded past
:data:`LOAD_FULL` makes the runs' intervals overlap, so the noise margin falls to its 2 % floor."""

LOAD_INFLATION_PAST_CEILING = 1.2
"""What a side with a run past :data:`LOAD_CEILING` is allowed instead of :data:`LOAD_INFLATION`
(2.2x). Past 6x the measurements are few and scattered: in bench_gate's "quiet" condition of
2026-12-03 (load average 8-11, runs of one MLP at 1.0-12x), the median step CPU time of the 14
runs past 6x reached 2.04x that of the five least loaded runs of the same code (the runs under
6x: 2.00x); single preempted steps went further (the 0.6 ms step's 90th percentile 2.9x at 6-12x,
the longer ones' under 1.95x, all of them under 2.2x past 12x), but a run's median, which the
gate judges, moves less than its steps. Within 2.2x a slowdown of 4x is still caught, and
unchanged code would have to measure 2.42x its baseline to fail; what the usual allowance would
have decided and this one does not is "too loaded to judge"."""


BUSY_LOAD = 1.05
"""A baseline run whose preempted steps took this many times their CPU time in wall time or more
(the median over those steps; a run without the count: its load as a whole) was recorded while
other processes kept the machine busy, and then its whole side is allowed the full
:data:`LOAD_INFLATION`, its unpreempted steps' CPU time included (:attr:`Load.baseline_inflation`).

Why: in a busy spell CPU time grows without preemption too (a neighbour on the other core shares
the caches and the memory bus). In ``bench_gate.py``'s plugin part of 2026-12-04 (343 runs of one
MLP at three sizes on this project's 2-core machine, beside another session's tests), runs whose
preempted steps took 1.05-1.2x their CPU time measured up to 1.76x the 10th percentile of their
size's runs, where the per-step rule allows 9-36 %; a baseline saved in such a spell was allowed
24 % on 2.98 ms for code whose unchanged runs took 2.05-2.28 ms, and a 1.3x slowdown that
measured 2.43 ms against it passed (3 of 20). Only the baseline: a larger allowance there only
widens the upper bound, so it can turn a pass into "cannot tell", never make a regression; on the
candidate's side it would hide slowdowns. A threshold, not a bound: runs under it (151 of the 343)
reached 1.97x too, and a baseline none of whose runs waited, recorded beside one busy process, is
allowed only its per-step bound (docs/ci.md). A run on which the rest of the machine was
measured quiet (:data:`QUIET_OTHERS`) is never busy, whatever its preempted steps took."""

QUIET_OTHERS = 0.4
"""A run on which the rest of the machine (every process but the training one) used less CPU
than this many CPUs' worth (:attr:`Preemption.others`, from ``step_times.others_cpu_ns``) was
measured quiet: it is allowed only what its preempted steps allow (:func:`preemption`), never the
blanket of :data:`BUSY_LOAD`, whatever its preempted steps took.

Measured on this project's 2-core machine (``bench_gate.py --others 0,1,2``, 20 runs of the
unchanged MLP each, 2026-12-04, nothing else running): with no busy process the others used
0.00-0.23 CPUs (the kernel, tick rounding of runs of ~0.1 s), 9 of its 20 runs "recorded busy"
by the preemption rule alone; with one busy process 0.64-1.07 CPUs, with two 0.92-1.38. 0.4 lies in
the gap, a tick's rounding away from either side."""


@dataclass(frozen=True)
class Preemption:
    """A run's steps as other processes left them, from each step's involuntary context switches
    (``step_times.preemptions``): ``preempted`` of its ``steps`` lost the core at least once, and
    its median step CPU time may be up to ``inflation`` too high (:func:`preemption`)."""

    steps: int
    preempted: int
    inflation: float
    load: float = 1.0
    """The median over the run's steps of each preempted step's wall over CPU time (1.0 for a step
    never preempted): the run's load as other processes made it, which :data:`LOAD_CEILING` is
    held against (a step that waited of its own accord, on I/O or a lock, is no load)."""
    preempted_load: float = 1.0
    """The median over the preempted steps alone of their wall over CPU time (1.0 when none was
    preempted): whether other processes kept this run waiting at all, which
    :data:`BUSY_LOAD` is held against for a baseline run."""
    others: float | None = None
    """How many CPUs' worth of work the rest of the machine did while the run's steps were timed:
    their ``others_cpu_ns`` over their wall time, summed over the steps (a step's own value is
    counted in 10 ms ticks, a run's sum is exact to a few); None where the run did not record it."""

    @property
    def quiet(self) -> bool:
        """The rest of the machine was measured quiet during this run (:data:`QUIET_OTHERS`)."""
        return self.others is not None and self.others < QUIET_OTHERS

    def to_json(self) -> dict[str, float | int | None]:
        return {"steps": self.steps, "preempted": self.preempted, "inflation": self.inflation, "load": self.load,
                "others": self.others}


def preemption(cpu: Sequence[float], wall: Sequence[float], switches: Sequence[float],
               others: Sequence[float] | None = None) -> Preemption:
    """How much a run's median step CPU time may be too high, judged step by step: a step that no
    other thread or process preempted ran alone on its core, so load did not inflate its CPU
    time; a preempted step's may be up to :func:`inflation_at` its own wall over CPU time (the run-level
    rule of :class:`Load`, applied to the steps it holds for). The run's true median lies between
    the median of its steps so deflated and its measured median (a median never moves against its
    values), so the inflation is their ratio less one: 0 when no step was preempted, the run-level
    bound when every step waited that long, in between otherwise. Unlike the run's wall over CPU
    time, it does not count the waits the thread chose (a lock, the interpreter's GIL held by
    another thread of the process) as load: those do not inflate CPU time. ``others``: each
    step's ``others_cpu_ns``, where recorded (:attr:`Preemption.others`)."""
    loads = [w / c if n > 0 and c > 0 else 1.0 for c, w, n in zip(cpu, wall, switches)]
    low = median([c / (1.0 + inflation_at(load)) for c, load in zip(cpu, loads)])
    preempted = [load for load, n in zip(loads, switches) if n > 0]
    total_wall = sum(wall)
    return Preemption(len(cpu), len(preempted), median(list(cpu)) / low - 1.0 if low > 0 else 0.0, median(loads),
                      median(preempted) if preempted else 1.0,
                      None if others is None or total_wall <= 0 else max(0.0, sum(others) / total_wall))


@dataclass(frozen=True)
class Load:
    """How busy the machine was during each run, as the training thread felt it: a run's median
    step wall time over its median step CPU time (1.0: the thread never waited for a core; 3.0:
    its steps took three times the CPU they used).

    CPU time is the measure load moves least, not a measure load cannot move: a run that lost its
    core to other processes measures more CPU time for the same code, and runs in one busy spell
    agree with each other, so their spread does not show it. Load only ever adds CPU time (a
    preempted thread refills its caches; a sibling hyperthread halves its throughput), never takes
    it away. So the gate bounds each side by its own most inflated run: a side's value may be up to
    its ``*_inflation`` too high, never too low
    (:func:`stepscope.analysis.compare.gate.change_bounds`). A loaded candidate can then still show
    a regression's lower bound, and a loaded baseline a pass's upper bound, only wider.

    A run that recorded each step's preemptions (``*_preemption``) is bounded by its preempted
    steps (:func:`preemption`): the wall over CPU time of a whole run also counts waits that do not
    inflate CPU time (the collector's writer thread holding the GIL), and steps that no other
    process preempted; a run without them by its load (:func:`inflation_at`).
    """

    baseline: tuple[float, ...]
    candidate: tuple[float, ...]
    baseline_preemption: tuple[Preemption | None, ...] = ()
    """Per baseline run, its steps' :class:`Preemption` where it recorded them (None, or a
    shorter tuple, where not: a store written before ``step_times.preemptions``)."""
    candidate_preemption: tuple[Preemption | None, ...] = ()
    ceiling: float = LOAD_CEILING
    """The :data:`LOAD_CEILING` these runs are held against (``math.inf``: none, what the
    allowance alone would allow, :func:`stepscope.analysis.compare.gate.evaluate_budget`)."""

    @property
    def worst(self) -> float:
        """The highest load of any run of either side."""
        return max((*self.baseline, *self.candidate))

    @property
    def inflation(self) -> float:
        """The most either side's CPU time may have been inflated, as a fraction (0 when no run waited)."""
        return max(self.baseline_inflation, self.candidate_inflation)

    @property
    def baseline_inflation(self) -> float:
        """How much the baseline's CPU time may be too high: its most inflated run's
        (:func:`run_inflations`), the full :data:`LOAD_INFLATION` when it was recorded busy
        (:attr:`baseline_busy`), or :data:`LOAD_INFLATION_PAST_CEILING` when a run of it is past
        the ceiling."""
        allowed = max(run_allowances(self.baseline, self.baseline_preemption, self.ceiling))
        return max(allowed, LOAD_INFLATION) if self.baseline_busy else allowed

    @property
    def baseline_busy(self) -> bool:
        """A baseline run was kept waiting by other processes (:data:`BUSY_LOAD`) and not measured
        quiet (:data:`QUIET_OTHERS`): the machine was busy while the baseline recorded, so its
        unpreempted steps may be inflated too."""
        return any(busy_runs(self.baseline, self.baseline_preemption))

    @property
    def candidate_inflation(self) -> float:
        """How much the candidate's CPU time may be too high: its most inflated run's
        (:func:`run_inflations`), or :data:`LOAD_INFLATION_PAST_CEILING` when a run of it is past
        the ceiling."""
        return max(self.candidate_allowances)

    @property
    def candidate_allowances(self) -> tuple[float, ...]:
        """Each candidate run's own bound on how much too high its CPU time may be
        (:func:`run_allowances`)."""
        return tuple(run_allowances(self.candidate, self.candidate_preemption, self.ceiling))

    @property
    def baseline_too_loaded(self) -> bool:
        """A baseline run reached the ceiling (:func:`ceiling_loads`): its CPU time may be
        inflated past :data:`LOAD_INFLATION`."""
        return max(ceiling_loads(self.baseline, self.baseline_preemption)) >= self.ceiling

    @property
    def candidate_too_loaded(self) -> bool:
        """A candidate run reached the ceiling (:func:`ceiling_loads`): its CPU time may be
        inflated past :data:`LOAD_INFLATION`."""
        return max(ceiling_loads(self.candidate, self.candidate_preemption)) >= self.ceiling

    @property
    def by_preemption(self) -> bool:
        """Every run's bound came from its preempted steps (else some, or all, from its load)."""
        return all(p is not None for p in (*_each_run(self.baseline, self.baseline_preemption),
                                            *_each_run(self.candidate, self.candidate_preemption)))

    def to_json(self) -> dict[str, object]:
        def side(loads: tuple[float, ...], found: tuple[Preemption | None, ...]) -> list[object]:
            return [None if p is None else p.to_json() for p in _each_run(loads, found)]

        return {"baseline": list(self.baseline), "candidate": list(self.candidate), "worst": self.worst,
                "inflation": self.inflation, "baseline_inflation": self.baseline_inflation,
                "candidate_inflation": self.candidate_inflation, "baseline_busy": self.baseline_busy,
                "by_preemption": self.by_preemption,
                "ceiling": self.ceiling, "baseline_too_loaded": self.baseline_too_loaded,
                "candidate_too_loaded": self.candidate_too_loaded,
                "baseline_preemption": side(self.baseline, self.baseline_preemption),
                "candidate_preemption": side(self.candidate, self.candidate_preemption)}


def _each_run(loads: Sequence[float], found: Sequence[Preemption | None]) -> list[Preemption | None]:
    """``found`` lined up with ``loads``: None for each run past its end."""
    return [found[i] if i < len(found) else None for i in range(len(loads))]


def run_inflations(loads: Sequence[float], found: Sequence[Preemption | None]) -> list[float]:
    """Each run's bound on how much too high its CPU time may be: its steps' :class:`Preemption`
    where it recorded them, else :func:`inflation_at` its load."""
    return [inflation_at(load) if p is None else p.inflation for load, p in zip(loads, _each_run(loads, found))]


def run_allowances(loads: Sequence[float], found: Sequence[Preemption | None], ceiling: float) -> list[float]:
    """Each run's own bound on how much too high its CPU time may be (:func:`run_inflations`), at
    least :data:`LOAD_INFLATION_PAST_CEILING` for a run at or past ``ceiling`` (:func:`ceiling_loads`)."""
    return [max(f, LOAD_INFLATION_PAST_CEILING) if load >= ceiling else f
            for f, load in zip(run_inflations(loads, found), ceiling_loads(loads, found))]


def busy_loads(loads: Sequence[float], found: Sequence[Preemption | None]) -> list[float]:
    """Each run's load as :data:`BUSY_LOAD` judges it: its preempted steps' median wall over CPU
    time where it counted them (:attr:`Preemption.preempted_load`), else its load as a whole."""
    return [load if p is None else p.preempted_load for load, p in zip(loads, _each_run(loads, found))]


def busy_runs(loads: Sequence[float], found: Sequence[Preemption | None]) -> list[bool]:
    """Whether each run was recorded busy: its :func:`busy_loads` at :data:`BUSY_LOAD` or more,
    unless the rest of the machine was measured quiet during it (:attr:`Preemption.quiet`); a
    run without the measure (recorded before ``step_times.others_cpu_ns``) by its load alone."""
    return [load >= BUSY_LOAD and not (p is not None and p.quiet)
            for load, p in zip(busy_loads(loads, found), _each_run(loads, found))]


def ceiling_loads(loads: Sequence[float], found: Sequence[Preemption | None]) -> list[float]:
    """Each run's load as :data:`LOAD_CEILING` judges it: its preempted steps' (:attr:`Preemption.load`)
    where it counted them, else its load as a whole (as :func:`run_inflations` does)."""
    return [load if p is None else p.load for load, p in zip(loads, _each_run(loads, found))]


def inflation_at(load: float) -> float:
    """The fraction by which a run at ``load`` (wall over CPU time) may have had its CPU time
    inflated: :data:`LOAD_INFLATION` from :data:`LOAD_FULL` on, falling linearly to 0 at 1.0."""
    return LOAD_INFLATION * min(1.0, max(0.0, load - 1.0) / (LOAD_FULL - 1.0))


def run_load(wall: Sequence[float], cpu: Sequence[float]) -> tuple[float, ...]:
    """Each run's :class:`Load` value from its median step wall and CPU times (a run whose CPU
    time is 0 counts as unloaded: nothing ran to be disturbed)."""
    return tuple(w / c if c > 0 else 1.0 for w, c in zip(wall, cpu))


@dataclass(frozen=True)
class Noise:
    """How much a metric moves between runs of the same code, as far as these runs show.

    ``spread`` is the larger range (max - min) of the per-run values on either side (None when
    neither side has two runs: not measured). ``unexplained`` is the part of it that the runs'
    load allowances do not explain (:func:`unexplained_range`; the spread itself without a
    ``load``). ``margin`` is what the candidate's value may be off by, either way: ``unexplained``,
    at least :data:`MIN_NOISE` of the baseline for a timed metric, or :data:`UNSEEN_NOISE` of it
    when not measured. ``load`` (a step time in CPU time only) adds, for each side, the fraction by
    which its value may be too high (:class:`Load`).
    """

    baseline_runs: int
    candidate_runs: int
    spread: float | None
    margin: float
    load: Load | None = None
    unexplained: float | None = None

    @property
    def measured(self) -> bool:
        return self.spread is not None

    @property
    def baseline_inflation(self) -> float:
        """How much the load may have inflated the baseline's value (0 without a load)."""
        return 0.0 if self.load is None else self.load.baseline_inflation

    @property
    def candidate_inflation(self) -> float:
        """How much the load may have inflated the candidate's value (0 without a load)."""
        return 0.0 if self.load is None else self.load.candidate_inflation

    def to_json(self) -> dict[str, object]:
        return {"baseline_runs": self.baseline_runs, "candidate_runs": self.candidate_runs,
                "measured": self.measured, "spread": self.spread, "unexplained_spread": self.unexplained,
                "margin": self.margin, "load": None if self.load is None else self.load.to_json()}


def unexplained_range(values: Sequence[float], inflations: Sequence[float]) -> float:
    """How far apart a side's runs are beyond what their load allowances explain.

    Load only inflates a run's value, by up to its allowance ``f``, so each run says its code's
    true value lies between ``value / (1 + f)`` and ``value``, give or take the noise that load
    does not cause. Where these intervals overlap, the runs agree once the load is allowed for;
    where they do not, the gap (the highest lower end over the lowest value) is noise the load
    cannot account for, and the gate must allow it. Without load (every ``f`` 0) each interval is
    a point and the gap is the plain range, so a quiet machine's noise is measured as before.

    Why not the plain range under load: it counts the load twice. The bounds already allow each
    side's most inflated run its whole allowance (:func:`~stepscope.analysis.compare.gate.change_bounds`),
    and runs that one busy spell inflated by different amounts have a range made of that same
    inflation: on this project's 2-core machine a baseline saved under load spread by 61 % of
    its median, which hid a 4x slowdown (docs/ci.md). And the plain range of a side grows with
    every run the pytest plugin adds to a grey result, so re-running widened the margin instead
    of narrowing the doubt; the unexplained part grows only with runs the load does not explain.
    """
    lows = [v / (1.0 + f) for v, f in zip(values, inflations)]
    return max(0.0, max(lows) - min(values))


def run_noise(base: Sequence[float], cand: Sequence[float], *, timed: bool, load: Load | None = None) -> Noise:
    """The :class:`Noise` of a metric from its per-run values (each side at least one);
    ``timed``: a time or a rate measured from times, which the machine's load moves; ``load``:
    each run's load, for a step time measured in CPU time (its allowances shrink the measured
    spread to the part they do not explain, :func:`unexplained_range`)."""
    if load is None:
        allowed = ((base, [0.0] * len(base)), (cand, [0.0] * len(cand)))
    else:
        allowed = ((base, run_inflations(load.baseline, load.baseline_preemption)),
                   (cand, run_inflations(load.candidate, load.candidate_preemption)))
    sides = [(side, inflations) for side, inflations in allowed if len(side) >= 2]
    spread = max((max(side) - min(side) for side, _ in sides), default=None)
    unexplained = max((unexplained_range(side, f) for side, f in sides), default=None)
    reference = abs(median(list(base)))
    if not timed:
        return Noise(len(base), len(cand), spread, spread or 0.0, unexplained=unexplained)
    margin = UNSEEN_NOISE * reference if unexplained is None else max(unexplained, MIN_NOISE * reference)
    return Noise(len(base), len(cand), spread, margin, load, unexplained)
