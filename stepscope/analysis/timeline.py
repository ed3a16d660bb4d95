"""One step across ranks, over time: what each rank's GPU (or host) did from moment to moment.

The dashboard's cross-rank timeline draws it: a lane per rank, each lane cut into the step's
parts (:mod:`stepscope.store.rankstats.parts`: compute, communication waiting for peers and transfer,
copies, idle; the host's parts on a run without GPU events) by the same sweep as the step
breakdown, with the waits of :mod:`stepscope.analysis.matching` as one more class, so a
segment of exposed communication is a wait where a wait interval covers it and a transfer
elsewhere. Times are clock-aligned (each rank's ``clock_correction_ns`` subtracted) so that the
lanes line up. Definitions: docs/ANALYSIS.md, "Step timeline".
"""

from __future__ import annotations

import pyarrow as pa

from stepscope.analysis._sql import rank_filter, sweep_ctes
from stepscope.analysis.absent import Absent, Maybe
from stepscope.store.rankstats.breakdown import exclusive, iv_ctes, window_ctes
from stepscope.analysis.cache import cached_frame
from stepscope.analysis.matching import collective_ctes, ranks_with_collectives
from stepscope.store.rankstats.parts import COMM_EXPOSED, COMMUNICATION_OPS, GPU, HOST, Breakdown, Part
from stepscope.analysis.sections import SQLStore

_SPLIT_BY_WAITS: dict[Breakdown, Part] = {GPU: COMM_EXPOSED, HOST: COMMUNICATION_OPS}
"""The part of each breakdown whose segments waits split into its two sub-parts."""


def timeline_parts(breakdown: Breakdown) -> tuple[Part, ...]:
    """The parts a lane is cut into: the breakdown's parts, exposed communication split into
    waiting and transfer (idle stays whole: its causes come from the gaps around it, not from
    the moment)."""
    split = _SPLIT_BY_WAITS[breakdown]
    return tuple(q for p in breakdown.parts for q in (p.sub_parts if p is split else (p,)))


def _part_case(breakdown: Breakdown, wait_class: int) -> str:
    """``CASE``: a segment of the sweep -> the name of the leaf it belongs to."""
    whens = []
    split = _SPLIT_BY_WAITS[breakdown]
    wait, transfer = split.sub_parts
    for part in breakdown.parts:
        if part is split:
            whens.append(f"WHEN {exclusive(breakdown, part)} AND n{wait_class} > 0 THEN '{wait.name}'")
            whens.append(f"WHEN {exclusive(breakdown, part)} THEN '{transfer.name}'")
        else:
            whens.append(f"WHEN {exclusive(breakdown, part)} THEN '{part.name}'")
    return "CASE " + " ".join(whens) + " END"


@cached_frame("step_timeline")
def step_timeline(store: SQLStore, run: str, step: int, ranks: None = None) -> Maybe[pa.Table]:
    """Per rank, the step ``step`` as consecutive segments of one part: ``run, rank, part, t0_ns,
    t1_ns, dur_ns`` (``t0_ns``/``t1_ns`` clock-aligned, absolute), and ``breakdown`` (``gpu``, or
    ``host`` on a run without GPU events). Consecutive elementary segments of one part are merged;
    ``idle`` (GPU) and ``other`` (host) are the time nothing runs."""
    has_gpu = store.sql("SELECT count(*) AS n FROM events WHERE run = $run AND kind = 'kernel'",
                        {"run": run}).to_pylist()[0]["n"] > 0
    breakdown = GPU if has_gpu else HOST
    rf, extra = rank_filter(None)
    if breakdown is GPU:
        win = f"{window_ctes(rf)}, _win_step AS (SELECT rank, step, w0, w1 FROM win WHERE step = $step)"
    else:
        win = ("_win_step AS (SELECT rank, step, start_ns AS w0, end_ns AS w1 FROM steps "
               "WHERE run = $run AND step = $step)")
    wait_class = len(breakdown.classes)
    side = "" if breakdown is HOST else "NOT "
    # with fewer than two ranks with collectives nothing is matched: no waits, no clock corrections
    coll = collective_ctes() if ranks_with_collectives(store, run) >= 2 else (
        "coll AS (SELECT NULL::BIGINT AS rank, NULL::BIGINT AS ts_ns, NULL::BIGINT AS wait_ns, "
        "NULL::BOOLEAN AS host_side, NULL::BIGINT AS clock_correction_ns WHERE FALSE)")
    query = f"""
    WITH {iv_ctes(breakdown, rf)},
    {win},
    {coll},
    _iv_all AS (
        SELECT rank, t0, t1, cls FROM iv
        WHERE t1 > (SELECT min(w0) FROM _win_step) AND t0 < (SELECT max(w1) FROM _win_step)
        UNION ALL
        SELECT rank, ts_ns, ts_ns + wait_ns, {wait_class} FROM coll WHERE {side}host_side AND wait_ns > 0
    ),
    {sweep_ctes(wait_class + 1, iv="_iv_all", win="_win_step")},
    _parts AS (SELECT rank, s0, s1, {_part_case(breakdown, wait_class)} AS part FROM seg),
    _starts AS (
        SELECT *, CASE WHEN lag(part) OVER w = part AND lag(s1) OVER w = s0 THEN 0 ELSE 1 END AS starts
        FROM _parts WINDOW w AS (PARTITION BY rank ORDER BY s0)
    ),
    _runs AS (
        SELECT *, sum(starts) OVER (PARTITION BY rank ORDER BY s0 ROWS UNBOUNDED PRECEDING) AS piece FROM _starts
    ),
    _corr AS (SELECT DISTINCT rank, clock_correction_ns FROM coll)
    SELECT $run AS run, r.rank, r.part, min(r.s0) - coalesce(any_value(c.clock_correction_ns), 0) AS t0_ns,
           max(r.s1) - coalesce(any_value(c.clock_correction_ns), 0) AS t1_ns, max(r.s1) - min(r.s0) AS dur_ns,
           '{breakdown.name}' AS breakdown
    FROM _runs r LEFT JOIN _corr c USING (rank)
    GROUP BY r.rank, r.part, r.piece
    ORDER BY r.rank, t0_ns
    """
    table = store.sql(query, {"run": run, "step": int(step), **extra})
    if table.num_rows == 0:
        return Absent(f"step {step} has no window on any rank of this run")
    return table


@cached_frame("late_marks")
def late_marks(store: SQLStore, run: str, step: int, ranks: None = None) -> pa.Table:
    """The late arrivals of ``step``: every member of a valid instance that arrived late
    (:mod:`stepscope.analysis.matching`) while others waited: ``rank, collective, t_ns`` (its
    clock-aligned start), ``others_wait_ns`` (the other members' summed waits at that instance)."""
    if ranks_with_collectives(store, run) < 2:
        return pa.table({"rank": pa.array([], pa.int64()), "collective": pa.array([], pa.string()),
                         "t_ns": pa.array([], pa.int64()), "others_wait_ns": pa.array([], pa.int64())})
    query = f"""
    WITH {collective_ctes()}
    SELECT c.rank, c.collective, c.aligned_ts_ns AS t_ns,
           (SELECT sum(o.wait_ns) FROM coll o WHERE o.inst_id = c.inst_id AND NOT o.late)::BIGINT AS others_wait_ns
    FROM coll c
    WHERE c.step = $step AND c.late AND c.valid
    ORDER BY c.aligned_ts_ns, c.rank
    """
    return store.sql(query, {"run": run, "step": int(step)})
