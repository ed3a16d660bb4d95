"""The step breakdown of one rank, as SQL generated from the part catalogue (:mod:`.parts`).

The building blocks every breakdown query is made of (the class ``CASE`` of an event, the
filters that give a segment of the sweep to its part, the parts' sums, the GPU intervals, the
step windows, the idle causes) and the per-rank tables computed from them at ingest:
``rank_step_gpu`` and ``rank_step_host`` (each step's parts, hidden parts and the sub-parts a
rank's own events decide: the idle causes) and ``rank_comm_spans`` (the time line of each
step's exposed communication, which the cross-rank split into waiting for peers and transfer
clips the waits to). The waits themselves need the other ranks (collectives matched across
ranks), so that split is left to the analyses, which read these tables instead of the events.
Definitions: docs/ANALYSIS.md; tables: docs/STORE.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from stepscope.store.rankstats.parts import (
    BREAKDOWNS,
    COMM_EXPOSED,
    COMPUTE,
    GPU,
    HOST,
    IDLE,
    IDLE_HOST_WAIT,
    IDLE_KERNEL_WAIT,
    IDLE_OTHER,
    PEER_WAITS,
    Breakdown,
    Hidden,
    Part,
)
from stepscope.store.rankstats.sweep import sweep_ctes


def sql_list(values: Sequence[str]) -> str:
    """``('a', 'b')``: a SQL list literal of names the code itself defines (never user input)."""
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


GPU_KINDS_SQL = sql_list(GPU.kinds)

KERNEL_WAIT_NS = 30_000
"""HTA's ``consecutive_kernel_delay`` default (30 us): shorter gaps are launch latency."""

# ---- SQL generated from the catalogue (stepscope.store.rankstats.parts) ----


def ns_column(expr: str, name: str) -> str:
    return f"coalesce({expr}, 0)::BIGINT AS {name}"


def class_case(breakdown: Breakdown, *, otherwise: str) -> str:
    """``CASE``: an ``events`` row -> its sweep class number (the first claim it matches)."""
    whens = " ".join(f"WHEN ({claim}) THEN {i}" for i, claim in enumerate(breakdown.classes))
    return f"CASE {whens} ELSE {otherwise} END"


def active(breakdown: Breakdown, parts: Sequence[Part]) -> str:
    """Filter: a class claimed by one of ``parts`` is active in the segment."""
    ids = [i for p in parts for i in breakdown.class_ids(p)]
    return "(" + " OR ".join(f"n{i} > 0" for i in ids) + ")"


def exclusive(breakdown: Breakdown, part: Part) -> str:
    """Filter: the segment belongs to ``part``: one of its classes is active and no class of an
    earlier part is; for the last part (it claims nothing), no class at all is active."""
    if not part.claims:
        return "NOT busy"
    earlier = [f"n{i} = 0" for p in breakdown.earlier(part) for i in breakdown.class_ids(p)]
    return " AND ".join([*earlier, active(breakdown, [part])])


def hidden_filter(breakdown: Breakdown, hidden: Hidden) -> str:
    """Filter: a class of ``hidden.of`` is active under a class of ``hidden.under``."""
    return f"{active(breakdown, hidden.under)} AND {active(breakdown, hidden.of)}"


def part_sums(breakdown: Breakdown) -> list[str]:
    """``SELECT`` items over the sweep's ``seg``: each part's and each hidden part's time."""
    return [
        *(ns_column(f"sum(len) FILTER ({exclusive(breakdown, p)})", p.column) for p in breakdown.parts),
        *(ns_column(f"sum(len) FILTER ({hidden_filter(breakdown, h)})", h.column) for h in breakdown.hidden),
    ]


