"""Two runs side by side: every metric with its spread, deltas and a noise test; per-name diffs.

:func:`compare_profiles` is pure (two :class:`RunProfile` in, a :class:`Comparison` out) so the
statistics can be tested on hand-made profiles; :func:`compare_runs` reads the profiles from
stores first. Budgets are judged afterwards by :mod:`stepscope.analysis.compare.gate`: the
comparison is data, the gate is the decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from stepscope.analysis.absent import Absent, Maybe
from stepscope.analysis.compare.budgets import COPY_DIRECTIONS
from stepscope.analysis.compare.comparability import Check, comparability
from stepscope.analysis.compare.metrics import (
    RunFacts,
    NamedStat,
    RunProfile,
    has_step_times,
    run_profile,
)
from stepscope.analysis.compare.stats import MannWhitney, Spread, mann_whitney_greater, mann_whitney_less, spread
from stepscope.analysis.findings import Finding, Severity
from stepscope.store.rankstats.parts import GPU
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
"""Significance level of the noise test (one-sided Mann-Whitney U)."""

NOTABLE_PCT = 5.0
"""A metric change is reported as a finding from this relative size on (and only when the noise
test says it is beyond the run-to-run spread, or no test is possible)."""

KERNEL_NOTABLE_PCT = 10.0
KERNEL_NOTABLE_SHARE = 0.01
"""A kernel's change is a finding when it moves by 10 % or more of its own time and by at least
1 % of the baseline's median step time (smaller kernels cannot move the step)."""


@dataclass(frozen=True)
class MetricDelta:
    """One metric of both runs. ``statistic`` says which summary the deltas compare."""

    metric: str
    label: str
    unit: str
    statistic: str
    baseline: Maybe[Spread]
    candidate: Maybe[Spread]
    increase: MannWhitney | None
    """Test of "candidate larger than baseline" over the per-step values (None: no samples)."""
    decrease: MannWhitney | None
    source: str

    @property
    def base_value(self) -> float | None:
        return None if isinstance(self.baseline, Absent) else getattr(self.baseline, self.statistic)

    @property
    def cand_value(self) -> float | None:
        return None if isinstance(self.candidate, Absent) else getattr(self.candidate, self.statistic)

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
    checks: list[Check]
    metrics: list[MetricDelta]
    kernels: Maybe[list[NamedDelta]]
    collectives: Maybe[list[NamedDelta]]
    copies: Maybe[list[NamedDelta]]
    findings: list[Finding]
    alpha: float

    @property
    def comparable(self) -> bool:
        return all(c.ok is not False for c in self.checks)

    @property
    def not_comparable_reasons(self) -> list[str]:
        return [c.reason for c in self.checks if c.ok is False and c.reason]

    def metric(self, name: str) -> MetricDelta:
        return next(m for m in self.metrics if m.metric == name)


def _tests(base: Maybe[list[float]], cand: Maybe[list[float]]) -> tuple[MannWhitney | None, MannWhitney | None]:
    if isinstance(base, Absent) or isinstance(cand, Absent) or not base or not cand:
        return None, None
    return mann_whitney_greater(base, cand), mann_whitney_less(base, cand)


def _spread(values: Maybe[list[float]], empty: str) -> Maybe[Spread]:
    if isinstance(values, Absent):
        return values
    return spread(values) if values else Absent(empty)


def _metric(metric: str, label: str, unit: str, statistic: str, base: Maybe[list[float]],
            cand: Maybe[list[float]], source: str) -> MetricDelta:
    up, down = _tests(base, cand)
    empty = "no values"
    return MetricDelta(metric, label, unit, statistic, _spread(base, empty), _spread(cand, empty), up, down, source)


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


def _significant(m: MetricDelta, alpha: float) -> bool:
    """Beyond the run-to-run spread in the direction of the change (True when untestable)."""
    test = m.increase if (m.delta or 0) > 0 else m.decrease
    if test is None or test.min_p > alpha:
        return True
    return test.p_value < alpha


