"""Sections of the summary: one registry that feeds ``stepscope summary``, the findings and
(later) the dashboard pages.

A section is a named analysis over one run: ``compute(store, run, ranks)`` returns its result
(typed frames or a frozen dataclass) or :class:`~stepscope.analysis.absent.Absent`;
``to_json(result)`` turns it into the JSON the summary prints under the section's name. Rules in
:mod:`stepscope.analysis.findings` read the same results by the same names. Adding a section::

    from stepscope.analysis.sections import section

    def comm_json(result) -> dict: ...

    @section("comm", order=30, to_json=comm_json)
    def comm_section(store, run, ranks):
        return collectives(store, run, ranks)   # or Absent("no communication kernels")

in any module of the ``stepscope.analysis`` package: :func:`load_modules` imports every module of
the package (names starting with ``_`` excepted), so a new module registers itself without
editing a shared list. The reserved names ``run``, ``ranks`` and ``findings`` are the JSON contract's
top-level keys; ``ranks`` is the per-rank section (steps and totals).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

class SQLStore(Protocol):
    """What the analyses need from a store: parameterised SQL returning Arrow."""

    def sql(self, query: str, params: Sequence[object] | dict[str, object] | None = None) -> pa.Table: ...


ComputeFunc = Callable[[SQLStore, str, "Sequence[int] | None"], object]
ToJsonFunc = Callable[[Any], Any]


@dataclass(frozen=True)
class Section:
    """A registered section: JSON key, order in the report, compute and to_json functions."""

    name: str
    order: int
    compute: ComputeFunc
    to_json: ToJsonFunc
    doc: str


SECTIONS: dict[str, Section] = {}
_RESERVED = {"run", "findings", "verdict", "absent_reasons"}


def section(name: str, *, order: int, to_json: ToJsonFunc) -> Callable[[ComputeFunc], ComputeFunc]:
    """Register ``compute`` as the section ``name`` (also its key in the summary JSON)."""
    if name in _RESERVED:
        raise ValueError(f"section name {name!r} is reserved by the summary JSON contract")

    def register(compute: ComputeFunc) -> ComputeFunc:
        if name in SECTIONS and SECTIONS[name].compute is not compute:
            raise ValueError(f"section {name!r} is registered twice")
        SECTIONS[name] = Section(name, order, compute, to_json, (compute.__doc__ or "").strip())
        return compute

    return register


def load_modules() -> None:
    """Import every public module of ``stepscope.analysis``, filling the section and rule registries.

    Discovery instead of a hand-kept list: an analysis module cannot be forgotten, and two
    people adding modules never edit the same line. The modules are found in this file's own
    folder, not through the package object: importing the package would run its ``__init__``,
    which imports the registries, which load through here (an import circle).
    """
    package = __name__.rpartition(".")[0]
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")


def all_sections() -> list[Section]:
    """Every registered section in report order."""
    load_modules()
    return sorted(SECTIONS.values(), key=lambda s: (s.order, s.name))


def compute_sections(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> dict[str, object]:
    """Compute every section for ``run`` (restricted to ``ranks`` when given), by name."""
    return {s.name: s.compute(store, run, ranks) for s in all_sections()}