# HTA's loader (``Trace._filter_irrelevant_gpu_kernels``, default ``include_last_profiler_step=False``)
# keeps only GPU work whose launch is recorded and started before the last ProfilerStep began,
# and applies this only when the trace has at least two steps.
HTA_SCOPE = """
    AND (
        (SELECT count(*) FROM steps s WHERE s.run = $run AND s.rank = e.rank) < 2
        OR EXISTS (
            SELECT 1 FROM events r
            WHERE r.run = $run AND r.rank = e.rank AND r.source = e.source
              AND r.correlation = e.correlation AND r.kind IN ('cuda_runtime', 'cuda_driver')
              AND r.ts_ns < (SELECT max(s.start_ns) FROM steps s WHERE s.run = $run AND s.rank = e.rank)
        )
    )"""
"""That rule as a filter on the run's ``events e``, any ranks (:func:`gpu_cte`)."""

HTA_KEPT = f"""
_hta_steps AS (SELECT count(*) AS steps, max(start_ns) AS last_start FROM steps WHERE run = $run),
_hta_launched AS (
    SELECT DISTINCT correlation FROM events
    WHERE run = $run AND kind IN ('cuda_runtime', 'cuda_driver') AND correlation IS NOT NULL
      AND ts_ns < (SELECT last_start FROM _hta_steps)
),
gpu AS (
    SELECT * FROM _rs_{GPU.name}_gpu
    WHERE (SELECT steps FROM _hta_steps) < 2 OR correlation IN (SELECT correlation FROM _hta_launched)
)"""
"""CTE ``gpu``: the trace's GPU work (``_rs_gpu_gpu`` of :data:`PREPARE`) that HTA's loader keeps
(:data:`HTA_SCOPE`, at ingest). The views hold one trace (one rank, one source), so a launch
matches on its correlation id alone; as uncorrelated lookups the planner takes milliseconds (the
correlated ``EXISTS`` per event took it ~0.1-0.3 s)."""


def gpu_cte(rf: str, *, hta_scope: bool = False) -> str:
    """``gpu``: every GPU interval of the run with positive duration and its class number.

    GPU work that no part of :data:`stepscope.store.rankstats.parts.GPU` claims is an ingest bug and
    fails the query loudly instead of being counted somewhere. ``hta_scope`` restricts the
    events to those HTA keeps (over the run's views; ingest uses :data:`HTA_KEPT`).
    """
    cls = class_case(GPU, otherwise="error('GPU event with unexpected category ' || coalesce(category, 'NULL'))")
    return f"""
gpu AS MATERIALIZED (
    SELECT rank, source, ts_ns AS t0, ts_ns + dur_ns AS t1, step, correlation,
           {cls} AS cls
    FROM events e
    WHERE run = $run AND kind IN {GPU_KINDS_SQL} AND dur_ns > 0 AND {rf}{HTA_SCOPE if hta_scope else ""}
)"""


def window_ctes(rf: str) -> str:
    """``win(rank, step, cpu_start, cpu_end, gpu_end, w0, w1)``: the step windows.

    TensorBoard plugin rule: ``w0 = max(cpu_start, previous w1)``,
    ``w1 = max(cpu_end, end of the step's GPU work, w0)``. Unrolled, ``w1`` is the running
    maximum of ``reach = max(cpu_end, gpu_end)`` over the rank's steps so far, and ``w0`` is
    ``max(cpu_start, running max before this step)``: window functions, no recursion.
    """
    return f"""
_cpu_steps AS (
    SELECT rank, step, start_ns AS cpu_start, end_ns AS cpu_end
    FROM steps WHERE run = $run AND {rf}
),
_gpu_step_end AS (
    SELECT rank, step, max(t1) AS gpu_end FROM gpu WHERE step IS NOT NULL GROUP BY rank, step
),
_reach AS (
    SELECT c.*, g.gpu_end, greatest(c.cpu_end, coalesce(g.gpu_end, c.cpu_end)) AS reach
    FROM _cpu_steps c LEFT JOIN _gpu_step_end g USING (rank, step)
),
win AS MATERIALIZED (
    SELECT rank, step, cpu_start, cpu_end, gpu_end,
           greatest(cpu_start, coalesce(max(reach) OVER before, cpu_start)) AS w0,
           max(reach) OVER upto AS w1
    FROM _reach
    WINDOW before AS (PARTITION BY rank ORDER BY cpu_start, step
                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
           upto AS (PARTITION BY rank ORDER BY cpu_start, step ROWS UNBOUNDED PRECEDING)
)"""