def _metric_findings(metrics: list[MetricDelta], alpha: float, step_ns: float | None) -> list[Finding]:
    """Significant changes of at least :data:`NOTABLE_PCT`; a time part must also move by at least
    :data:`KERNEL_NOTABLE_SHARE` of the step (a 10 us part doubling is not news)."""
    found = []
    for m in metrics:
        pct = m.delta_pct
        if pct is None or abs(pct) < NOTABLE_PCT or not _significant(m, alpha):
            continue
        if m.unit == "ns" and step_ns and abs(m.delta or 0) < KERNEL_NOTABLE_SHARE * step_ns:
            continue
        worse = (pct > 0) != m.higher_is_better
        test = m.increase if pct > 0 else m.decrease
        evidence = {"metric": m.metric, "baseline": m.base_value, "candidate": m.cand_value,
                    "delta": m.delta, "delta_pct": pct,
                    "p_value": None if test is None else test.p_value}
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


def _metrics(base: Maybe[RunProfile], cand: RunProfile) -> list[MetricDelta]:
    """Every metric of both runs, in :data:`~stepscope.analysis.compare.budgets.BUDGET_METRICS`
    order; an absent ``base`` (no baseline yet) makes every baseline side absent with its reason."""
    def samples(profile: Maybe[RunProfile], metric: str) -> Maybe[list[float]]:
        return profile if isinstance(profile, Absent) else profile.samples[metric]

    def peaks(profile: Maybe[RunProfile]) -> Maybe[list[float]]:
        return profile if isinstance(profile, Absent) else profile.peak_memory

    step_source = cand.step_source if isinstance(base, Absent) else base.step_source
    device = (cand if isinstance(base, Absent) else base).peak_memory_device
    metrics = [_metric("step_time", "step time", "ns", "median", samples(base, "step_time"),
                       cand.samples["step_time"], step_source)]
    for metric, part in GPU.budget_metrics().items():
        metrics.append(_metric(metric, part.label, part.unit, "median", samples(base, metric), cand.samples[metric],
                               f"step_breakdown.{part.column}"))
    metrics.append(_metric("peak_memory", f"peak memory ({device or 'n/a'})", "bytes", "max",
                           peaks(base), cand.peak_memory, "memory.step_peaks.peak_allocated_bytes"))
    for metric, label, source in BANDWIDTH_METRICS:
        metrics.append(_metric(metric, label, "gbps", "median", samples(base, metric), cand.samples[metric], source))
    return metrics


def compare_profiles(base: RunProfile, cand: RunProfile, *, alpha: float = ALPHA) -> Comparison:
    """Compare two gathered runs (pure: no store access)."""
    source = base.step_source if base.step_source == cand.step_source else "mixed"
    metrics = _metrics(base, cand)
    kernels = _named(base.kernels, cand.kernels)
    step_ns = metrics[0].base_value
    findings = _metric_findings(metrics, alpha, step_ns) + _kernel_findings(kernels, step_ns)
    return Comparison(
        baseline=base.facts,
        candidate=cand.facts,
        step_source=source,
        checks=comparability(base, cand),
        metrics=metrics,
        kernels=kernels,
        collectives=_named(base.collectives, cand.collectives),
        copies=_named(base.copies, cand.copies),
        findings=findings,
        alpha=alpha,
    )


def without_baseline(cand: RunProfile, reason: str, *, alpha: float = ALPHA) -> Comparison:
    """The candidate alone, when there is no baseline yet (the first run of a branch): its own
    figures, every baseline side absent with ``reason``, no comparability checks, no findings.
    The gate turns it into the ``no_baseline`` outcome."""
    absent = Absent(reason)
    return Comparison(baseline=absent, candidate=cand.facts, step_source=cand.step_source, checks=[],
                      metrics=_metrics(absent, cand), kernels=absent, collectives=absent, copies=absent,
                      findings=[], alpha=alpha)


def compare_runs(base_store: SQLStore, base_run: str, cand_store: SQLStore, cand_run: str,
                 *, alpha: float = ALPHA) -> Comparison:
    """Compare ``base_run`` (in ``base_store``) with ``cand_run`` (in ``cand_store``; may be the
    same store). The step time comes from the collector's ``step_times`` when both runs have
    them (every step of the run), else from the profiled steps' windows in both."""
    both = has_step_times(base_store, base_run) and has_step_times(cand_store, cand_run)
    base = run_profile(base_store, base_run, use_step_times=both)
    cand = run_profile(cand_store, cand_run, use_step_times=both)
    return compare_profiles(base, cand, alpha=alpha)

