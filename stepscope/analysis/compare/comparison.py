"""A baseline and a candidate side by side: every metric with its spread, deltas and run-to-run
noise; per-name diffs.

Each side is one run or several runs of the same code (a baseline keeps its last few runs; the
pytest plugin re-runs a test in the grey zone). A metric's value on a side is the median of its
per-run values (each run's median per step, or its highest peak), so one disturbed run cannot
move it far, and the spread of the per-run values is the run-to-run noise
(:class:`~stepscope.analysis.compare.stats.Noise`). The steps of one run are not independent
samples of that noise: on a loaded machine every step of a run moves together, so a test over
the steps of one run would claim a confidence it does not have; the Mann-Whitney U test here is
over the per-run values, and says when there are too few runs for it to mean anything.

:func:`compare_profiles` is pure (profiles in, a :class:`Comparison` out) so the
statistics can be tested on hand-made profiles; :func:`compare_runs` reads the profiles from
stores first. Budgets are judged afterwards by :mod:`stepscope.analysis.compare.gate`: the
comparison is data, the gate is the decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from stepscope.analysis.absent import Absent, Maybe
from stepscope.analysis.compare.budgets import COPY_DIRECTIONS
from stepscope.analysis.compare.comparability import Check, comparability
from stepscope.analysis.compare.snapshots import compare_snapshots
from stepscope.analysis.compare.metrics import (
    CPU_TIME_SOURCE,
    OTHERS,
    PREEMPTIONS,
    RunFacts,
    NamedStat,
    RunProfile,
    run_profile,
    step_measures,
    step_source,
)
from stepscope.analysis.compare.stats import (
    MannWhitney,
    Load,
    Noise,
    Preemption,
    Spread,
    mann_whitney_greater,
    mann_whitney_less,
    preemption,
    run_load,
    run_noise,
    spread,
)
from stepscope.analysis.findings import Finding, Severity
from stepscope.analysis.quantiles import median
from stepscope.store.rankstats.parts import GPU, HOST
from stepscope.analysis.sections import SQLStore
from stepscope.units import format_value, signed_percent

BANDWIDTH_METRICS: tuple[tuple[str, str, str], ...] = (
    ("busbw", "bus bandwidth", "comm.collective_kernels.busbw_gbps (per step)"),
    ("copy_bandwidth", "copy bandwidth", "copies.copy_summary.bandwidth_gbps (per step)"),
    *((f"copy_bandwidth_{d}", f"{d.upper()} copy bandwidth", f"copies.copy_summary.bandwidth_gbps (per step, {d})")
      for d in COPY_DIRECTIONS),
)
"""(metric, label, source) of the bandwidth metrics, after the peak memory. Per rank and step."""

ALPHA = 0.05
"""Significance level of the Mann-Whitney U test over the per-run values (reported beside each
metric; the gate decides on the noise margin, :mod:`~stepscope.analysis.compare.gate`)."""

NOTABLE_PCT = 5.0
"""A metric change is reported as a finding from this relative size on (and only when it is
larger than the run-to-run noise margin)."""

KERNEL_NOTABLE_PCT = 10.0
KERNEL_NOTABLE_SHARE = 0.01
"""A kernel's change is a finding when it moves by 10 % or more of its own time and by at least
1 % of the baseline's median step time (smaller kernels cannot move the step)."""


