"""Collectives across ranks: which events are one instance, how far the clocks differ, who waited.

Every cross-rank figure (start skew, last arrivals, the wait/transfer split of exposed
communication, clock offsets, the late-rank finding) reads one relation, ``coll``: one row per
collective event of every rank of the run, with its matched instance, its clock-aligned start
and its wait. It is SQL text (common table expressions over the per-rank table
``rank_collectives``, :mod:`stepscope.store.rankstats.collectives`, written at ingest, and
``sources``) so that the step breakdown can clip the waits to its segments in the same query;
:func:`collective_rows` runs it on its own. Definitions (docs/ANALYSIS.md, "Collectives across
ranks"):

- A **collective event** is a communication kernel, or a gloo transfer (``gloo:*`` annotation on
  gloo's worker thread: the only record of a CPU collective's transfer).
- What a kernel is comes from its own args (newer traces), else from the host op that launched
  it (older traces: the innermost communication op, ``c10d::...``, ``record_param_comms`` or
  ``nccl:*``, enclosing the kernel's launch on its thread), else from its name. Old NCCL runs an
  all-to-all as ``ncclKernel_SendRecv``: only the launching op says it is an all-to-all.
- **Matching**: by process group and sequence number (``Seq``) when recorded; else by order
  within (process group, collective kind, step) on each rank, send/recv counted as one kind
  (point-to-point). An instance is **valid** when it has at least two members, one per rank,
  of one kind, one dtype and (except all-to-all, whose splits differ) one size, and, for the
  collectives where no rank can finish before every rank started (all except broadcast,
  reduce, gather, scatter), its members overlap in time within the clocks' uncertainty. Only
  valid instances get waits; the others say why (``absent_reason``).
- **Clock offsets**: a collective ends on all ranks within microseconds. Per valid instance,
  ``d = end - median(end of its members)``; a rank's ``clock_offset_ns`` is the median of its
  ``d``, ``clock_spread_ns`` their median absolute deviation from it. When the offset exceeds
  the spread and 1 ms, the rank's times are corrected by it (``clock_correction_ns``);
  otherwise they are compared as recorded. Ranks whose traces all name one host
  (``host_name``) share its clock: never corrected (their ends differ by the work, not the
  clock: a gloo send's annotation closes when it is waited for, an overloaded rank's gloo thread
  closes its all-reduce late, and one such instance makes a spread of 0).
- **Wait** of a member: ``min(max(latest aligned start of the instance - its aligned start, 0),
  its duration)``: the time it spent inside the collective before the last peer arrived.
- **Late ranks** of an instance: sort the aligned starts; the members after the largest gap
  between consecutive starts (none when all start at the same nanosecond).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from stepscope.analysis._sql import rank_filter, sql_list
from stepscope.analysis.cache import cached_frame
from stepscope.analysis.sections import SQLStore

STORED_POINTS = """
_c_m AS MATERIALIZED (
  SELECT row_number() OVER (ORDER BY rank, source, ts_ns, stream, correlation, tid) AS point_id,
         run, rank, source, pid, tid, step, name, ts_ns, dur_ns, end_ns, stream, correlation, host_side,
         collective, bytes, dtype, group_size AS group_size0, pg_name AS pg_name0, pg_desc AS pg_desc0,
         pg_ranks AS pg_ranks0, comm_seq, linked, phase
  FROM rank_collectives WHERE run = $run
)"""
"""The collective events of the run as ingest stored them (``rank_collectives``), numbered as
:func:`stepscope.store.rankstats.collectives.collective_point_ctes` numbers them over events."""

POINT_TO_POINT = ("send", "recv", "send_recv")
"""Point-to-point collectives: matched as one kind (a send on one rank pairs with a recv on another)."""

UNSIZED = ("all_to_all",)
"""Collectives whose message size differs across ranks by design (uneven splits): no size check."""

ROOTED = ("broadcast", "reduce", "gather", "scatter")
"""Collectives where a rank can finish before another starts (the root, a leaf): no overlap check."""

CLOCK_MIN_CORRECTION_NS = 1_000_000
"""Clocks are corrected only by offsets of 1 ms or more (and beyond their spread): a smaller one
changes no wait by as much as the 1 ms floor of every finding, and on one host it is the
collective's own end-time jitter (gloo ranks end up to a millisecond apart), not a clock."""

