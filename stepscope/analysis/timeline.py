"""One step across ranks, over time: what each rank's GPU (or host) did from moment to moment.

The dashboard's cross-rank timeline draws it: a lane per rank, each lane cut into the step's
parts (:mod:`stepscope.store.rankstats.parts`: compute, communication waiting for peers and transfer,
copies, idle; the host's parts on a run without GPU work) from the rank's time line stored at
ingest (``rank_segments``: the step breakdown's sweep, merged), clipped to the step's window,
with the waits of :mod:`stepscope.analysis.matching` cut out of it: a stretch of exposed
communication is a wait where a wait covers it and a transfer elsewhere. Times are
clock-aligned (each rank's ``clock_correction_ns`` subtracted) so that the lanes line up.
Definitions: docs/ANALYSIS.md, "Step timeline".
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from stepscope.analysis._sql import rank_filter
from stepscope.analysis.absent import Absent, Maybe
from stepscope.analysis.breakdown import segment_cuts, wait_island_ctes
from stepscope.analysis.cache import cached_frame
from stepscope.analysis.matching import matched_ctes, ranks_with_collectives
from stepscope.store.rankstats.breakdown import sql_list
from stepscope.store.rankstats.parts import COMM_EXPOSED, COMMUNICATION_OPS, GPU, HOST, Breakdown, Part
from stepscope.store.rankstats.segments import STORED, stored_causes
from stepscope.analysis.sections import SQLStore

_SPLIT_BY_WAITS: dict[Breakdown, Part] = {GPU: COMM_EXPOSED, HOST: COMMUNICATION_OPS}
"""The part of each breakdown whose segments waits split into its two sub-parts."""


def timeline_parts(breakdown: Breakdown) -> tuple[Part, ...]:
    """The parts a lane is cut into: the breakdown's parts, exposed communication split into
    waiting and transfer (idle stays whole: its causes come from the gaps around it, not from
    the moment)."""
    split = _SPLIT_BY_WAITS[breakdown]
    return tuple(q for p in breakdown.parts for q in (p.sub_parts if p is split else (p,)))


def _holes(out: str, frames: str, pieces: str, key: str) -> str:
    """CTE ``out(<key>, s0, s1)``: the stretches of each frame ``frames(<key>, w0, w1)`` that no
    piece of ``pieces(<key>, s0, s1)`` covers (the pieces are disjoint and inside their frame)."""
    return f"""
    {out} AS (
        SELECT {key}, s0, s1 FROM (
            SELECT {key}, coalesce(lag(m.s1) OVER (PARTITION BY {key} ORDER BY m.s0, m.s1), f.w0) AS s0, m.s0 AS s1
            FROM (SELECT {key}, s0, s1 FROM {pieces} UNION ALL SELECT {key}, w1, w1 FROM {frames}) m
            JOIN {frames} f USING ({key})
        ) WHERE s1 > s0
    )"""


def _leaf_ctes(breakdown: Breakdown) -> str:
    """CTEs ending in ``_parts(rank, s0, s1, part)``: the step's windows ``_win_step`` cut into
    the parts of :func:`timeline_parts`, from the stored stretches (``_cut``) and the waits of
    ``coll``: the stored causes of idle are idle again, the part the waits split is a wait where
    a wait island covers it and a transfer elsewhere, and the time no stretch covers is the
    breakdown's last part (idle, other)."""
    split = _SPLIT_BY_WAITS[breakdown]
    wait, transfer = split.sub_parts
    whens = " ".join(f"WHEN '{c.name}' THEN '{p.name}'" for p in breakdown.parts for c in p.sub_parts
                     if c in stored_causes(breakdown))
    as_part = f"CASE part {whens} ELSE part END" if whens else "part"
    parts = sql_list([e.name for e in STORED[breakdown] if e in breakdown.parts or e in stored_causes(breakdown)])
    return f"""
    _pieces AS (
        SELECT rank, step, {as_part} AS part, s0, s1 FROM _cut WHERE part IN {parts}
    ),
    {wait_island_ctes(breakdown is HOST, "_win_step")},
    _split AS (SELECT rank, step, s0 AS f0, s0 AS w0, s1 AS w1 FROM _pieces WHERE part = '{split.name}'),
    _waits AS (
        SELECT p.rank, p.step, p.w0 AS f0, greatest(p.w0, i.t0) AS s0, least(p.w1, i.t1) AS s1
        FROM _split p JOIN _wait_islands i ON i.rank = p.rank AND i.t0 < p.w1 AND i.t1 > p.w0
    ),
    {_holes("_transfers", "_split", "_waits", "rank, step, f0")},
    {_holes("_rest", "_win_step", "_pieces", "rank, step")},
    _parts AS (
        SELECT rank, s0, s1, part FROM _pieces WHERE part <> '{split.name}'
        UNION ALL SELECT rank, s0, s1, '{wait.name}' FROM _waits
        UNION ALL SELECT rank, s0, s1, '{transfer.name}' FROM _transfers
        UNION ALL SELECT rank, s0, s1, '{breakdown.parts[-1].name}' FROM _rest
    )"""