@dataclass(frozen=True)
class MetricDelta:
    """One metric of both sides. ``statistic`` says which summary of a run's per-step values is
    its per-run value (``median``; ``max`` for the peak memory); a side's value is the median of
    its per-run values."""

    metric: str
    label: str
    unit: str
    statistic: str
    baseline: Maybe[Spread]
    """Spread of the per-step values, every run of the side pooled."""
    candidate: Maybe[Spread]
    increase: MannWhitney | None
    """Test of "candidate larger than baseline" over the per-run values (None: no values)."""
    decrease: MannWhitney | None
    source: str
    base_runs: tuple[float, ...] = ()
    """The per-run values of the baseline's runs (empty when absent)."""
    cand_runs: tuple[float, ...] = ()
    load: Load | None = None
    """Each run's load (:class:`~stepscope.analysis.compare.stats.Load`): set on a step time
    measured in the training thread's CPU time, which load moves."""

    @property
    def base_value(self) -> float | None:
        return median(list(self.base_runs)) if self.base_runs else None

    @property
    def cand_value(self) -> float | None:
        return median(list(self.cand_runs)) if self.cand_runs else None

    @property
    def noise(self) -> Noise | None:
        """Run-to-run noise of this metric (None when a side has no value)."""
        if not self.base_runs or not self.cand_runs:
            return None
        return run_noise(self.base_runs, self.cand_runs, timed=self.unit != "bytes", load=self.load)

    @property
    def delta(self) -> float | None:
        if self.base_value is None or self.cand_value is None:
            return None
        return self.cand_value - self.base_value

    @property
    def delta_pct(self) -> float | None:
        if self.delta is None or not self.base_value:
            return None
        return 100.0 * self.delta / self.base_value

    @property
    def higher_is_better(self) -> bool:
        """Bandwidths: a drop is the regression. Times and memory: growth is."""
        return self.unit == "gbps"

    @property
    def absent_reason(self) -> str | None:
        for side, value in (("baseline", self.baseline), ("candidate", self.candidate)):
            if isinstance(value, Absent):
                return f"{side}: {value.reason}"
        return None


@dataclass(frozen=True)
class NamedDelta:
    """One kernel (or collective, or copy kind) matched by name across the runs."""

    key: str
    status: str
    """``added``, ``removed``, ``changed`` or ``same``."""
    baseline: float | None
    candidate: float | None
    baseline_count: float | None
    candidate_count: float | None

    @property
    def delta(self) -> float | None:
        if self.baseline is None or self.candidate is None:
            return None
        return self.candidate - self.baseline

    @property
    def delta_pct(self) -> float | None:
        if self.delta is None or not self.baseline:
            return None
        return 100.0 * self.delta / self.baseline


@dataclass(frozen=True)
class Comparison:
    """The whole comparison: both runs' facts, comparability, metrics, per-name diffs, findings."""

    baseline: Maybe[RunFacts]
    """Absent when there is no baseline yet (:func:`without_baseline`)."""
    candidate: RunFacts
    step_source: str
    """``step_times.<column>`` (:data:`~stepscope.analysis.compare.metrics.STEP_MEASURES`) or
    ``step_windows``: what the step time of both sides is."""
    checks: list[Check]
    metrics: list[MetricDelta]
    kernels: Maybe[list[NamedDelta]]
    collectives: Maybe[list[NamedDelta]]
    copies: Maybe[list[NamedDelta]]
    findings: list[Finding]
    alpha: float
    baseline_runs: tuple[str, ...] = ()
    """Every run of the baseline side, oldest first (``baseline`` is the newest's facts)."""
    candidate_runs: tuple[str, ...] = ()
    """Every run of the candidate side, in the order judged (``candidate`` is the first's)."""
    snapshots: dict[str, object] | None = None
    """The memory snapshots of both sides (:mod:`~stepscope.analysis.compare.snapshots`); None
    when neither side holds one, or when not looked for (:func:`compare_profiles` alone)."""

    @property
    def comparable(self) -> bool:
        return all(c.ok is not False for c in self.checks)

    @property
    def not_comparable_reasons(self) -> list[str]:
        return [c.reason for c in self.checks if c.ok is False and c.reason]

    def metric(self, name: str) -> MetricDelta:
        return next(m for m in self.metrics if m.metric == name)


def _pooled(runs: Sequence[Maybe[list[float]]]) -> Maybe[list[list[float]]]:
    """Each run's values, or the first run's reason when any run lacks them."""
    for values in runs:
        if isinstance(values, Absent):
            return values
        if not values:
            return Absent("no values")
    return [list(v) for v in runs]  # type: ignore[arg-type]