MATCHED_BY = ("comm_seq", "step_order")
"""How an instance was matched: recorded sequence number, or order in the step."""

_PG_CONFIG_TYPE = '[{"pg_name":"VARCHAR","pg_desc":"VARCHAR","pg_size":"BIGINT","ranks":"BIGINT[]"}]'


ONE_HOST = ("SELECT count(DISTINCT json_extract_string(metadata, '$.host_name')) = 1 "
            "AND count(json_extract_string(metadata, '$.host_name')) = count(*) FROM sources WHERE run = $run")
"""True when every trace of ``$run`` names the same host (``host_name``): one clock, never corrected."""


def _offset_ctes(prefix: str, rows: str, where: str) -> str:
    """CTEs ending in ``<prefix>_off(rank, instances, clock_offset_ns, clock_spread_ns,
    clock_correction_ns)``, one row per rank of ``rows`` (``instances`` 0 and no correction when
    none of its rows satisfies ``where``): offsets from the end times of the instances kept."""
    return f"""
{prefix}_rel AS (
  -- ends relative to the instance's first end: small numbers, exact in the medians' doubles
  SELECT rank, inst_id, end_ns - min(end_ns) OVER (PARTITION BY inst_id) AS rel FROM {rows} WHERE {where}
),
{prefix}_dev AS (
  SELECT rank, rel - median(rel) OVER (PARTITION BY inst_id) AS d FROM {prefix}_rel
),
{prefix}_off0 AS (SELECT rank, count(*) AS instances, median(d) AS offset FROM {prefix}_dev GROUP BY rank),
{prefix}_off AS (
  SELECT r.rank, coalesce(o.instances, 0) AS instances, o.offset AS clock_offset_ns,
         o.spread AS clock_spread_ns,
         coalesce(CASE WHEN abs(o.offset) > o.spread AND abs(o.offset) >= {CLOCK_MIN_CORRECTION_NS}
                            AND NOT ({ONE_HOST})
                       THEN round(o.offset)::BIGINT END, 0) AS clock_correction_ns
  FROM (SELECT DISTINCT rank FROM {rows}) r
  LEFT JOIN (SELECT o.rank, o.instances, o.offset, median(abs(v.d - o.offset)) AS spread
             FROM {prefix}_off0 o JOIN {prefix}_dev v USING (rank) GROUP BY o.rank, o.instances, o.offset) o
    USING (rank)
)"""