IDLE_CAUSE_RULES: dict[Part, str] = {
    IDLE_HOST_WAIT: "g.g0 IS NULL OR g.g1 IS NULL OR l.launch_ns > g.g0",
    IDLE_KERNEL_WAIT: f"g.g1 - g.g0 < {KERNEL_WAIT_NS}",
    IDLE_OTHER: "TRUE",
}
"""HTA's idle causes, in order: the first that holds for a gap ``[g0, g1)`` of the rank's GPU
time line (``l.launch_ns``: when the work ending the gap was launched) names the gap's cause."""


def gap_ctes() -> str:
    """CTEs ending in ``_caused(rank, g0, g1, idle_cause)``: every gap between the rank's GPU work
    (``gpu``; ``g0`` null before the first, ``g1`` null after the last) with its HTA cause."""
    if set(IDLE_CAUSE_RULES) != set(IDLE.sub_parts):
        raise ValueError("the idle-cause rules and the sub-parts of stepscope.store.rankstats.parts.IDLE differ")
    causes = " ".join(f"WHEN ({rule}) THEN '{cause.name}'" for cause, rule in IDLE_CAUSE_RULES.items())
    return f"""
    _launch AS (
        SELECT g.rank, g.t0, min(r.ts_ns) AS launch_ns
        FROM gpu g JOIN events r
          ON r.run = $run AND r.rank = g.rank AND r.source = g.source
         AND r.correlation = g.correlation AND r.kind IN ('cuda_runtime', 'cuda_driver')
        GROUP BY g.rank, g.t0
    ),
    _prev_ord AS (SELECT rank, t0, t1 FROM gpu ORDER BY rank, t0, t1),
    _prev_run AS (
        -- (rank, end) packed as rank * 2^64 + end: one integer running max orders by rank first
        SELECT rank, t0, max((rank::HUGEINT << 64) + t1) OVER (ROWS UNBOUNDED PRECEDING) AS upto
        FROM _prev_ord
    ),
    _prev AS (
        -- end of all earlier work on the rank: one sorted streaming pass over all ranks; the
        -- packed maximum belongs to the current rank as soon as the rank has a row
        SELECT rank, t0,
            CASE WHEN (lag(upto) OVER ()) >> 64 = rank THEN ((lag(upto) OVER ()) & 18446744073709551615)::BIGINT END
                AS prev_end
        FROM _prev_run
    ),
    _gaps AS (
        SELECT DISTINCT rank, prev_end AS g0, t0 AS g1 FROM _prev WHERE prev_end IS NULL OR t0 > prev_end
        UNION ALL
        SELECT rank, max(t1), NULL FROM gpu GROUP BY rank
    ),
    _caused AS (
        SELECT g.rank, g.g0, g.g1,
            CASE {causes} END AS idle_cause
        FROM _gaps g LEFT JOIN _launch l ON l.rank = g.rank AND l.t0 = g.g1
    )"""


def _idle_clip() -> str:
    """CTEs ending in ``_split_idle(rank, step, <idle sub-part columns>)``: the gaps of
    ``_caused`` (:func:`gap_ctes`) clipped to the windows ``win``, summed per cause."""
    return f"""
    _idle AS (
        SELECT w.rank, w.step, c.idle_cause,
               least(coalesce(c.g1, w.w1), w.w1) - greatest(coalesce(c.g0, w.w0), w.w0) AS len
        FROM _caused c JOIN win w
          ON c.rank = w.rank AND coalesce(c.g0, w.w0) < w.w1 AND coalesce(c.g1, w.w1) > w.w0
    ),
    _split_{IDLE.name} AS (
        SELECT rank, step,
            {", ".join(ns_column(f"sum(len) FILTER (idle_cause = '{c.name}')", c.column) for c in IDLE.sub_parts)}
        FROM _idle GROUP BY rank, step
    )"""


