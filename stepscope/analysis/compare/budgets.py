"""Budgets: how much a metric may grow (or shrink) before the gate fails.

A budget is written ``METRIC:THRESHOLD``: ``step_time:+5%`` (may grow by at most 5 %),
``comm_exposed:+2ms`` (by at most 2 ms), ``peak_memory:+512MiB``, ``busbw:-10%`` (bus bandwidth
may drop by at most 10 %), ``copy_bandwidth_h2d:-5GB/s``. The sign says which direction is bad; ``%`` makes the threshold relative
to the baseline's value, a unit makes it absolute. The same strings are used on the command
line (``--fail-on``), in ``stepscope.toml`` / ``[tool.stepscope]`` and in the pytest marker,
so there is one parser and one set of metric names.

A **floor** per metric (``step_time:1ms``; defaults in :data:`DEFAULT_FLOORS`) is the smallest
absolute change that can fail: a 0.1 ms change of a 1 ms step is +10 %, yet timer noise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from stepscope.store.rankstats.parts import GPU, HOST
from stepscope.errors import UsageError

TIME_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
BYTE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
BANDWIDTH_UNITS = {"GB/s": 1.0, "MB/s": 1e-3}
UNITS_BY_DIMENSION = {"ns": TIME_UNITS, "bytes": BYTE_UNITS, "gbps": BANDWIDTH_UNITS}
"""Units an absolute threshold may use, per metric dimension (the metric's own unit is 1)."""

COPY_DIRECTIONS: tuple[str, ...] = ("h2d", "d2h", "d2d")
"""Copy directions with their own bandwidth metric (``copy_bandwidth_<direction>``), as
:func:`stepscope.analysis.copies.copy_summary` names them."""

BUDGET_METRICS: dict[str, str] = {
    "step_time": "ns",
    **{metric: part.unit for metric, part in GPU.budget_metrics().items()},
    "peak_memory": "bytes",
    "busbw": "gbps",
    "copy_bandwidth": "gbps",
    **{f"copy_bandwidth_{d}": "gbps" for d in COPY_DIRECTIONS},
    "wall_time": "ns",
    **{metric: part.unit for metric, part in HOST.budget_metrics().items()},
}
"""Metric name -> dimension. These are the names of the comparison's metrics (see metrics.py): the
step time (the judged measure: device time on GPU, the training thread's CPU time on CPU), each
GPU step part the catalogue (:mod:`stepscope.store.rankstats.parts`) names a budget metric for,
the peak memory, the bus bandwidth of the collectives, the copy bandwidth (all copies, then per
direction), the step's wall time, and each host step part with a budget metric."""

DEFAULT_FLOORS: dict[str, float] = {"ns": 500_000, "bytes": 16 * 2**20, "gbps": 1.0}
"""Absolute floor per dimension: a change smaller than this never fails, whatever its relative
size. 0.5 ms of step time (timer and scheduler noise of a CPU process), 16 MiB of memory (the
allocator's rounding and caching moves CPU peaks by hundreds of KiB between identical runs),
1 GB/s of bandwidth. Override per metric with ``--floor METRIC:AMOUNT``, ``[floors]`` in the
config or the marker's ``floor``."""

DEFAULT_BUDGETS: tuple[str, ...] = ("step_time:+10%", "peak_memory:+10%")
"""Used when neither the command line nor a config file gives budgets. Step time is what users
pay for; +10 % is CodSpeed's and asv's (``-f 1.1``) default and above the 3-8 % overhead of the
profiler itself. Peak memory +10 % catches a new large buffer before it becomes an OOM."""

_BUDGET = re.compile(r"^\s*(?P<metric>[a-z_0-9]+)\s*:\s*(?P<sign>[+-])\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>%|[A-Za-z/]+)\s*$")


@dataclass(frozen=True)
class Budget:
    """A parsed budget. ``threshold`` is a fraction (0.05) when ``relative``, else in the metric's
    own unit (ns, bytes, GB/s). ``direction`` is +1 when growth is bad, -1 when a drop is bad."""

    metric: str
    direction: int
    threshold: float
    relative: bool
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "budget": self.text,
                "direction": "increase" if self.direction > 0 else "decrease",
                "kind": "relative" if self.relative else "absolute", "threshold": self.threshold}