def lanes(breakdown: Breakdown) -> str:
    """The end of a timeline query: the pieces of ``_parts(rank, s0, s1, part)`` merged where
    consecutive pieces of a rank have one part, clock-aligned with ``coll``'s corrections."""
    return f"""
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
    ORDER BY r.rank, t0_ns"""


@cached_frame("step_timeline")
def step_timeline(store: SQLStore, run: str, step: int, ranks: Sequence[int] | None = None) -> Maybe[pa.Table]:
    """Per rank (of ``ranks``: every rank when None), the step ``step`` as consecutive segments
    of one part: ``run, rank, part, t0_ns,
    t1_ns, dur_ns`` (``t0_ns``/``t1_ns`` clock-aligned, absolute), and ``breakdown`` (``gpu``, or
    ``host`` on a run without GPU work: no kernel, copy or memset of positive duration).
    Consecutive segments of one part are merged; ``idle`` (GPU) and ``other`` (host) are the
    time nothing runs.

    Read from the time lines stored at ingest (``rank_segments``) clipped to the step's windows
    (``rank_step_windows`` on the GPU, the ProfilerStep on the host), with the waits of the
    collectives matched across ranks cut out of exposed communication."""
    has_gpu = store.sql("SELECT count(*) AS n FROM rank_gpu_totals WHERE run = $run AND scope = 'all'",
                        {"run": run}).to_pylist()[0]["n"] > 0
    breakdown = GPU if has_gpu else HOST
    rf, rank_params = rank_filter(ranks, "rank")
    windows = "rank_step_windows" if breakdown is GPU else "steps"
    win = (f"_win_step AS (SELECT rank, step, start_ns AS w0, end_ns AS w1 FROM {windows} "
           f"WHERE run = $run AND step = $step AND {rf})")
    # with fewer than two ranks with collectives nothing is matched: no waits, no clock corrections
    coll = matched_ctes(store, run) if ranks_with_collectives(store, run) >= 2 else (
        "coll AS (SELECT NULL::BIGINT AS rank, NULL::BIGINT AS ts_ns, NULL::BIGINT AS wait_ns, "
        "NULL::BOOLEAN AS host_side, NULL::BIGINT AS clock_correction_ns WHERE FALSE)")
    query = f"""
    WITH {win},
    {coll},
    {segment_cuts(breakdown, rf, "_win_step")},
    {_leaf_ctes(breakdown)},
    {lanes(breakdown)}
    """
    table = store.sql(query, {"run": run, "step": int(step), **rank_params})
    if table.num_rows == 0:
        return Absent(f"step {step} has no window on any rank of this run")
    return table


TIMELINE_MAX_LANES = 64
"""Ranks the step timeline draws a lane for. The chart is at most 720 px high, so 64 lanes are
~11 px each; 1,024 would be under a pixel, and cost the Overview's first open ~2 s to cut and
draw (1.2 M segments)."""


def timeline_lanes(ranks: Sequence[int], first: Sequence[int] = (), limit: int = TIMELINE_MAX_LANES) -> list[int]:
    """The ranks of ``ranks`` the timeline draws, ascending: all of them when they are at most
    ``limit``; else those of ``first`` (the ranks worth a look: late arrivals, the critical
    path's), in their order, then ranks evenly spaced over the rest (its lowest and highest
    included), for the typical rank beside them."""
    ranks = sorted(set(int(r) for r in ranks))
    if len(ranks) <= limit:
        return ranks
    present = set(ranks)
    chosen = list(dict.fromkeys(int(r) for r in first if int(r) in present))[:limit]
    taken = set(chosen)
    rest = [r for r in ranks if r not in taken]
    room = limit - len(chosen)
    if room == 1:
        chosen.append(rest[0])
    elif room > 1:
        chosen += [rest[round(i * (len(rest) - 1) / (room - 1))] for i in range(room)]
    return sorted(chosen)


