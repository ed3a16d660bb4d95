"""Are two runs comparable? A pass or a fail between unlike runs would be a guess.

Each check compares one fact of the two runs; a failed check gives a reason and turns the
verdict into *inconclusive* (exit code 4). A check whose fact neither run recorded is skipped and
says so: absence of evidence is not a difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepscope.analysis.absent import Absent
from stepscope.analysis.compare.metrics import NamedStat, RunFacts, RunProfile

TOP_KERNELS = 10
"""How many of the baseline's most expensive kernels the top-kernel check looks at."""

TOP_KERNELS_MIN_SHARED = 0.5
"""At least this share of the baseline's top kernels (or top CPU ops) must also run in the
candidate: below it the runs execute different code (another model, another attention
implementation)."""


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


def top_names_check(check: str, what: str, base: list[NamedStat] | Absent, cand: list[NamedStat] | Absent) -> Check:
    """Share of the baseline's top ``what`` (kernels, CPU ops; by time per step) that the
    candidate also runs."""
    if isinstance(base, Absent) or isinstance(cand, Absent):
        why = base.reason if isinstance(base, Absent) else cand.reason  # type: ignore[union-attr]
        return Check(check, None, None, None, f"top {what}: {why}")
    top = _top(base, TOP_KERNELS)
    names = {s.key for s in cand}
    shared = [k for k in top if k in names]
    if not top:
        return Check(check, None, [], _top(cand, TOP_KERNELS), f"top {what}: the baseline ran none")
    ok = len(shared) >= TOP_KERNELS_MIN_SHARED * len(top)
    reason = None if ok else (f"top {what} differ: only {len(shared)} of the baseline's top {len(top)} "
                              f"{what} run in the candidate")
    return Check(check, ok, top, _top(cand, TOP_KERNELS), reason)


def top_kernels_check(base: list[NamedStat] | Absent, cand: list[NamedStat] | Absent) -> Check:
    """Share of the baseline's top kernels (by time per step) that the candidate also runs."""
    return top_names_check("top_kernels", "kernels", base, cand)


def _calls_per_step(ops: list[NamedStat] | Absent, names: list[str]) -> dict[str, float]:
    by_name = {} if isinstance(ops, Absent) else {s.key: s.count for s in ops}
    return {name: round(by_name[name], 2) for name in names if by_name.get(name) is not None}


def _ops_structure(base_ops: list[NamedStat] | Absent, cand_ops: list[NamedStat] | Absent) -> Check:
    """Without collectives: the calls per step of the baseline's top CPU ops, the same in both
    (the same loop: the same layers, micro-batches and optimizer calls per step)."""
    if isinstance(base_ops, Absent) or isinstance(cand_ops, Absent):
        why = base_ops.reason if isinstance(base_ops, Absent) else cand_ops.reason  # type: ignore[union-attr]
        return Check("step_structure", None, None, None,
                     f"step structure: neither run communicates inside steps, and {why}")
    top = _top(base_ops, TOP_KERNELS)
    base_map, cand_map = _calls_per_step(base_ops, top), _calls_per_step(cand_ops, top)
    if base_map == cand_map:
        return Check("step_structure", True, base_map, cand_map, None)
    return Check("step_structure", False, base_map, cand_map,
                 f"step structure differs: calls per step of the top CPU ops, baseline {_show(base_map)}; "
                 f"candidate {_show(cand_map)}")


def step_structure_check(base: dict[str, float] | Absent, cand: dict[str, float] | Absent,
                         base_steps: int, cand_steps: int, base_ops: list[NamedStat] | Absent = Absent("no CPU ops"),
                         cand_ops: list[NamedStat] | Absent = Absent("no CPU ops")) -> Check:
    """Same collectives per step (median count by kind): the same parallel layout and schedule;
    when neither run communicates, the same calls per step of the top CPU ops."""
    if base_steps == 0 or cand_steps == 0:
        which = "baseline" if base_steps == 0 else "candidate"
        return Check("step_structure", False, base_steps, cand_steps,
                     f"step structure: the {which} has no ProfilerStep#N annotations, steps cannot be matched")
    if isinstance(base, Absent) and isinstance(cand, Absent):
        return _ops_structure(base_ops, cand_ops)
    base_map = {} if isinstance(base, Absent) else base
    cand_map = {} if isinstance(cand, Absent) else cand
    if base_map == cand_map:
        return Check("step_structure", True, base_map, cand_map, None)
    return Check("step_structure", False, base_map, cand_map,
                 f"step structure differs: collectives per step, baseline {_show(base_map)}; "
                 f"candidate {_show(cand_map)}")


def comparability(base: RunProfile, cand: RunProfile) -> list[Check]:
    """Every check, in a fixed order: GPU model, GPU count, world size, stored ranks, process
    groups, threads, step structure, top kernels, top CPU ops.

    A run whose traces claim no world size and that stores one rank is one process: world size
    1 (a CPU benchmark is not distributed, which is a fact, not an unknown). The threads are
    torch's intra-op threads as the collector recorded them: a CPU step's time depends on them.

    The world size is what the traces claim; the stored rank count is what the store holds. They
    differ for a partly ingested run, or for traces that claim no (or a copied) world size: an
    8-rank and a 16-rank run whose traces claimed the same world size were judged comparable.
    """
    b, c = base.facts, cand.facts
    gpu = bool(b.gpu_names or c.gpu_names or b.gpu_count or c.gpu_count)
    checks = [
        _equal("gpu_model", "GPU model", list(b.gpu_names) or None, list(c.gpu_names) or None),
        _equal("gpu_count", "GPU count", b.gpu_count, c.gpu_count),
        _equal("world_size", "world size", _world_size(b), _world_size(c)),
        _equal("ranks", "stored rank count", len(b.ranks), len(c.ranks)),
        _equal("process_groups", "process groups",
               None if b.process_groups is None else list(b.process_groups),
               None if c.process_groups is None else list(c.process_groups)),
        _equal("threads", "intra-op threads", b.threads, c.threads),
        step_structure_check(base.collectives_per_step, cand.collectives_per_step, b.steps, c.steps,
                             base.cpu_ops, cand.cpu_ops),
        top_kernels_check(base.kernels, cand.kernels),
        top_names_check("top_ops", "CPU ops", base.cpu_ops, cand.cpu_ops),
    ]
    if not gpu:  # a CPU run: "no GPU" on both sides is the same hardware, not a question
        checks = [_cpu_only(check) for check in checks]
    return checks


def _world_size(facts: RunFacts) -> int | None:
    return facts.world_size if facts.world_size is not None or len(facts.ranks) != 1 else 1


def _cpu_only(check: Check) -> Check:
    """On CPU runs the GPU checks agree (neither has one): said as such, not as "not checked"
    (the top kernels stay unchecked: there are none; the top CPU ops check the code)."""
    if check.check in ("gpu_model", "gpu_count") and check.ok is None:
        return Check(check.check, True, "no GPU", "no GPU", None)
    return check