def _known_metric(what: str, text: str, metric: str) -> str:
    if metric not in BUDGET_METRICS:
        raise UsageError(f"{what} {text!r}: unknown metric {metric!r}; known: {', '.join(BUDGET_METRICS)}")
    return metric


def _in_metric_unit(what: str, text: str, metric: str, value: float, unit: str, alternatives: str = "") -> float:
    """``value`` ``unit`` in ``metric``'s own unit (ns, bytes, GB/s); a clear error when the unit
    does not fit the metric."""
    units = UNITS_BY_DIMENSION[BUDGET_METRICS[metric]]
    if unit not in units:
        raise UsageError(f"{what} {text!r}: unit {unit!r} does not fit {metric} (use {alternatives}one of "
                         f"{', '.join(units)})")
    return value * units[unit]


def parse_budget(text: str) -> Budget:
    """``"step_time:+5%"`` -> :class:`Budget`; a clear :class:`UsageError` otherwise."""
    match = _BUDGET.match(text)
    if not match:
        raise UsageError(f"budget {text!r}: expected METRIC:+N% or METRIC:+N<unit>, e.g. step_time:+5% "
                         "or comm_exposed:+2ms")
    metric = _known_metric("budget", text, match["metric"])
    value = float(match["value"])
    unit = match["unit"]
    direction = 1 if match["sign"] == "+" else -1
    canonical = f"{metric}:{match['sign']}{match['value']}{unit}"
    if unit == "%":
        return Budget(metric, direction, value / 100, True, canonical)
    return Budget(metric, direction, _in_metric_unit("budget", text, metric, value, unit, "% or "), False, canonical)


_FLOOR = re.compile(r"^\s*(?P<metric>[a-z_0-9]+)\s*:\s*\+?\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[A-Za-z/]+)\s*$")


def parse_floor(text: str) -> tuple[str, float]:
    """``"peak_memory:64MiB"`` -> ``("peak_memory", 67108864.0)``: a metric's absolute floor in its
    own unit; a clear :class:`UsageError` otherwise."""
    match = _FLOOR.match(text)
    if not match:
        raise UsageError(f"floor {text!r}: expected METRIC:AMOUNT with a unit, e.g. step_time:1ms or "
                         "peak_memory:64MiB")
    metric = _known_metric("floor", text, match["metric"])
    return metric, _in_metric_unit("floor", text, metric, float(match["value"]), match["unit"])


def floors(texts: list[str] | tuple[str, ...] = ()) -> dict[str, float]:
    """Every metric's floor: :data:`DEFAULT_FLOORS` by dimension, overridden by ``texts`` in order."""
    out = {metric: DEFAULT_FLOORS[dimension] for metric, dimension in BUDGET_METRICS.items()}
    out.update(parse_floor(text) for text in texts)
    return out


def parse_budgets(texts: list[str] | tuple[str, ...]) -> list[Budget]:
    """Parse several budgets; a later budget for the same metric and direction replaces an earlier."""
    found: dict[tuple[str, int], Budget] = {}
    for text in texts:
        budget = parse_budget(text)
        found[(budget.metric, budget.direction)] = budget
    return list(found.values())


def budgets_from_mapping(mapping: Mapping[str, Any], where: str) -> list[str]:
    """Budget strings from a config table ``{"step_time": "+5%", ...}`` (``where`` names it in errors)."""
    texts = []
    for metric, value in mapping.items():
        values = value if isinstance(value, list) else [value]
        for item in values:
            if not isinstance(item, str):
                raise UsageError(f"{where}: budget for {metric!r} must be a string like \"+5%\", got {item!r}")
            texts.append(f"{metric}:{item}")
    return texts


def merge_budgets(config: list[str], command_line: list[str], *, defaults: bool = True) -> list[Budget]:
    """Defaults, overridden per metric by the config file, overridden by the command line.
    ``defaults=False`` (a pytest marker's own ``budget``): the command-line budgets alone."""
    if not defaults:
        return parse_budgets(command_line)
    return parse_budgets([*DEFAULT_BUDGETS, *config, *command_line])