def _per_run(runs: Maybe[list[list[float]]], statistic: str) -> tuple[float, ...]:
    if isinstance(runs, Absent):
        return ()
    return tuple(max(v) if statistic == "max" else median(v) for v in runs)


def _metric(metric: str, label: str, unit: str, statistic: str, base: Sequence[Maybe[list[float]]],
            cand: Sequence[Maybe[list[float]]], source: str) -> MetricDelta:
    b, c = _pooled(base), _pooled(cand)
    base_runs, cand_runs = _per_run(b, statistic), _per_run(c, statistic)
    up = down = None
    if base_runs and cand_runs:
        up, down = mann_whitney_greater(base_runs, cand_runs), mann_whitney_less(base_runs, cand_runs)

    def side(runs: Maybe[list[list[float]]]) -> Maybe[Spread]:
        return runs if isinstance(runs, Absent) else spread([v for values in runs for v in values])

    return MetricDelta(metric, label, unit, statistic, side(b), side(c), up, down, source, base_runs, cand_runs)


def _named(base: Maybe[list[NamedStat]], cand: Maybe[list[NamedStat]]) -> Maybe[list[NamedDelta]]:
    """Match two per-name tables by name: added, removed, changed (any difference) or same."""
    for side in (base, cand):
        if isinstance(side, Absent):
            return side
    assert not isinstance(base, Absent) and not isinstance(cand, Absent)
    b = {s.key: s for s in base}
    c = {s.key: s for s in cand}
    out = []
    for key in sorted(b.keys() | c.keys()):
        bs, cs = b.get(key), c.get(key)
        if bs is None:
            status = "added"
        elif cs is None:
            status = "removed"
        else:
            status = "same" if (bs.value, bs.count) == (cs.value, cs.count) else "changed"
        out.append(NamedDelta(key, status, bs.value if bs else None, cs.value if cs else None,
                              bs.count if bs else None, cs.count if cs else None))
    return out


def _beyond_noise(m: MetricDelta) -> bool:
    """The change is larger than the run-to-run noise margin."""
    noise = m.noise
    return noise is not None and abs(m.delta or 0.0) > noise.margin


def _metric_findings(metrics: list[MetricDelta], step_ns: float | None) -> list[Finding]:
    """Significant changes of at least :data:`NOTABLE_PCT`; a time part must also move by at least
    :data:`KERNEL_NOTABLE_SHARE` of the step (a 10 us part doubling is not news)."""
    found = []
    for m in metrics:
        pct = m.delta_pct
        if pct is None or abs(pct) < NOTABLE_PCT or not _beyond_noise(m):
            continue
        if m.unit == "ns" and step_ns and abs(m.delta or 0) < KERNEL_NOTABLE_SHARE * step_ns:
            continue
        worse = (pct > 0) != m.higher_is_better
        noise = m.noise
        evidence = {"metric": m.metric, "baseline": m.base_value, "candidate": m.cand_value,
                    "delta": m.delta, "delta_pct": pct, "noise_margin": None if noise is None else noise.margin}
        found.append(Finding(Severity.WARNING if worse else Severity.INFO, f"compare.{m.metric}",
                             f"{m.label} {'up' if pct > 0 else 'down'} {abs(pct):.1f}% "
                             f"({format_value(m.base_value, m.unit)} -> {format_value(m.cand_value, m.unit)})", evidence))
    return found


