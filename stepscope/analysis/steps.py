"""Every training step of a run, as the collector's step timer recorded it (``step_times``).

The profiler sees a few steps; the step timer sees all of them, so this is where throughput and
jitter over the whole run, and whether the profiled steps were typical, come from.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from stepscope.analysis._sql import rank_filter
from stepscope.analysis.absent import Absent, Maybe
from stepscope.analysis.sections import SQLStore

NO_STEP_TIMES = "no step_times in this run (the collector's step timer records them; ingested traces have none)"


def step_times(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[pa.Table]:
    """One row per rank and timed step: ``run, rank, step, start_ns, wall_ns, gpu_ns, profiled,
    tokens, samples, tokens_per_s, samples_per_s`` (throughput over the step's wall time; null
    when the step's count was not given). Absent when the collector timed no step of the run.
    """
    rf, extra = rank_filter(ranks)
    table = store.sql(
        f"""
        SELECT $run AS run, rank, step, start_ns, wall_ns, gpu_ns, profiled, tokens, samples,
               tokens * 1e9 / nullif(wall_ns, 0) AS tokens_per_s,
               samples * 1e9 / nullif(wall_ns, 0) AS samples_per_s
        FROM step_times WHERE run = $run AND {rf}
        ORDER BY rank, step
        """,
        {"run": run, **extra},
    )
    return table if table.num_rows else Absent(NO_STEP_TIMES)
