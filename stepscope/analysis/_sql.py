"""SQL building blocks shared by the analyses: rank filters and the interval sweep.

The sweep (``sweep_ctes``: exclusive, overlapped and idle time as exact integers) lives in
:mod:`stepscope.store.rankstats.sweep`, below both the analyses and the store's converter, which
computes each rank's tables with it at ingest; it is re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence

from stepscope.store.rankstats.breakdown import sql_list  # noqa: F401 - re-exported
from stepscope.store.rankstats.sweep import CLASS_BITS, sweep_ctes  # noqa: F401 - re-exported


def rank_filter(ranks: Sequence[int] | None, column: str = "rank") -> tuple[str, dict[str, object]]:
    """A SQL predicate restricting ``column`` to ``ranks`` (``TRUE`` when None), and its params."""
    if ranks is None:
        return "TRUE", {}
    return f"list_contains($ranks::INTEGER[], {column})", {"ranks": [int(r) for r in ranks]}