def idle_split() -> str:
    """CTEs ending in ``_split_idle(rank, step, <idle sub-part columns>)``: every gap between the
    rank's GPU work (unclipped by windows) gets its cause, then is clipped to the step windows."""
    return f"{gap_ctes()}, {_idle_clip()}"


def prepared_idle_split() -> str:
    """:func:`idle_split` at ingest, from the gaps :data:`PREPARE` computed once (``_rs_gpu_gaps``)."""
    return f"_caused AS (FROM _rs_{GPU.name}_gaps), {_idle_clip()}"


def iv_ctes(breakdown: Breakdown, rf: str) -> str:
    """The sweep's intervals ``iv(rank, t0, t1, cls)`` of a breakdown (and, for the GPU, ``gpu``)."""
    if breakdown is GPU:
        return f"{gpu_cte(rf)}, iv AS (SELECT rank, t0, t1, cls FROM gpu)"
    claimed = " OR ".join(f"({claim})" for claim in breakdown.classes)
    return f"""
    iv AS (
        SELECT rank, ts_ns AS t0, ts_ns + dur_ns AS t1, {class_case(breakdown, otherwise="NULL")} AS cls
        FROM events
        WHERE run = $run AND {rf} AND dur_ns > 0 AND kind IN {sql_list(breakdown.kinds)} AND ({claimed})
    )"""




def step_window_ctes(breakdown: Breakdown, rf: str) -> str:
    """CTEs ending in ``win(rank, step, w0, w1, ...)``, the windows a breakdown splits: the GPU's
    step windows (:func:`window_ctes`, reads ``gpu``), the host's ProfilerStep CPU windows. The
    sweep needs disjoint windows: a ProfilerStep that starts before an earlier one of its rank
    ended (nested steps, seen in hand-made traces) starts where that one ended, as on the GPU."""
    if breakdown is GPU:
        return window_ctes(rf)
    return f"""
_host_steps AS (
    SELECT rank, step, start_ns, end_ns,
           max(end_ns) OVER (PARTITION BY rank ORDER BY start_ns, step
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM steps WHERE run = $run AND {rf}
),
win AS MATERIALIZED (
    SELECT rank, step, greatest(start_ns, coalesce(prev_end, start_ns)) AS w0,
           greatest(end_ns, coalesce(prev_end, start_ns)) AS w1
    FROM _host_steps
)"""


# ---- the per-rank tables: each step's parts, and where its exposed communication lies ----

RANK_SPLITS = {IDLE: idle_split}
"""Sub-part splits that a rank's own events decide (the idle causes), computed at ingest. The
other splits (waiting for peers) need collectives matched across ranks: the analyses do them."""

PREPARED_SPLITS = {IDLE: prepared_idle_split}
""":data:`RANK_SPLITS` as ingest runs them, over the temporary tables of :data:`PREPARE`."""

WAIT_SPLIT_PARTS: tuple[Part, ...] = tuple(
    p for b in BREAKDOWNS for p in b.parts if set(p.sub_parts) & set(PEER_WAITS))
"""The parts split into waiting for peers and transfer: their time line is ``rank_comm_spans``."""

WINDOW_COLUMNS: dict[Breakdown, tuple[tuple[str, str], ...]] = {
    GPU: (("start_ns", "w.w0"), ("end_ns", "w.w1"), ("dur_ns", "w.w1 - w.w0"),
          ("cpu_start_ns", "w.cpu_start"), ("cpu_dur_ns", "w.cpu_end - w.cpu_start")),
    HOST: (("start_ns", "w.w0"), ("end_ns", "w.w1"), ("dur_ns", "w.w1 - w.w0")),
}
"""Each stored breakdown's window columns (name, SQL over ``win w``), after ``source, step``."""


def stored_columns(breakdown: Breakdown) -> tuple[str, ...]:
    """The breakdown columns ``rank_step_<name>`` holds: parts, hidden parts, and the sub-parts
    of :data:`RANK_SPLITS` (in the catalogue's order)."""
    ranked = {s for p in RANK_SPLITS for s in p.sub_parts}
    return tuple(e.column for e in breakdown.entries() if not isinstance(e, Part) or e in breakdown.parts
                 or e in ranked)


