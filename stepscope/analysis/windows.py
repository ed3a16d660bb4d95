"""The profiled windows of a run: the scheduled one(s) and the captures the watch triggered.

A window is one trace per rank (its ``ProfilerStep#N`` range, from the store's ``windows``
view); a capture carries its trigger from the ``captures`` table: what was slow, on which rank,
at which step, and by how much. Windows are listed across ranks: one row per distinct window,
with the number of ranks that recorded it, so a coordinated capture is one row with every rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from stepscope.analysis._sql import rank_filter
from stepscope.analysis.absent import Absent, Maybe
from stepscope.analysis.sections import SQLStore, section

NO_WINDOWS = "no ProfilerStep#N windows in the traces of this run (or of the ranks asked for)"


def profiled_windows(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[pa.Table]:
    """One row per window in step order: ``run, kind`` (``schedule`` or ``capture``),
    ``first_step, last_step, ranks`` (how many recorded it), ``trigger_kind, trigger_rank,
    trigger_step, observed_ns, reference_ns``, ``slow_ratio`` (observed / reference),
    ``agreed_step`` (where the ranks agreed) and ``latency_steps`` (first recorded step minus
    the trigger step); trigger columns are null for scheduled windows."""
    rf, extra = rank_filter(ranks)
    table = store.sql(
        f"""
        SELECT $run AS run, kind, first_step, last_step, count(DISTINCT rank) AS ranks,
               trigger_kind, trigger_rank, trigger_step, observed_ns, reference_ns,
               observed_ns / nullif(reference_ns, 0) AS slow_ratio, agreed_step,
               first_step - trigger_step AS latency_steps
        FROM windows WHERE run = $run AND {rf}
        GROUP BY ALL
        ORDER BY first_step, last_step, kind
        """,
        {"run": run, **extra},
    )
    return table if table.num_rows else Absent(NO_WINDOWS)


@section("windows", order=15, to_json=lambda t: [
    {k: v for k, v in row.items() if k != "run"} for row in t.to_pylist()])
def windows_section(store: SQLStore, run: str, ranks: Sequence[int] | None) -> Maybe[pa.Table]:
    """The profiled windows: scheduled ones and captures with their triggers."""
    return profiled_windows(store, run, ranks)
