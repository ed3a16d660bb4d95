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
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
    """Compute every section for ``run`` (restricted to ``ranks`` when given), by name.

    A store that can open twin sessions (:meth:`stepscope.store.catalog.Store.session`) has its
    sections computed on :data:`SECTION_THREADS` threads, each with a twin of its own: DuckDB
    releases the GIL while a query runs, so one section's Python (building frames, walking
    matched collectives) overlaps another's SQL. Inputs two sections share (the matched
    collectives, the step breakdown) are computed once: the store's memo makes the second thread
    wait for the first. Measured on 64 ranks, cold, 2 cores: 3.8 s sequential, 3.2 s on two
    threads, the same CPU and a byte-identical summary."""
    sections = all_sections()
    open_session = getattr(store, "session", None)
    if open_session is None:
        return {s.name: s.compute(store, run, ranks) for s in sections}
    return _compute_on_threads(sections, [open_session() for _ in range(SECTION_THREADS)], run, ranks)


SECTION_THREADS = 2
"""Threads computing the summary's sections: the CI runner's and a laptop's cores. More threads
only queue on DuckDB's own threads (it uses every core for one query)."""


def _compute_on_threads(sections: list[Section], twins: list[Any], run: str,
                        ranks: Sequence[int] | None) -> dict[str, object]:
    """Each section computed on one of ``len(twins)`` threads, each thread querying its own twin.

    The sections are handed out in reverse report order: the last ones (the critical path, the
    lateness across ranks) are the longest, and starting them first makes both threads end
    together (64 ranks: 3.5 s in report order, 3.2 s reversed). The twins are opened by the
    caller's thread, not the workers: a DuckDB connection is not to be shared while it opens a
    cursor. A failure (or Ctrl-C) cancels the sections not started and interrupts the running
    queries, so it is raised without waiting for the rest of the report."""
    spare: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for twin in twins:
        spare.put(twin)
    own = threading.local()

    def claim_twin() -> None:
        own.store = spare.get_nowait()

    def compute(s: Section) -> object:
        return s.compute(own.store, run, ranks)

    pool = ThreadPoolExecutor(len(twins), thread_name_prefix="stepscope-section", initializer=claim_twin)
    try:
        futures = {s.name: pool.submit(compute, s) for s in reversed(sections)}
        return {s.name: futures[s.name].result() for s in sections}
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        for twin in twins:
            twin.interrupt()
        raise
    finally:
        pool.shutdown(wait=True)