def _prepared(breakdown: Breakdown) -> str:
    """The CTEs a stored breakdown reads, from the temporary tables of :data:`PREPARE`."""
    b = breakdown.name
    gpu = f"gpu AS (FROM _rs_{b}_gpu), " if breakdown is GPU else ""
    return f"{gpu}win AS (FROM _rs_{b}_win), seg AS (FROM _rs_{b}_seg)"


def _prepare(breakdown: Breakdown) -> tuple[str, ...]:
    """Statements making one trace's intervals, windows and sweep of ``breakdown`` temporary
    tables: the sweep runs once for the parts, the spans of exposed communication and the whole
    time line (``_rs_<name>_line``: its segments outside the step windows too, for
    ``rank_segments``; ``_rs_<name>_seg``: those inside)."""
    b = breakdown.name
    if breakdown is GPU:
        intervals = (f"CREATE OR REPLACE TEMP TABLE _rs_{b}_gpu AS WITH {gpu_cte('TRUE')} SELECT * FROM gpu",
                     f"CREATE OR REPLACE TEMP TABLE _rs_{b}_iv AS SELECT rank, t0, t1, cls FROM _rs_{b}_gpu",
                     f"CREATE OR REPLACE TEMP TABLE _rs_{b}_gaps AS WITH gpu AS (FROM _rs_{b}_gpu), {gap_ctes()} "
                     "SELECT * FROM _caused")
        reads_gpu = f"gpu AS (FROM _rs_{b}_gpu), "
    else:
        intervals = (f"CREATE OR REPLACE TEMP TABLE _rs_{b}_iv AS WITH {iv_ctes(breakdown, 'TRUE')} SELECT * FROM iv",)
        reads_gpu = ""
    return (
        *intervals,
        f"CREATE OR REPLACE TEMP TABLE _rs_{b}_win AS WITH {reads_gpu}{step_window_ctes(breakdown, 'TRUE')} "
        "SELECT * FROM win",
        f"CREATE OR REPLACE TEMP TABLE _rs_{b}_line AS WITH iv AS (FROM _rs_{b}_iv), win AS (FROM _rs_{b}_win), "
        f"{sweep_ctes(len(breakdown.classes), outside=True)} SELECT * FROM seg",
        f"CREATE OR REPLACE TEMP VIEW _rs_{b}_seg AS SELECT * EXCLUDE (inwin) FROM _rs_{b}_line WHERE inwin > 0",
    )


PREPARE: tuple[str, ...] = tuple(s for b in BREAKDOWNS for s in _prepare(b))
"""Run (with ``$run``) over one trace's views before the tables below are written."""

_SOURCE = "(SELECT any_value(source) FROM steps)"
"""The trace's source (the views hold one trace)."""


def rank_step_query(breakdown: Breakdown) -> str:
    """``rank_step_<name>``: one row per step of the trace (GPU: of a rank with GPU work) with
    its window and :func:`stored_columns`."""
    splits = [p for p in breakdown.parts if p in PREPARED_SPLITS]
    split_ctes = "".join("," + PREPARED_SPLITS[p]() for p in splits)
    joins = " ".join(f"LEFT JOIN _split_{p.name} USING (rank, step)" for p in splits)
    split_columns = {s.column: f"_split_{p.name}.{s.column}" for p in splits for s in p.sub_parts}
    columns = [f"coalesce({split_columns.get(c, 'p.' + c)}, 0)::BIGINT AS {c}" for c in stored_columns(breakdown)]
    windows = [f"{sql} AS {name}" for name, sql in WINDOW_COLUMNS[breakdown]]
    where = "w.rank IN (SELECT DISTINCT rank FROM gpu)" if breakdown is GPU else "TRUE"
    return f"""
    WITH {_prepared(breakdown)},
    _parts AS (SELECT rank, step, {", ".join(part_sums(breakdown))} FROM seg GROUP BY rank, step){split_ctes}
    SELECT {_SOURCE} AS source, w.step, {", ".join(windows)}, {", ".join(columns)}
    FROM win w LEFT JOIN _parts p USING (rank, step) {joins}
    WHERE {where}
    ORDER BY w.step
    """