@cached_frame("late_marks")
def late_marks(store: SQLStore, run: str, step: int, ranks: None = None) -> pa.Table:
    """The late arrivals of ``step``: every member of a valid instance that arrived late
    (:mod:`stepscope.analysis.matching`) while others waited: ``rank, collective, t_ns`` (its
    clock-aligned start), ``others_wait_ns`` (the other members' summed waits at that instance)."""
    if ranks_with_collectives(store, run) < 2:
        return pa.table({"rank": pa.array([], pa.int64()), "collective": pa.array([], pa.string()),
                         "t_ns": pa.array([], pa.int64()), "others_wait_ns": pa.array([], pa.int64())})
    query = f"""
    WITH {matched_ctes(store, run)}
    SELECT c.rank, c.collective, c.aligned_ts_ns AS t_ns,
           (SELECT sum(o.wait_ns) FROM coll o WHERE o.inst_id = c.inst_id AND NOT o.late)::BIGINT AS others_wait_ns
    FROM coll c
    WHERE c.step = $step AND c.late AND c.valid
    ORDER BY c.aligned_ts_ns, c.rank
    """
    return store.sql(query, {"run": run, "step": int(step)})


DRAWN_SLICES = 1500
"""Slices of a step the timeline is drawn at: about one pixel each across a wide page. A step
of 8 small ranks has ~9,300 segments, ~1,100 of them a pixel wide at 1,000 px. Drawn at these
slices it is ~1,000 bars instead of the 4,000 longest segments, and the Overview's first open in
headless Chromium took 4.0-4.4 s instead of 4.7-5.0 s (bench_dashboard --browser, two
alternated pairs, load 1-1.5)."""


def drawn_bars(segments: pa.Table, slices: int = DRAWN_SLICES) -> pa.Table:
    """``segments`` (``step_timeline``'s rows: per rank, disjoint segments tiling its window) at
    the resolution of ``slices`` equal slices of their span: per rank, each slice takes the part
    that held most of its time (ties: the part's name), and consecutive slices of one part are
    one bar. Columns: ``rank, part, t0_ns, t1_ns`` (from that part's first moment in the bar's
    first slice to its last in the last slice), ``part_ns`` (that part's own time within the
    bar: all of it where no other part interleaves) and ``segments`` (how many of the part's
    segments begin within the bar).

    What a renderer does to draw a line at its resolution: every stretch a pixel wide or more
    keeps its place and length; where parts alternate faster than a slice, the slice shows the
    one that ruled it, and ``part_ns`` says how much of the bar that part really holds."""
    from stepscope.analysis._local import local_sql

    query = """
    WITH span AS (
        SELECT min(t0_ns) AS origin, greatest(1, ceil((max(t1_ns) - min(t0_ns)) / $slices))::BIGINT AS width
        FROM seg
    ),
    pieces AS (  -- each segment's share of each slice it touches
        SELECT rank, part, t0_ns, t1_ns, origin, width,
               unnest(range((t0_ns - origin) // width, (t1_ns - 1 - origin) // width + 1)) AS slice
        FROM seg, span
        WHERE t1_ns > t0_ns
    ),
    held AS (
        SELECT rank, slice, part,
               sum(least(t1_ns, origin + (slice + 1) * width) - greatest(t0_ns, origin + slice * width)) AS part_ns,
               min(greatest(t0_ns, origin + slice * width)) AS c0,
               max(least(t1_ns, origin + (slice + 1) * width)) AS c1,
               count(*) FILTER (WHERE t0_ns >= origin + slice * width) AS segments
        FROM pieces GROUP BY rank, slice, part
    ),
    ruling AS (
        SELECT * FROM held
        QUALIFY row_number() OVER (PARTITION BY rank, slice ORDER BY part_ns DESC, part) = 1
    ),
    islands AS (
        SELECT *, slice - row_number() OVER (PARTITION BY rank, part ORDER BY slice) AS island FROM ruling
    )
    SELECT rank, part, min(c0) AS t0_ns, max(c1) AS t1_ns, sum(part_ns)::BIGINT AS part_ns,
           sum(segments)::BIGINT AS segments
    FROM islands GROUP BY rank, part, island
    ORDER BY rank, t0_ns
    """
    return local_sql(query, {"slices": int(slices)}, seg=segments.select(["rank", "part", "t0_ns", "t1_ns"]))
