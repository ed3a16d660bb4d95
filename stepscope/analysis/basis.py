"""The one step basis: what every share and every "per step" figure of the verdict, the findings
and the dashboard is a share of.

The basis is the **mean step window** over every rank and profiled step of the step breakdown
(the GPU one; the host one on a run without GPU events). Why the mean and not the median: the
findings quote causes as a mean time per step (a cause's total over the steps divided by their
number), and the parts of the breakdown sum to the summed windows, so only against the mean do
a part's time per step and its share agree (``ns = share x step``) and the parts add up to the
step. The median, the range and the number of windows are carried beside it, so a first step
pulled up by warm-up is visible instead of silently averaged (docs/ANALYSIS.md, "The step basis").

A finding quotes its time on one rank (the worst of those it is about); its share is that time
over the basis, so a finding and the verdict never disagree about how long a step is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from stepscope.analysis.quantiles import median
from stepscope.units import duration

BASIS_NAME = "mean step"
"""How the text names the basis: "64% of the mean step"."""


@dataclass(frozen=True)
class StepBasis:
    """The mean step window and what it is the mean of (module docs)."""

    step_ns: float
    median_ns: float
    min_ns: int
    max_ns: int
    ranks: int
    windows: int
    breakdown: str
    """``gpu`` or ``host``: which step breakdown the windows are from."""

    def share(self, ns: float | None) -> float | None:
        """``ns`` as a fraction of the basis step (None when ``ns`` is None or the step is 0)."""
        return None if ns is None or not self.step_ns else ns / self.step_ns

    def of_step(self, ns: float) -> str:
        """``64% of the mean step``: how every message states a share."""
        share = self.share(ns)
        return f"{100 * share:.0f}% of the {BASIS_NAME}" if share is not None else "share unknown"

    def to_json(self) -> dict[str, Any]:
        return {"name": BASIS_NAME, "step_ns": round(self.step_ns), "median_ns": round(self.median_ns),
                "min_ns": self.min_ns, "max_ns": self.max_ns, "ranks": self.ranks, "windows": self.windows,
                "breakdown": self.breakdown}


def _table(ranks_result: object) -> tuple[pa.Table | None, str]:
    gpu = getattr(ranks_result, "breakdown", None)
    if isinstance(gpu, pa.Table) and gpu.num_rows:
        return gpu, "gpu"
    host = getattr(ranks_result, "host", None)
    return (host, "host") if isinstance(host, pa.Table) and host.num_rows else (None, "host")


def step_basis(ranks_result: object) -> StepBasis | None:
    """The basis of the ``ranks`` section's result (None without step windows)."""
    table, name = _table(ranks_result)
    if table is None:
        return None
    durations = table.column("dur_ns").to_pylist()
    return StepBasis(step_ns=sum(durations) / len(durations), median_ns=median(durations), min_ns=min(durations),
                     max_ns=max(durations), ranks=len(set(table.column("rank").to_pylist())),
                     windows=len(durations), breakdown=name)


def basis_of(results: Mapping[str, object]) -> StepBasis | None:
    """The basis of a rule's section results (from their ``ranks`` section)."""
    return step_basis(results.get("ranks"))


def quoted_rank(ranks: Iterable[int], rank: int, per_rank: Mapping[int, float]) -> str:
    """What a finding over several ranks says about the figure it quotes: ``on rank 3, 1.20-2.10
    ms over the ranks``; empty for a finding about one rank (the message already names it)."""
    values = [per_rank[r] for r in ranks if r in per_rank]
    if len(values) < 2:
        return ""
    low, high = min(values), max(values)
    spread = duration(low) if round(low) == round(high) else f"{duration(low)}-{duration(high)}"
    return f"on rank {rank}; {spread} over the ranks"
