"""Each trace's time line cut into its parts, and its step windows: what arbitrary windows and
the step timeline are split by, without reading the events.

``rank_segments`` holds, for each breakdown (:data:`stepscope.store.rankstats.parts.GPU`,
``HOST``), the maximal stretches ``[s0, s1)`` of the trace's whole time line (not only its step
windows) where each entry of :data:`STORED` holds: every part that claims events, every hidden
part and, on the GPU, the idle gaps whose cause is not the remainder (:data:`REMAINDER`). What
no stretch of a part covers is the breakdown's last part (GPU idle, host other), and idle not
stored under another cause is host wait (the gaps before the first and after the last GPU work
are host wait by HTA's rule, so a window reaching past the trace is split right too). The
stretches are the step sweep's segments merged, so summing their overlap with a window gives
what the sweep gives over that window, to the nanosecond; the waits for peers, which need the
other ranks, are split off at query time as for the step breakdowns.

``rank_step_windows`` is each step's window as the GPU breakdown uses it (on every rank, with
GPU work or not). Definitions: docs/ANALYSIS.md; tables: docs/STORE.md.
"""

from __future__ import annotations

from stepscope.store.rankstats.breakdown import exclusive, hidden_filter, sql_list
from stepscope.store.rankstats.parts import GPU, HOST, IDLE, IDLE_HOST_WAIT, Breakdown, Hidden, Part

REMAINDER: dict[Part, Part] = {IDLE: IDLE_HOST_WAIT}
"""Part -> its sub-part that is not stored: the part's time no other sub-part's stretch covers,
on a rank with GPU work (on a rank without, no cause is known and every sub-part is zero)."""


def stored_causes(breakdown: Breakdown) -> tuple[Part, ...]:
    """The sub-parts stored as stretches: the idle causes but the remainder."""
    return tuple(s for p in breakdown.parts if p in REMAINDER for s in p.sub_parts if s is not REMAINDER[p])


def stored(breakdown: Breakdown) -> tuple[Part | Hidden, ...]:
    """What ``rank_segments`` holds stretches of for ``breakdown``, in catalogue order: every
    part but the last (it claims nothing: the time the others leave), the hidden parts, and
    :func:`stored_causes`."""
    return (*breakdown.parts[:-1], *breakdown.hidden, *stored_causes(breakdown))


STORED: dict[Breakdown, tuple[Part | Hidden, ...]] = {b: stored(b) for b in (GPU, HOST)}

_SOURCE = "(SELECT source FROM events LIMIT 1)"
"""The trace's source (the views hold one trace; a trace without steps has segments too)."""


def _merged(pieces: str, label: str) -> str:
    """``part, s0, s1``: the runs of consecutive, adjacent rows of ``pieces`` (time-ordered
    ``s0, s1`` and ``label``, the part's name or null) with one part, merged. One sort and
    streaming window functions over it (as in the sweep), no partitioning; a merged stretch
    that is not the exact union of its pieces means the pass did not see them in order, and
    fails loudly."""
    return f"""
        SELECT part, min(s0) AS s0,
               CASE WHEN max(s1) - min(s0) = sum(s1 - s0) THEN max(s1) ELSE error('stretches merged out of order') END
                   AS s1
        FROM (SELECT part, s0, s1, sum(starts) OVER (ROWS UNBOUNDED PRECEDING) AS island
              FROM (SELECT part, s0, s1,
                           CASE WHEN lag(part) OVER () = part AND lag(s1) OVER () = s0 THEN 0 ELSE 1 END AS starts
                    FROM (SELECT {label} AS part, s0, s1 FROM {pieces} ORDER BY s0)))
        WHERE part IS NOT NULL
        GROUP BY part, island"""


def _time_line(breakdown: Breakdown) -> str:
    """One breakdown's stretches: the step sweep's segments over the whole trace
    (``_rs_<name>_line``, inside the step windows and outside), each given its part (and,
    separately, each hidden part where it holds), merged; plus the GPU's interior gaps of the
    stored causes."""
    b = breakdown.name
    line = f"_rs_{b}_line"
    parts = "CASE " + " ".join(f"WHEN {exclusive(breakdown, p)} THEN '{p.name}'" for p in breakdown.parts[:-1]) + " END"
    hidden = "".join(f" UNION ALL {_merged(line, f'CASE WHEN {hidden_filter(breakdown, h)} THEN {chr(39)}{h.name}{chr(39)} END')}"
                     for h in breakdown.hidden)
    causes = stored_causes(breakdown)
    gaps = (f" UNION ALL SELECT idle_cause, g0, g1 FROM _rs_{b}_gaps WHERE g0 IS NOT NULL AND g1 IS NOT NULL "
            f"AND idle_cause IN {sql_list([c.name for c in causes])}") if causes else ""
    return f"SELECT '{b}' AS breakdown, * FROM ({_merged(line, parts)}{hidden}{gaps})"


def segments_query() -> str:
    """``rank_segments``: the stretches of :data:`STORED` on the trace's GPU and host time lines,
    over the temporary tables of :data:`stepscope.store.rankstats.breakdown.PREPARE`."""
    selects = " UNION ALL ".join(_time_line(b) for b in STORED)
    return f"""
    SELECT {_SOURCE} AS source, breakdown, part, s0, s1 FROM ({selects})
    ORDER BY breakdown, s0, part
    """


def step_windows_query() -> str:
    """``rank_step_windows``: each step's GPU window (``_rs_gpu_win``: the TensorBoard plugin's
    rule, :func:`stepscope.store.rankstats.breakdown.window_ctes`), on every rank."""
    return f"""
    SELECT (SELECT any_value(source) FROM steps) AS source, step, cpu_start AS cpu_start_ns, cpu_end AS cpu_end_ns, gpu_end AS gpu_end_ns,
           w0 AS start_ns, w1 AS end_ns
    FROM _rs_{GPU.name}_win ORDER BY step
    """
