"""Which ranks are pipeline stages, in which order: from their point-to-point traffic and, where
torch's runtime schedules annotate their actions, from those annotations.

Definitions (docs/ANALYSIS.md, "Pipeline parallelism"):

- A **transfer** is a host op ``c10d::send`` or ``c10d::recv_`` (every backend records them);
  ``Concrete Inputs[2]`` is the peer's rank in the process group, mapped to a global rank
  through the group's ``ranks`` when the trace's process-group metadata names a pipeline group
  (``pp``, ``pipe`` in its description), else read as a global rank.
- Ranks that exchange transfers form a **pipeline**. Ordered by the lowest stage their schedule
  annotations name when every rank of it has them; else the transfers must form a chain, whose
  first stage is the end that sends first (activations flow from it).
- A **schedule action** is an annotation ``PP:<stage><F|B|I|W><microbatch>`` of torch's runtime
  schedules (interleaved 1F1B, zero-bubble): forward, backward, backward for inputs, backward
  for weights of one microbatch on one stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from stepscope.analysis._sql import rank_filter
from stepscope.analysis.absent import Absent, Maybe
from stepscope.analysis.cache import cached_frame
from stepscope.analysis.sections import SQLStore

PP_GROUP = r"(^|[^a-z])(pp|pipe|pipeline)([^a-z]|$)"
"""A process group whose description names it a pipeline group (``mesh_pp``, ``pp``, ``pipeline``)."""

NO_P2P = "no point-to-point transfers (c10d::send / c10d::recv_) between traced ranks: no pipeline parallelism seen"
NO_PEERS = ("the point-to-point transfers record no peer rank (Concrete Inputs: torch >= 2.1 with record_shapes=True): "
            "the stages cannot be ordered")


@cached_frame("pipeline_transfers")
def p2p_transfers(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Every point-to-point host op of the run: ``rank, step, ts_ns, dur_ns, send`` (true for a
    send), ``peer`` (the global rank of the other side, null when not recorded). Read from
    ``rank_p2p`` (each trace's transfers, stored at ingest), the peer mapped here because the
    process groups are the run's (``sources``)."""
    rf, extra = rank_filter(ranks, "o.rank")
    return store.sql(f"""
        WITH groups AS (
          SELECT s.rank, u.pg.pg_desc AS pg_desc, u.pg.ranks AS pg_ranks
          FROM (SELECT rank, unnest(from_json(json_extract(distributed_info, '$.pg_config'),
                                             '[{{"pg_desc":"VARCHAR","ranks":"BIGINT[]"}}]')) AS pg
                FROM sources WHERE run = $run) u JOIN sources s ON s.run = $run AND s.rank = u.rank
        ),
        pp AS (
          SELECT rank, any_value(pg_ranks) AS pg_ranks FROM groups
          WHERE regexp_matches(pg_desc, $pp_group, 'i') AND list_contains(pg_ranks, rank)
          GROUP BY rank HAVING count(*) = 1
        )
        SELECT o.rank, o.step, o.ts_ns, o.dur_ns, o.send,
               CASE WHEN pp.pg_ranks IS NULL THEN o.peer_index ELSE pp.pg_ranks[o.peer_index + 1] END AS peer
        FROM rank_p2p o LEFT JOIN pp USING (rank)
        WHERE o.run = $run AND {rf}
        ORDER BY o.rank, o.ts_ns
    """, {"run": run, "pp_group": PP_GROUP, **extra})


@dataclass(frozen=True)
class Pipeline:
    """One pipeline: its ranks in stage order (``ranks[s]`` runs stage ``s``)."""

    ranks: tuple[int, ...]

    def stage_of(self, rank: int) -> int:
        return self.ranks.index(rank)


def pipelines(transfers: pa.Table, traced: Sequence[int],
              first_stage: dict[int, int] | None = None) -> Maybe[list[Pipeline]]:
    """The pipelines of the run from who sends to whom (module docs), or why they cannot be had.
    ``first_stage``: the lowest stage each rank's schedule annotations name; a group of ranks
    that all have one is ordered by it (an interleaved pipeline's traffic is a ring)."""
    first_stage = first_stage or {}
    everything = transfers.to_pylist()
    rows = [r for r in everything if r["peer"] is not None]
    if not rows:
        return Absent(NO_PEERS if everything else NO_P2P)
    edges: dict[int, set[int]] = {}
    for r in rows:
        edges.setdefault(r["rank"], set()).add(r["peer"])
    untraced = sorted({p for peers in edges.values() for p in peers} - set(traced))
    if untraced:
        return Absent(f"ranks {', '.join(map(str, sorted(edges)))} exchange transfers with untraced ranks "
                      f"{', '.join(map(str, untraced))}: the stage order needs every stage's trace")
    one_sided = sorted((a, b) for a, peers in edges.items() for b in peers if a not in edges.get(b, set()))
    if one_sided:
        a, b = one_sided[0]
        return Absent(f"rank {a} sends to or receives from rank {b}, which never names rank {a}: the peers "
                      "are not global ranks (a pipeline group the trace's process-group metadata does not name)")
    first_send = {}
    for r in rows:  # rows are in (rank, ts) order: the first transfer of each rank
        first_send.setdefault(r["rank"], r["send"])
    found: list[Pipeline] = []
    seen: set[int] = set()
    for start in sorted(edges):
        if start in seen:
            continue
        component = _component(edges, start)
        seen |= set(component)
        if all(r in first_stage for r in component):
            found.append(Pipeline(tuple(sorted(component, key=lambda r: first_stage[r]))))
            continue
        ends = [r for r in component if len(edges[r]) == 1]
        if any(len(edges[r]) > 2 for r in component) or len(ends) != 2:
            return Absent(f"ranks {', '.join(map(str, sorted(component)))} exchange transfers in a ring or a "
                          "mesh, not a chain: the stages cannot be ordered from the traffic alone")
        heads = [r for r in ends if first_send[r]]
        if len(heads) != 1:
            return Absent(f"ranks {ends[0]} and {ends[1]} end a chain of transfers, but neither alone sends "
                          "first: the flow of activations cannot be told")
        found.append(Pipeline(tuple(_walk(edges, heads[0]))))
    return found


def _component(edges: dict[int, set[int]], start: int) -> list[int]:
    todo, out = [start], {start}
    while todo:
        for peer in edges[todo.pop()]:
            if peer not in out:
                out.add(peer)
                todo.append(peer)
    return sorted(out)


def _walk(edges: dict[int, set[int]], head: int) -> list[int]:
    order, previous = [head], None
    while True:
        nxt = [p for p in edges[order[-1]] if p != previous]
        if not nxt:
            return order
        previous = order[-1]
        order.append(nxt[0])


@cached_frame("pipeline_actions")
def schedule_actions(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> pa.Table:
    """Every schedule action annotation of the run: ``rank, ts_ns, end_ns, stage, action``
    (``F``, ``B``, ``I``, ``W``), ``microbatch``; empty when the schedules annotate none
    (``rank_pipeline_actions``, stored at ingest)."""
    rf, extra = rank_filter(ranks)
    return store.sql(f"""
        SELECT rank, ts_ns, end_ns, stage, action, microbatch
        FROM rank_pipeline_actions
        WHERE run = $run AND {rf}
        ORDER BY rank, ts_ns
    """, {"run": run, **extra})