def _kernel_findings(kernels: Maybe[list[NamedDelta]], step_ns: float | None) -> list[Finding]:
    if isinstance(kernels, Absent) or not step_ns:
        return []
    floor = KERNEL_NOTABLE_SHARE * step_ns
    found = []
    for k in kernels:
        base, cand = k.baseline or 0.0, k.candidate or 0.0
        moved = cand - base
        if abs(moved) < floor:
            continue
        if k.status == "changed" and (k.delta_pct is None or abs(k.delta_pct) < KERNEL_NOTABLE_PCT):
            continue
        if k.status == "same":
            continue
        what = {"added": "new kernel", "removed": "kernel no longer runs",
                "changed": "kernel slower" if moved > 0 else "kernel faster"}[k.status]
        pct = f" ({signed_percent(k.delta_pct)})" if k.delta_pct is not None else ""
        found.append(Finding(Severity.WARNING if moved > 0 else Severity.INFO, "compare.kernel",
                             f"{what}: {k.key}: {format_value(base, 'ns')} -> {format_value(cand, 'ns')} per step{pct}",
                             {"kernel": k.key, "status": k.status, "baseline_ns_per_step": k.baseline,
                              "candidate_ns_per_step": k.candidate, "delta_pct": k.delta_pct}))
    found.sort(key=lambda f: -abs((f.evidence["candidate_ns_per_step"] or 0) - (f.evidence["baseline_ns_per_step"] or 0)))
    return found


Side = Sequence[RunProfile]
"""The runs of one side of a comparison (at least one)."""


def _metrics(base: Maybe[Side], cand: Side, step_source: str) -> list[MetricDelta]:
    """Every metric of both sides, in :data:`~stepscope.analysis.compare.budgets.BUDGET_METRICS`
    order; an absent ``base`` (no baseline yet) makes every baseline side absent with its reason."""
    def samples(side: Maybe[Side], metric: str) -> list[Maybe[list[float]]]:
        return [side] if isinstance(side, Absent) else [p.samples[metric] for p in side]

    def peaks(side: Maybe[Side]) -> list[Maybe[list[float]]]:
        return [side] if isinstance(side, Absent) else [p.peak_memory for p in side]

    def parts(breakdown: str, source: str) -> list[MetricDelta]:
        catalogue = GPU if breakdown == "gpu" else HOST
        return [_metric(metric, part.label, part.unit, "median", samples(base, metric), samples(cand, metric),
                        f"{source}.{part.column}") for metric, part in catalogue.budget_metrics().items()]

    device = (cand if isinstance(base, Absent) else base)[-1].peak_memory_device
    wall_source = "step_times.wall_ns" if step_source.startswith("step_times.") else step_source
    metrics = [_metric("step_time", "step time", "ns", "median", samples(base, "step_time"),
                       samples(cand, "step_time"), step_source)]
    metrics += parts("gpu", "step_breakdown")
    metrics.append(_metric("peak_memory", f"peak memory ({device or 'n/a'})", "bytes", "max",
                           peaks(base), peaks(cand), "memory.step_peaks.peak_allocated_bytes"))
    for metric, label, source in BANDWIDTH_METRICS:
        metrics.append(_metric(metric, label, "gbps", "median", samples(base, metric), samples(cand, metric), source))
    wall = _metric("wall_time", "step wall time", "ns", "median", samples(base, "wall_time"),
                   samples(cand, "wall_time"), wall_source)
    metrics.append(wall)
    metrics += parts("host", "host_breakdown")
    step = metrics[0]
    if step_source == CPU_TIME_SOURCE and step.base_runs and step.cand_runs and wall.base_runs and wall.cand_runs:
        assert not isinstance(base, Absent)
        metrics[0] = replace(step, load=Load(run_load(wall.base_runs, step.base_runs),
                                             run_load(wall.cand_runs, step.cand_runs),
                                             _preemptions(base), _preemptions(cand)))
    return metrics


def _preemptions(side: Side) -> tuple[Preemption | None, ...]:
    """Each run's :class:`~stepscope.analysis.compare.stats.Preemption`, None for a run that did
    not record its steps' preemptions (or whose CPU and wall times do not line up with them); its
    ``others`` is None where the run did not record ``step_times.others_cpu_ns``."""
    found: list[Preemption | None] = []
    for p in side:
        cpu, wall = p.samples["step_time"], p.samples["wall_time"]
        switches = p.samples.get(PREEMPTIONS, Absent("not gathered"))
        if isinstance(cpu, Absent) or isinstance(wall, Absent) or isinstance(switches, Absent) \
                or not cpu or not len(cpu) == len(wall) == len(switches):
            found.append(None)
        else:
            others = p.samples.get(OTHERS, Absent("not gathered"))
            measured = None if isinstance(others, Absent) or len(others) != len(wall) else others
            found.append(preemption(cpu, wall, switches, measured))
    return tuple(found)


