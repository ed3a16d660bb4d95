"""The parts of a step: one ordered catalogue that every consumer iterates.

A step's window is cut into disjoint **parts** that sum to its duration exactly: on the GPU
(:data:`GPU`: compute, exposed communication, exposed copies by direction, exposed memsets,
idle) and on the host (:data:`HOST`: data loading, optimizer, blocked in synchronisation,
compute ops, exposed communication ops, other). Everything that names a part takes it from here: the breakdown SQL
(:mod:`stepscope.analysis.breakdown` generates its class ``CASE``, its exclusive filters and
its sums by iterating a :class:`Breakdown`), the summary's keys and its terminal columns, the
dashboard's labels and colours, the compare metrics and budget names, and the tables of
docs/ANALYSIS.md (checked by ``tests/test_parts.py``, which also fails when a module outside
this one lists parts by hand).

Three kinds of entry, by where their time comes from:

- A **part** (:class:`Part` in ``Breakdown.parts``) comes from the interval sweep
  (:func:`stepscope.analysis._sql.sweep_ctes`). It *claims* event classes (``claims``: SQL
  predicates over ``events``, one sweep class each); a segment of the time line belongs to the
  first part, in catalogue order (= priority), with a claimed class active. The last part
  claims nothing: it is the time when no class is active (idle, other). Adding a class of
  events is therefore one entry here, at its place in the priority order.
- A **sub-part** (``Part.sub_parts``) splits one part's time by a rule computed after the
  sweep (idle by HTA's causes, from the gaps between GPU work; exposed communication into
  waiting for peers and transfer, from the collectives matched across ranks): the rule is the SQL that
  :data:`stepscope.analysis.breakdown.SPLITS` registers for the part. Sub-parts sum exactly to
  their part, so the part keeps its column and its budget metric, and the step's leaves
  (:meth:`Breakdown.leaves`: parts with their sub-parts expanded) still sum to the step.
- A **hidden** part (:class:`Hidden`) is time of some parts' classes under other parts' classes
  (communication under compute): reported beside the parts, never in their sum.

Catalogue order is the report order everywhere. Names, columns and budget metric names are
contracts (docs/SUMMARY_JSON.md, docs/COMPARE_JSON.md): add entries, do not rename them.
This module is pure data: no SQL is run here and nothing heavy is imported, so the CLI's
renderers can read it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class _Entry:
    """What every entry has: ``name``, the stable key (its column is ``<name>_ns``), ``label``,
    how people see it (dashboard legends, compare tables), and ``definition``, the sentence
    docs/ANALYSIS.md shows."""

    name: str
    label: str
    definition: str
    unit: ClassVar[str] = "ns"
    """Every part is a time in integer nanoseconds."""

    @property
    def column(self) -> str:
        """The column in the breakdown tables and the key in the summary JSON."""
        return f"{self.name}_{self.unit}"


@dataclass(frozen=True)
class Part(_Entry):
    """One disjoint part of a step (or a sub-part of one).

    ``color``: its colour on every chart; ``short``: its terminal column header (None: not a
    column of ``stepscope summary``'s table); ``budget_metric``: its name in ``stepscope
    compare`` and ``--fail-on`` (None: not compared).
    """

    color: str
    short: str | None = None
    claims: tuple[str, ...] = ()
    """SQL predicates over an ``events`` row, one sweep class each, in priority order. Empty for
    the last part of a breakdown (the time no class is active) and for sub-parts."""
    budget_metric: str | None = None
    sub_parts: tuple[Part, ...] = ()
    """Splits of this part computed after the sweep, summing exactly to it."""


@dataclass(frozen=True)
class Hidden(_Entry):
    """Time of ``of``'s classes while a class of ``under`` is active: overlap, not in the sum."""

    of: tuple[Part, ...]
    under: tuple[Part, ...]
    short: str | None = None


@dataclass(frozen=True)
class Breakdown:
    """An ordered set of parts over one time line (the GPU's streams, the host's threads).

    ``kinds``: the ``events.kind`` values the sweep reads. ``parts``: in priority order, the last
    one claiming nothing. ``hidden``: the overlap figures reported beside them.
    """

    name: str
    kinds: tuple[str, ...]
    parts: tuple[Part, ...]
    hidden: tuple[Hidden, ...] = ()

    def __post_init__(self) -> None:
        *claiming, rest = self.parts
        if rest.claims or not all(p.claims for p in claiming):
            raise ValueError(f"{self.name}: every part but the last claims event classes; the last claims none")
        names = [e.name for e in self.entries()]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate part names in {names}")
        for p in self.parts:
            if any(s.claims or s.sub_parts for s in p.sub_parts):
                raise ValueError(f"{p.name}: sub-parts are computed after the sweep and have no sub-parts")
        for h in self.hidden:
            if not set(h.of + h.under) <= set(claiming):
                raise ValueError(f"{h.name}: hidden time is over parts of {self.name} that claim classes")

    @property
    def classes(self) -> tuple[str, ...]:
        """The sweep's classes: every claim, in priority order; the index is the class number."""
        return tuple(c for p in self.parts for c in p.claims)

    def class_ids(self, part: Part) -> tuple[int, ...]:
        """The sweep class numbers ``part`` claims."""
        start = 0
        for p in self.parts:
            if p == part:
                return tuple(range(start, start + len(p.claims)))
            start += len(p.claims)
        raise ValueError(f"{part.name} is not a part of {self.name}")

    def earlier(self, part: Part) -> tuple[Part, ...]:
        """The parts before ``part`` in priority order (they win a segment they share with it)."""
        return self.parts[: self.parts.index(part)]

    @property
    def columns(self) -> tuple[str, ...]:
        """The disjoint parts' columns: they sum to the step's ``dur_ns`` exactly."""
        return tuple(p.column for p in self.parts)

    def sub_parts(self) -> Iterator[Part]:
        """Every sub-part, parent by parent."""
        for p in self.parts:
            yield from p.sub_parts

    def leaves(self) -> Iterator[Part]:
        """The finest disjoint split: each part, or its sub-parts when it has some."""
        for p in self.parts:
            yield from p.sub_parts or (p,)

    def with_sub_parts(self) -> Iterator[Part]:
        """Each part followed by its sub-parts (the order tables show them in)."""
        for p in self.parts:
            yield p
            yield from p.sub_parts

    def entries(self) -> Iterator[Part | Hidden]:
        """Parts, hidden parts, sub-parts: the order of the breakdown table's columns."""
        yield from self.parts
        yield from self.hidden
        yield from self.sub_parts()

    @property
    def all_columns(self) -> tuple[str, ...]:
        """Every column the breakdown table has for this catalogue, in :meth:`entries` order."""
        return tuple(e.column for e in self.entries())

    def budget_metrics(self) -> dict[str, Part]:
        """Compare/budget metric name -> its part (or sub-part), in report order."""
        return {p.budget_metric: p for p in self.with_sub_parts() if p.budget_metric}


def _category(name: str) -> str:
    """Claim GPU work by its store category (``events.category``, :mod:`stepscope.store.classify`)."""
    return f"category = '{name}'"


# ---- GPU: TraceLens' gpu_timeline priority over the union of all streams ----

COMPUTE = Part(
    "compute", "compute", "a compute kernel runs (`category = compute`)",
    color="#4C78A8", short="compute", claims=(_category("compute"),), budget_metric="compute")
COMM_WAIT = Part(
    "comm_wait", "communication: waiting for peers",
    "exposed communication while the rank waits inside a collective for its last peer to arrive "
    "(per matched instance: from its start to the latest peer start, at most its duration)",
    color="#FF9DA6", short="(wait)", budget_metric="comm_wait")
COMM_TRANSFER = Part(
    "comm_transfer", "communication: transfer",
    "the rest of exposed communication (all of it when no peer's trace was matched)",
    color="#E45756", short="(transfer)", budget_metric="comm_transfer")
COMM_EXPOSED = Part(
    "comm_exposed", "exposed communication", "a communication kernel runs, no compute",
    color="#C2383A", short="comm", claims=(_category("communication"),), budget_metric="comm_exposed",
    sub_parts=(COMM_WAIT, COMM_TRANSFER))
MEMCPY_H2D_EXPOSED = Part(
    "memcpy_h2d_exposed", "exposed H2D copies", "an H2D copy runs, no compute or communication",
    color="#F58518", short="h2d", claims=(_category("memcpy_h2d"),), budget_metric="memcpy_h2d_exposed")
MEMCPY_D2H_EXPOSED = Part(
    "memcpy_d2h_exposed", "exposed D2H copies", "a D2H copy runs, none of the above",
    color="#EECA3B", short="d2h", claims=(_category("memcpy_d2h"),), budget_metric="memcpy_d2h_exposed")
MEMCPY_D2D_EXPOSED = Part(
    "memcpy_d2d_exposed", "exposed D2D copies", "a D2D (or peer) copy runs, none of the above",
    color="#B279A2", short="d2d", claims=(_category("memcpy_d2d"),), budget_metric="memcpy_d2d_exposed")
MEMCPY_OTHER_EXPOSED = Part(
    "memcpy_other_exposed", "exposed other copies", "a copy of unknown direction runs, none of the above",
    color="#9D755D", short="cp-other", claims=(_category("memcpy_other"),), budget_metric="memcpy_other_exposed")
MEMSET_EXPOSED = Part(
    "memset_exposed", "exposed memsets", "a memset runs, none of the above",
    color="#72B7B2", short="memset", claims=(_category("memset"),), budget_metric="memset_exposed")

IDLE_HOST_WAIT = Part(
    "idle_host_wait", "GPU idle: host wait",
    "idle until work whose launch began after the gap started (the host was late), or before the first / "
    "after the last GPU work",
    color="#BDBDBD", short="(host wait)")
IDLE_KERNEL_WAIT = Part(
    "idle_kernel_wait", "GPU idle: kernel wait", "idle for less than 30 us between queued work (launch latency)",
    color="#D9D9D9")
IDLE_OTHER = Part(
    "idle_other", "GPU idle: other",
    "the rest of the idle time (queued work waiting on events, other streams, syncs)",
    color="#EBEBEB")
IDLE = Part(
    "idle", "GPU idle", "nothing runs on any stream",
    color="#D3D3D3", short="idle", budget_metric="idle", sub_parts=(IDLE_HOST_WAIT, IDLE_KERNEL_WAIT, IDLE_OTHER))

COMM_OVERLAPPED = Hidden("comm_overlapped", "communication under compute",
                         "a communication kernel runs under a compute kernel",
                         of=(COMM_EXPOSED,), under=(COMPUTE,), short="(comm hidden)")
MEMCPY_OVERLAPPED = Hidden("memcpy_overlapped", "copies under compute or communication",
                           "a copy (any direction) runs under compute or communication",
                           of=(MEMCPY_H2D_EXPOSED, MEMCPY_D2H_EXPOSED, MEMCPY_D2D_EXPOSED, MEMCPY_OTHER_EXPOSED),
                           under=(COMPUTE, COMM_EXPOSED))

GPU = Breakdown(
    "gpu",
    kinds=("kernel", "memcpy", "memset"),
    parts=(COMPUTE, COMM_EXPOSED, MEMCPY_H2D_EXPOSED, MEMCPY_D2H_EXPOSED, MEMCPY_D2D_EXPOSED,
           MEMCPY_OTHER_EXPOSED, MEMSET_EXPOSED, IDLE),
    hidden=(COMM_OVERLAPPED, MEMCPY_OVERLAPPED),
)
"""GPU time of a step window over the union of all the rank's streams."""


# ---- host: over the union of all the rank's threads, inside the ProfilerStep ----

DATA_LOADING = Part(
    "data_loading", "data loading",
    "an `enumerate(DataLoader)#...` annotation is open (the TensorBoard plugin's rule)",
    color="#F58518", short="data", claims=("name LIKE 'enumerate(DataLoader)#%'",), budget_metric="data_loading")
OPTIMIZER = Part(
    "optimizer", "optimizer",
    "an `Optimizer.step#...` or `Optimizer.zero_grad#...` annotation is open, none of the above",
    color="#B279A2", short="optimizer",
    claims=("name LIKE 'Optimizer.step#%' OR name LIKE 'Optimizer.zero_grad#%'",), budget_metric="optimizer")
SYNC_WAIT = Part(
    "sync_wait", "blocked in synchronisation",
    "the host blocks in a device synchronisation (`cudaStreamSynchronize`, `cudaDeviceSynchronize`, "
    "`cudaEventSynchronize`, their `hip` and driver twins, polls), none of the above: the op that "
    "called it waits for the GPU",
    color="#9D755D", short="sync",
    claims=("kind IN ('cuda_runtime', 'cuda_driver') AND (category = 'sync' OR "
            "regexp_matches(name, '^cu(Ctx|Stream|Event)Synchronize')) AND name NOT LIKE '%StreamWaitEvent'",),
    budget_metric="sync_wait")
COMPUTE_OPS = Part(
    "compute_ops", "compute ops", "any other CPU op runs (ProfilerStep#N itself excepted), none of the above",
    color="#4C78A8", short="compute ops",
    claims=("kind = 'cpu_op' AND category IS DISTINCT FROM 'communication' AND name NOT LIKE 'ProfilerStep#%'",),
    budget_metric="compute_ops")
COMMUNICATION_WAIT = Part(
    "communication_wait", "host communication: waiting for peers",
    "exposed host communication while a host-side transfer (gloo) waits for its last peer to arrive "
    "(as `comm_wait` on the GPU)",
    color="#FF9DA6", short="(wait)")
COMMUNICATION_TRANSFER = Part(
    "communication_transfer", "host communication: transfer and enqueueing",
    "the rest of exposed host communication: the transfer itself, or enqueueing a GPU collective",
    color="#E45756", short="(transfer)")
COMMUNICATION_OPS = Part(
    "communication_ops", "exposed communication ops",
    "a communication op or annotation runs (`c10d::...`, `gloo:...`, `nccl:...`; store category "
    "`communication`), none of the above: exposed host communication",
    color="#C2383A", short="comm ops", claims=("category = 'communication'",),
    sub_parts=(COMMUNICATION_WAIT, COMMUNICATION_TRANSFER), budget_metric="communication_ops")
OTHER = Part(
    "other", "other (no op running)", "none of these on any thread (Python, framework overhead, waiting)",
    color="#D3D3D3", short="other", budget_metric="host_other")

COMMUNICATION_OVERLAPPED = Hidden("communication_overlapped", "communication ops under compute ops",
                                  "a communication op runs under a compute op",
                                  of=(COMMUNICATION_OPS,), under=(COMPUTE_OPS,))

HOST = Breakdown(
    "host",
    kinds=("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"),
    parts=(DATA_LOADING, OPTIMIZER, SYNC_WAIT, COMPUTE_OPS, COMMUNICATION_OPS, OTHER),
    hidden=(COMMUNICATION_OVERLAPPED,),
)
"""Host (CPU) time of a ProfilerStep over the union of all the rank's threads."""

PEER_WAITS: tuple[Part, ...] = (COMM_WAIT, COMMUNICATION_WAIT)
"""The sub-parts that are time waiting for peers inside collectives: known only where a rank's
collectives were matched with another traced rank's (their parts are then split, else whole)."""

BREAKDOWNS: tuple[Breakdown, ...] = (GPU, HOST)
