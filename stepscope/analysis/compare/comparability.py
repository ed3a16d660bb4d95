"""Are two runs comparable? A pass or a fail between unlike runs would be a guess.

Each check compares one fact of the two runs; a failed check gives a reason and turns the
verdict into *inconclusive* (exit code 4). A check whose fact neither run recorded is skipped and
says so: absence of evidence is not a difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepscope.analysis.absent import Absent
from stepscope.analysis.compare.metrics import NamedStat, RunProfile

TOP_KERNELS = 10
"""How many of the baseline's most expensive kernels the top-kernel check looks at."""

TOP_KERNELS_MIN_SHARED = 0.5
"""At least this share of the baseline's top kernels must also run in the candidate: below it the
runs execute different code (another model, another attention implementation)."""


@dataclass(frozen=True)
class Check:
    """One comparability check: its name, the two values, whether they agree and why not."""

    check: str
    ok: bool | None
    """True: comparable on this point; False: not; None: not checked (``reason`` says why)."""
    baseline: Any
    candidate: Any
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "ok": self.ok, "baseline": self.baseline,
                "candidate": self.candidate, "reason": self.reason}


def _equal(check: str, what: str, base: Any, cand: Any) -> Check:
    if base is None and cand is None:
        return Check(check, None, None, None, f"{what}: recorded by neither run")
    if base == cand:
        return Check(check, True, base, cand, None)
    return Check(check, False, base, cand, f"{what} differs: baseline {_show(base)}, candidate {_show(cand)}")


def _show(value: Any) -> str:
    if value is None:
        return "not recorded"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "none"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:g}" for k, v in value.items()) or "none"
    return str(value)


def _top(stats: list[NamedStat], n: int) -> list[str]:
    ranked = sorted((s for s in stats if s.value is not None), key=lambda s: (-(s.value or 0), s.key))
    return [s.key for s in ranked[:n]]


def top_kernels_check(base: list[NamedStat] | Absent, cand: list[NamedStat] | Absent) -> Check:
    """Share of the baseline's top kernels (by time per step) that the candidate also runs."""
    if isinstance(base, Absent) or isinstance(cand, Absent):
        why = base.reason if isinstance(base, Absent) else cand.reason  # type: ignore[union-attr]
        return Check("top_kernels", None, None, None, f"top kernels: {why}")
    top = _top(base, TOP_KERNELS)
    names = {s.key for s in cand}
    shared = [k for k in top if k in names]
    if not top:
        return Check("top_kernels", None, [], _top(cand, TOP_KERNELS), "top kernels: the baseline ran no kernels")
    ok = len(shared) >= TOP_KERNELS_MIN_SHARED * len(top)
    reason = None if ok else (f"top kernels differ: only {len(shared)} of the baseline's top {len(top)} "
                              "kernels run in the candidate")
    return Check("top_kernels", ok, top, _top(cand, TOP_KERNELS), reason)


def step_structure_check(base: dict[str, float] | Absent, cand: dict[str, float] | Absent,
                         base_steps: int, cand_steps: int) -> Check:
    """Same collectives per step (median count by kind): the same parallel layout and schedule."""
    if base_steps == 0 or cand_steps == 0:
        which = "baseline" if base_steps == 0 else "candidate"
        return Check("step_structure", False, base_steps, cand_steps,
                     f"step structure: the {which} has no ProfilerStep#N annotations, steps cannot be matched")
    if isinstance(base, Absent) and isinstance(cand, Absent):
        return Check("step_structure", None, None, None, "step structure: neither run communicates inside steps")
    base_map = {} if isinstance(base, Absent) else base
    cand_map = {} if isinstance(cand, Absent) else cand
    if base_map == cand_map:
        return Check("step_structure", True, base_map, cand_map, None)
    return Check("step_structure", False, base_map, cand_map,
                 f"step structure differs: collectives per step, baseline {_show(base_map)}; "
                 f"candidate {_show(cand_map)}")


def comparability(base: RunProfile, cand: RunProfile) -> list[Check]:
    """Every check, in a fixed order: GPU model, GPU count, world size, stored ranks, process
    groups, step structure, top kernels.

    The world size is what the traces claim; the stored rank count is what the store holds. They
    differ for a partly ingested run, or for traces that claim no (or a copied) world size: an
    8-rank and a 16-rank run whose traces claimed the same world size were judged comparable.
    """
    b, c = base.facts, cand.facts
    return [
        _equal("gpu_model", "GPU model", list(b.gpu_names) or None, list(c.gpu_names) or None),
        _equal("gpu_count", "GPU count", b.gpu_count, c.gpu_count),
        _equal("world_size", "world size", b.world_size, c.world_size),
        _equal("ranks", "stored rank count", len(b.ranks), len(c.ranks)),
        _equal("process_groups", "process groups",
               None if b.process_groups is None else list(b.process_groups),
               None if c.process_groups is None else list(c.process_groups)),
        step_structure_check(base.collectives_per_step, cand.collectives_per_step, b.steps, c.steps),
        top_kernels_check(base.kernels, cand.kernels),
    ]