def _breakdown_of(part: Part) -> Breakdown:
    return next(b for b in BREAKDOWNS if part in b.parts)


def comm_spans_query() -> str:
    """``rank_comm_spans``: the stretches ``[s0, s1)`` of each step where a part of
    :data:`WAIT_SPLIT_PARTS` holds (adjacent segments of the sweep merged)."""
    selects = []
    for part in WAIT_SPLIT_PARTS:
        b = _breakdown_of(part)
        selects.append(f"""
    SELECT '{part.name}' AS part, step, min(s0) AS s0, max(s1) AS s1
    FROM (SELECT step, s0, s1, sum(CASE WHEN s0 = prev_s1 THEN 0 ELSE 1 END)
                 OVER (PARTITION BY step ORDER BY s0 ROWS UNBOUNDED PRECEDING) AS island
          FROM (SELECT step, s0, s1, lag(s1) OVER (PARTITION BY step ORDER BY s0) AS prev_s1
                FROM _rs_{b.name}_seg WHERE {exclusive(b, part)}))
    GROUP BY step, island""")
    return f"""
    SELECT {_SOURCE} AS source, part, step, s0, s1 FROM ({" UNION ALL ".join(selects)})
    ORDER BY part, s0
    """


def spans_of(part: Part) -> str:
    """CTE ``_spans_<part>(rank, step, s0, s1)`` over the sweep ``seg`` of a query over events:
    the segments where ``part`` holds (what ``rank_comm_spans`` stores, unmerged)."""
    return f"_spans_{part.name} AS (SELECT rank, step, s0, s1 FROM seg WHERE {exclusive(_breakdown_of(part), part)})"


TOTAL_SCOPES = {"all": False, "hta": True}
"""``rank_gpu_totals.scope`` -> whether only the GPU work HTA's loader keeps counts
(:data:`HTA_KEPT`)."""


def _gpu_totals(scope: str) -> str:
    """One row (none without GPU work) of the whole-trace GPU totals of ``scope``."""
    compute, comm = active(GPU, [COMPUTE]), active(GPU, [COMM_EXPOSED])
    gpu = HTA_KEPT if TOTAL_SCOPES[scope] else f"gpu AS (FROM _rs_{GPU.name}_gpu)"
    return f"""
    SELECT * FROM (
        WITH {gpu},
        win AS (SELECT rank, 0 AS step, min(t0) AS w0, max(t1) AS w1 FROM gpu GROUP BY rank),
        iv AS (SELECT rank, t0, t1, cls FROM gpu),
        {sweep_ctes(len(GPU.classes))},
        _tot AS (
            SELECT rank,
                {ns_column("sum(len) FILTER (busy)", "gpu_busy_ns")},
                {ns_column(f"sum(len) FILTER ({compute})", "compute_ns")},
                {ns_column(f"sum(len) FILTER ({comm})", "comm_ns")},
                {ns_column(f"sum(len) FILTER ({compute} AND {comm})", "comm_comp_overlap_ns")}
            FROM seg GROUP BY rank
        )
        SELECT '{scope}' AS scope, w.w0 AS gpu_start_ns, w.w1 AS gpu_end_ns, (SELECT count(*) FROM gpu) AS gpu_events,
               t.gpu_busy_ns, t.compute_ns, t.comm_ns, t.comm_comp_overlap_ns
        FROM win w JOIN _tot t USING (rank)
    )"""


def gpu_totals_query() -> str:
    """``rank_gpu_totals``: the trace's whole-trace GPU figures (HTA's temporal breakdown and
    communication/compute overlap), once over all its GPU work and once over what HTA keeps."""
    selects = " UNION ALL ".join(_gpu_totals(scope) for scope in TOTAL_SCOPES)
    return f"SELECT (SELECT source FROM events LIMIT 1) AS source, * FROM ({selects}) ORDER BY scope"
