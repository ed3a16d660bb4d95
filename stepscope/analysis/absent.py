"""Abstention: a figure that cannot be computed is *absent, with a reason*, never 0.

A zero is a claim ("no idle time"); a trace without GPU events, without ``ProfilerStep``
annotations, or without the rank asked for cannot support that claim. Every analysis therefore
returns either its value or an :class:`Absent` carrying a human-readable reason, and frames keep
absent cells as nulls next to an ``absent_reason`` column.

JSON convention (used by ``stepscope summary`` and documented in docs/SUMMARY_JSON.md): a null
value under key ``K`` of an object always comes with ``object["absent_reasons"][K]`` saying why.
:func:`jsonable` applies it, so no section has to remember.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, Union

T = TypeVar("T")


@dataclass(frozen=True)
class Absent:
    """A value that could not be computed. Falsy, so ``if result:`` skips it; never a number."""

    reason: str

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"absent: {self.reason}"


Maybe = Union[T, Absent]
"""``Maybe[int]``: an int, or :class:`Absent` with the reason it is missing."""


# Standard reasons, shared so that the CLI, the dashboard and the tests can recognise them.
NO_GPU_EVENTS = "no GPU events (kernel, memcpy, memset) in this rank's trace"
NO_STEPS = "no ProfilerStep#N annotations in this rank's trace"
NO_COMMUNICATION = "no communication kernels in this rank's trace"
NO_DATALOADER = ("no enumerate(DataLoader)#... annotations in this rank's trace: its data loading is not "
                 "recorded (it counts among the other host work)")


def missing_rank(rank: int, present: list[int] | tuple[int, ...]) -> str:
    """Reason for a rank that was asked for but has no trace in the run."""
    have = ", ".join(str(r) for r in present) or "none"
    return f"rank {rank} is not in this run (ranks present: {have})"


def is_absent(value: object) -> bool:
    """True for :class:`Absent` (and only for it: ``0`` and ``None`` are not absences)."""
    return isinstance(value, Absent)


def jsonable(value: Any) -> Any:
    """Turn a result tree into JSON-ready data, applying the absent-reasons convention.

    Dicts: an :class:`Absent` value becomes ``null`` and its reason goes to
    ``absent_reasons[key]``. Lists: an :class:`Absent` item becomes ``{"absent_reason": ...}``
    (a bare null in a list could not carry its reason). Other values pass through unchanged.
    """
    if isinstance(value, Absent):
        return {"absent_reason": value.reason}
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        reasons: dict[str, str] = dict(value.get("absent_reasons") or {})
        for key, item in value.items():
            if key == "absent_reasons":
                continue
            if isinstance(item, Absent):
                out[key] = None
                reasons[key] = item.reason
            else:
                out[key] = jsonable(item)
        if reasons:
            out["absent_reasons"] = reasons
        return out
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    return value