def _side(profiles: RunProfile | Side) -> Side:
    return [profiles] if isinstance(profiles, RunProfile) else list(profiles)


def compare_profiles(base: RunProfile | Side, cand: RunProfile | Side, *, alpha: float = ALPHA) -> Comparison:
    """Compare two gathered sides, each one run or several runs of the same code, oldest first
    (pure: no store access). Comparability and the per-name tables compare the baseline's newest
    run with the candidate's first."""
    bases, cands = _side(base), _side(cand)
    sources = {p.step_source for p in (*bases, *cands)}
    source = sources.pop() if len(sources) == 1 else "mixed"
    newest, first = bases[-1], cands[0]
    metrics = _metrics(bases, cands, source)
    kernels = _named(newest.kernels, first.kernels)
    step_ns = metrics[0].base_value
    findings = _metric_findings(metrics, step_ns) + _kernel_findings(kernels, step_ns)
    return Comparison(
        baseline=newest.facts,
        candidate=first.facts,
        step_source=source,
        checks=comparability(newest, first),
        metrics=metrics,
        kernels=kernels,
        collectives=_named(newest.collectives, first.collectives),
        copies=_named(newest.copies, first.copies),
        findings=findings,
        alpha=alpha,
        baseline_runs=tuple(p.facts.run for p in bases),
        candidate_runs=tuple(p.facts.run for p in cands),
    )


def without_baseline(cand: RunProfile | Side, reason: str, *, alpha: float = ALPHA) -> Comparison:
    """The candidate alone, when there is no baseline yet (the first run of a branch): its own
    figures, every baseline side absent with ``reason``, no comparability checks, no findings.
    The gate turns it into the ``no_baseline`` outcome."""
    cands = _side(cand)
    absent = Absent(reason)
    return Comparison(baseline=absent, candidate=cands[0].facts, step_source=cands[0].step_source, checks=[],
                      metrics=_metrics(absent, cands, cands[0].step_source), kernels=absent, collectives=absent,
                      copies=absent, findings=[], alpha=alpha,
                      candidate_runs=tuple(p.facts.run for p in cands))


RunRefs = Sequence[tuple[SQLStore, str]]
"""The runs of one side: (store, run) each."""


def profiles(side: RunRefs, source: str) -> list[RunProfile]:
    """Every run of a side, gathered with its step time from ``source``."""
    return [run_profile(store, run, source) for store, run in side]


def side_source(*sides: RunRefs) -> str:
    """The step time's source shared by every run of ``sides`` (:func:`step_source`)."""
    return step_source([step_measures(store, run) for side in sides for store, run in side])


def compare_sides(base: RunRefs, cand: RunRefs, *, alpha: float = ALPHA) -> Comparison:
    """Compare the baseline's runs (oldest first) with the candidate's: the step time comes from
    the first ``step_times`` measure every run has (device time, the training thread's CPU
    time, wall time: :data:`~stepscope.analysis.compare.metrics.STEP_MEASURES`), else from the
    profiled steps' windows of all."""
    source = side_source(base, cand)
    return replace(compare_profiles(profiles(base, source), profiles(cand, source), alpha=alpha),
                   snapshots=compare_snapshots(base, cand))


def compare_runs(base_store: SQLStore, base_run: str, cand_store: SQLStore, cand_run: str,
                 *, alpha: float = ALPHA) -> Comparison:
    """Compare one run with one run (:func:`compare_sides` of a run each)."""
    return compare_sides([(base_store, base_run)], [(cand_store, cand_run)], alpha=alpha)