def collective_ctes(points: str = STORED_POINTS) -> str:
    """CTEs (names starting ``_c_``) ending in ``coll``: every collective event of every rank of
    ``$run``, matched, aligned and with its wait. Columns of ``coll``:

    ``point_id, run, rank, source, pid, tid, step, name, ts_ns, dur_ns, end_ns, stream,
    correlation, host_side, collective, bytes, dtype, group_size, pg_name, pg_desc, pg_ranks,
    comm_seq, linked`` (what the kernel is came from its launching op), ``inst_id, matched_by,
    match_seq, members, inst_ranks, inst_group_size, valid, absent_reason, collective_mismatch,
    clock_correction_ns, aligned_ts_ns, aligned_end_ns, first_start_ns, last_start_ns`` (aligned),
    ``phase`` (of the launch),
    ``wait_ns, late`` (null on invalid instances).

    ``points``: CTEs ending in ``_c_m``, the collective events with what each is (by default the
    per-rank table ``rank_collectives`` written at ingest; the tests pass
    ``collective_point_ctes()``, the same over the events, to check the two agree).
    """
    p2p = sql_list(POINT_TO_POINT)
    return f"""
_c_pgc AS (
  SELECT source, u.pg.pg_name AS pg_name, u.pg.pg_desc AS pg_desc, u.pg.pg_size AS pg_size,
         '[' || array_to_string(u.pg.ranks, ', ') || ']' AS pg_ranks,
         count(*) OVER (PARTITION BY source) AS groups
  FROM (SELECT source, unnest(from_json(json_extract(distributed_info, '$.pg_config'),
                                        '{_PG_CONFIG_TYPE}')) AS pg
        FROM sources WHERE run = $run) u
),
_c_world AS (SELECT max(world_size) AS world_size, count(DISTINCT rank) AS traced FROM sources WHERE run = $run),
{points},
_c_keyed AS (
  SELECT m.* EXCLUDE (group_size0, pg_name0, pg_desc0, pg_ranks0),
         coalesce(m.group_size0, pg.pg_size) AS group_size, coalesce(m.pg_name0, pg.pg_name) AS pg_name,
         coalesce(m.pg_desc0, pg.pg_desc) AS pg_desc, coalesce(m.pg_ranks0, pg.pg_ranks) AS pg_ranks,
         CASE WHEN m.comm_seq IS NOT NULL THEN 'comm_seq' ELSE 'step_order' END AS matched_by,
         CASE WHEN m.collective IN {p2p} THEN 'p2p' ELSE coalesce(m.collective, '?') END AS kind_key
  FROM _c_m m LEFT JOIN _c_pgc pg
    ON pg.source = m.source AND (pg.pg_name = m.pg_name0 OR (m.pg_name0 IS NULL AND pg.groups = 1))
),
_c_order AS (
  -- the order of the events matched by order within their step (those without a ``Seq``: every
  -- other event is matched by its own); the window reads the few columns it needs, not every
  -- column of the events, whose sort cost it 0.19 s of a 64-rank run's CPU
  SELECT point_id, row_number() OVER (PARTITION BY rank, pg_name, kind_key, step
                                      ORDER BY ts_ns, stream, tid, point_id) AS step_seq
  FROM _c_keyed WHERE matched_by = 'step_order'
),
_c_seq AS (
  -- from here on, the columns the matching reads only: every later step materialises its rows,
  -- and the events' names and groups' texts would be copied at each (``coll`` takes them back)
  SELECT k.point_id, k.rank, k.step, k.ts_ns, k.dur_ns, k.end_ns, k.stream, k.tid, k.collective, k.bytes,
         k.dtype, k.comm_seq, k.group_size, k.pg_name, k.matched_by, k.kind_key,
         CASE WHEN matched_by = 'step_order' THEN step END AS match_step,
         CASE WHEN matched_by = 'step_order' THEN kind_key WHEN kind_key = 'p2p' THEN 'p2p' ELSE 'collective' END
           AS match_kind,
         coalesce(comm_seq, o.step_seq) AS match_seq
  FROM _c_keyed k LEFT JOIN _c_order o USING (point_id)
),
_c_places AS (
  -- each instance's place: its id numbers the distinct places in order (a dense rank of the
  -- events, over thousands of places instead of every event)
  SELECT *, row_number() OVER (ORDER BY pg_name NULLS FIRST, matched_by, match_kind, match_step NULLS FIRST,
                                        match_seq) AS inst_id
  FROM (SELECT DISTINCT pg_name, matched_by, match_kind, match_step, match_seq FROM _c_seq)
),
_c_id AS (
  SELECT s.*, p.inst_id
  FROM _c_seq s JOIN _c_places p
    ON p.pg_name IS NOT DISTINCT FROM s.pg_name AND p.matched_by = s.matched_by AND p.match_kind = s.match_kind
   AND p.match_step IS NOT DISTINCT FROM s.match_step AND p.match_seq IS NOT DISTINCT FROM s.match_seq
),
_c_inst AS (
  SELECT inst_id, count(*) AS members, count(DISTINCT rank) AS inst_ranks,
         count(DISTINCT kind_key) > 1 AS collective_mismatch,
         count(DISTINCT lower(dtype)) > 1
           OR (count(DISTINCT bytes) > 1 AND NOT bool_or(collective IN {sql_list(UNSIZED)})) AS payload_mismatch,
         bool_or(collective IN {sql_list(ROOTED)}) AS rooted,
         coalesce(max(group_size), (SELECT world_size FROM _c_world)) AS inst_group_size
  FROM _c_id GROUP BY inst_id
),
_c_cand AS (
  -- instances whose members agree on what they are: the ones clock offsets are estimated from
  SELECT c.*, i.members, i.inst_ranks, i.inst_group_size, i.collective_mismatch, i.rooted,
         i.inst_ranks >= 2 AND i.inst_ranks = i.members AND NOT i.collective_mismatch AND NOT i.payload_mismatch
           AS candidate,
         CASE WHEN i.inst_ranks < 2 THEN 'seen on one rank only'
              WHEN i.inst_ranks <> i.members THEN 'matched more than once on a rank: ambiguous'
              WHEN i.collective_mismatch THEN 'the ranks ran different collectives at this place'
              WHEN i.payload_mismatch THEN 'the ranks'' dtypes or message sizes differ: the traces do not line up here'
         END AS cand_reason
  FROM _c_id c JOIN _c_inst i USING (inst_id)
),
{_offset_ctes("_c_a", "_c_cand", "candidate")},
_c_al AS (
  SELECT c.*, c.ts_ns - o.clock_correction_ns AS a_ts, c.end_ns - o.clock_correction_ns AS a_end,
         -- what a corrected clock may still be off by; an uncorrected one is compared as recorded
         CASE WHEN o.clock_correction_ns <> 0 THEN o.clock_spread_ns ELSE 0 END AS a_uncertainty
  FROM _c_cand c JOIN _c_a_off o USING (rank)
),
_c_overlap AS (
  SELECT inst_id, max(a_ts) <= min(a_end) + 2 * max(a_uncertainty) AS overlaps
  FROM _c_al WHERE candidate GROUP BY inst_id
),
_c_valid AS (
  SELECT c.*, coalesce(c.candidate AND (c.rooted OR o.overlaps), FALSE) AS valid,
         coalesce(c.cand_reason, CASE WHEN NOT (c.rooted OR o.overlaps)
             THEN 'one rank finished before another started: the traces do not line up here' END) AS absent_reason
  FROM _c_cand c LEFT JOIN _c_overlap o USING (inst_id)
),
{_offset_ctes("_c_b", "_c_valid", "valid")},
_c_gaps AS (
  -- each member's start less the previous member's of its instance: one window over the few
  -- columns it needs, in instance order (over every column, partitioned by instance, the
  -- window cost 0.3 s of a 64-rank run's CPU)
  SELECT point_id, CASE WHEN lag(inst_id) OVER w = inst_id THEN a_ts - lag(a_ts) OVER w END AS gap
  FROM (SELECT c.point_id, c.inst_id, c.rank, c.ts_ns - o.clock_correction_ns AS a_ts
        FROM _c_valid c JOIN _c_b_off o USING (rank))
  WINDOW w AS (ORDER BY inst_id, a_ts, rank)
),
_c_gap AS (
  SELECT c.*, o.clock_correction_ns, c.ts_ns - o.clock_correction_ns AS aligned_ts_ns,
         c.end_ns - o.clock_correction_ns AS aligned_end_ns, g.gap
  FROM _c_valid c JOIN _c_b_off o USING (rank) JOIN _c_gaps g USING (point_id)
),
_c_inst2 AS (
  SELECT inst_id, min(aligned_ts_ns) AS first_start_ns, max(aligned_ts_ns) AS last_start_ns, max(gap) AS max_gap
  FROM _c_gap GROUP BY inst_id
),
_c_late AS (
  SELECT g.inst_id, max(g.aligned_ts_ns) FILTER (WHERE g.gap = i.max_gap) AS late_from
  FROM _c_gap g JOIN _c_inst2 i USING (inst_id) WHERE i.max_gap > 0 GROUP BY g.inst_id
),
coll AS MATERIALIZED (
  SELECT g.point_id, k.run, g.rank, k.source, k.pid, g.tid, g.step, k.name, g.ts_ns, g.dur_ns, g.end_ns,
         g.stream, k.correlation, k.host_side, g.collective, g.bytes, g.dtype, g.group_size, g.pg_name,
         k.pg_desc, k.pg_ranks, g.comm_seq, k.linked, g.inst_id, g.matched_by, g.match_seq, g.members,
         g.inst_ranks, g.inst_group_size, g.collective_mismatch, g.valid, g.absent_reason,
         g.clock_correction_ns, g.aligned_ts_ns, g.aligned_end_ns, i.first_start_ns, i.last_start_ns, k.phase,
         CASE WHEN g.valid THEN least(greatest(i.last_start_ns - g.aligned_ts_ns, 0), g.dur_ns) END AS wait_ns,
         CASE WHEN g.valid THEN coalesce(g.aligned_ts_ns >= l.late_from, FALSE) END AS late
  FROM _c_gap g JOIN _c_keyed k ON k.point_id = g.point_id JOIN _c_inst2 i ON i.inst_id = g.inst_id
  LEFT JOIN _c_late l ON l.inst_id = g.inst_id
)"""


