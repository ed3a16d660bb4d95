"""FLOPs of one op from the shapes the profiler recorded: the registry the analyses name.

The formulas are applied when a trace is ingested, as SQL over each op's recorded arguments, so
they live below the analyses, in :mod:`stepscope.store.rankstats.flops` (one formula per op, in
one registry, :data:`FLOP_OPS`; definitions in docs/ANALYSIS.md, "FLOPs and MFU"). This module
gives the analyses and the dashboard their names: the op families in report order, the registry,
and the causal-attention pair count.
"""

from __future__ import annotations

from stepscope.store.rankstats.flops import FAMILIES, FLOP_OPS, FlopOp, causal_pairs

__all__ = ["FAMILIES", "FLOP_OPS", "FlopOp", "causal_pairs"]