def matched_ctes(store: SQLStore, run: str) -> str:
    """The CTEs ``coll`` and ``_c_b_off`` of :func:`collective_ctes` for ``run``, the matching
    done once per open store: ``coll`` is materialised into a table of the store's database the
    first time a query of the run needs it (``Store.materialize``, memoised by ``Store.memo``)
    and every later query (the wait splits of both breakdowns, the communication kernels, the
    clock offsets, lateness) reads that table. ``_c_b_off`` is recomputed from it: it reads only
    ``coll``'s valid members, the rows it was first computed from. A store without
    ``materialize`` gets the whole matching inline, as :func:`collective_ctes` gives it."""
    materialize = getattr(store, "materialize", None)
    memo = getattr(store, "memo", None)
    if materialize is None or memo is None:
        return collective_ctes()
    table = memo(("matching.coll", run), lambda: materialize(
        f"WITH {collective_ctes()} SELECT * FROM coll ORDER BY point_id", {"run": run}))
    return f"coll AS (SELECT * FROM {table} WHERE run = $run),{_offset_ctes('_c_b', 'coll', 'valid')}"


@cached_frame("collective_rows")
def collective_rows(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Every collective event of the run (``coll``, module docs), restricted to ``ranks``
    after matching (an instance is matched over all ranks whichever are asked for)."""
    predicate, params = rank_filter(ranks, "rank")
    return store.sql(
        f"WITH {matched_ctes(store, run)} SELECT * FROM coll WHERE {predicate} ORDER BY rank, ts_ns, point_id",
        {"run": run, **params})


NO_MATCH = "no collective of this rank was matched with one of another traced rank"


def ranks_with_collectives(store: SQLStore, run: str) -> int:
    """How many ranks of the run have a collective event: with fewer than two nothing can be
    matched, and the analyses skip the matching (a cheap count instead of the whole query;
    once per open store)."""

    def count() -> int:
        return store.sql("SELECT count(DISTINCT rank) AS n FROM rank_collectives WHERE run = $run",
                         {"run": run}).to_pylist()[0]["n"]

    memo = getattr(store, "memo", None)
    return memo(("matching.ranks_with_collectives", run), count) if memo is not None else count()


@cached_frame("clock_offsets")
def clock_offsets(store: SQLStore, run: str) -> pa.Table:
    """Per rank of the run: ``instances`` (valid collectives the estimate rests on),
    ``clock_offset_ns`` (the rank's median end-time difference to its instances' median end,
    minus the same for ``reference_rank``, the lowest rank with an estimate: how far this rank's
    clock runs ahead of the reference's), ``clock_spread_ns`` (the median absolute deviation of
    the rank's end-time differences: the spread it is estimated from), ``clock_correction_ns``
    (what is subtracted from the rank's times before waits and lateness are computed, relative
    to the reference: its offset when that exceeds its spread, else 0), ``absent_reason`` (why no
    offset could be estimated). Only differences between ranks' clocks can be known."""
    if ranks_with_collectives(store, run) < 2:
        return store.sql(
            "SELECT $run AS run, rank, 0::BIGINT AS instances, NULL::BIGINT AS reference_rank, "
            "NULL::DOUBLE AS clock_offset_ns, NULL::DOUBLE AS clock_spread_ns, 0::BIGINT AS clock_correction_ns, "
            "$no_match AS absent_reason FROM (SELECT DISTINCT rank FROM sources WHERE run = $run) ORDER BY rank",
            {"run": run, "no_match": NO_MATCH})
    query = f"""
WITH {matched_ctes(store, run)},
est AS (SELECT * FROM _c_b_off WHERE instances > 0),
ref AS (SELECT * FROM est ORDER BY rank LIMIT 1)
SELECT $run AS run, s.rank, coalesce(o.instances, 0) AS instances, (SELECT rank FROM ref) AS reference_rank,
       o.clock_offset_ns - (SELECT clock_offset_ns FROM ref) AS clock_offset_ns, o.clock_spread_ns,
       coalesce(o.clock_correction_ns - (SELECT clock_correction_ns FROM ref), 0) AS clock_correction_ns,
       CASE WHEN o.rank IS NULL THEN $no_match END AS absent_reason
FROM (SELECT DISTINCT rank FROM sources WHERE run = $run) s LEFT JOIN est o ON o.rank = s.rank
ORDER BY s.rank
"""
    return store.sql(query, {"run": run, "no_match": NO_MATCH})
