"""What filled the memory, from an ingested CUDA memory snapshot (``stepscope ingest x.pickle``).

Definitions (docs/ANALYSIS.md, "Memory snapshots"), per rank, snapshot and device:

- *allocated* is the bytes of the allocator's blocks handed out (sizes as the allocator rounds
  them): ``+size`` at ``alloc``, ``-size`` at ``free_completed``; *reserved* the bytes of its
  segments: ``+size`` at ``segment_alloc``/``segment_map``, ``-size`` at
  ``segment_free``/``segment_unmap``. The history is a ring buffer that may begin mid-run, so
  both curves start from what the snapshot's end state (its blocks and segments) minus the
  history's net change says was there: the curve is exact at every event, in the history's order.
- The peak is the highest allocated value, at its first event. An allocation is live at event
  ``k`` when its ``alloc`` is at or before ``k`` and the next event at its address is after ``k``;
  what was allocated before the history began is one group of its own.
- An allocation's *user frame* is the innermost frame of its stack that is a Python file outside
  torch and the standard library; stacks without one say so.
- An ``oom`` entry records the request that failed (``size``) and the bytes the device had free
  (``address``). Its cause is *fragmentation* when the reserved-but-unallocated bytes plus the
  device's free bytes would have held the request (the bytes were there, not in one piece), else
  *live data*: what was allocated left too little.
- *Activations*: allocations live at the peak whose stack has no backward frame (made in the
  forward) and whose free came in the backward: the latest event with a stack, at or before the
  free, has a backward frame (torch's autograd engine, or a ``backward`` of torch). Events
  without a stack do not change the phase: with Python-only stacks the autograd engine's thread
  records none, so the allocations and frees of the backward carry no stack at all, and the
  ``backward`` call that starts it is the last stack seen. When no stack of the history has a
  backward frame, the backward cannot be told from the rest: activations are absent, with that
  reason, never 0. (A peak after the backward, e.g. in the optimizer's step, holds no
  activations: 0 is then the answer.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from stepscope.analysis._sql import rank_filter
from stepscope.analysis.absent import Absent, Maybe
from stepscope.analysis.findings import Finding, Results, Severity, rule
from stepscope.analysis.sections import SQLStore, section

NO_SNAPSHOT = "no memory snapshot ingested in this run (stepscope ingest x.pickle)"
NO_ROLES = "no memory roles recorded for this rank (the collector records them when given model= / optimizer=)"
NO_OOM = "the history holds no oom event"
NO_TIMES = "the snapshot records no times (torch before 2.1)"
NO_FREE_BLOCK = "no free block in the snapshot's segments"
NO_BACKWARD = ("no stack in the history has a backward frame (the backward is outside the recorded history, "
               "or was recorded without stacks): activations cannot be told from other memory")
BEFORE_HISTORY = "(allocated before the recorded history)"
NO_STACK = "(no stack recorded)"
NO_USER_FRAME = "(no frame outside torch and the standard library)"
TOP_FRAMES = 10
"""Frames listed per group; the rest are summed as one row."""
CURVE_BUCKETS = 500
"""The curve in the JSON: per bucket of events, the lowest and highest values (exact, so the
peak is on it)."""
FRAGMENTATION_SHARE = 0.2
FRAGMENTATION_MIN_BYTES = 64 << 20
"""``memory.fragmentation``: reserved but unallocated at the peak, this share of reserved or more
and at least this many bytes."""
ACTIVATIONS_SHARE = 0.3
"""``memory.activations``: activations this share of the peak or more."""

_STDLIB = r"[/\\]lib[/\\]python[0-9.]*[/\\]|^[A-Za-z]:[/\\]Python[0-9]*[/\\]Lib[/\\]"
_PACKAGES = r"[/\\](site|dist)-packages[/\\]"
_TORCH = r"[/\\]torch[/\\]"
USER_FRAME_SQL = (f"(file LIKE '%.py' AND NOT regexp_matches(file, '{_TORCH}') "
                  f"AND (NOT regexp_matches(file, '{_STDLIB}') OR regexp_matches(file, '{_PACKAGES}')))")
"""A frame that is the user's: Python, not torch, not the standard library (installed packages
other than torch count as the user's: they are what the user chose to run)."""
BACKWARD_FRAME_SQL = (f"(function LIKE 'torch::autograd::Engine::%' OR (function IN ('backward', '_engine_run_backward') "
                      f"AND regexp_matches(file, '{_TORCH}')))")

_EVENTS_CTE = """
ev AS (
  SELECT rank, source, device, seq, action, address, size, ts_ns, stack_id,
         CASE action WHEN 'alloc' THEN size WHEN 'free_completed' THEN -size ELSE 0 END AS d_alloc,
         CASE WHEN action IN ('segment_alloc', 'segment_map') THEN size
              WHEN action IN ('segment_free', 'segment_unmap') THEN -size ELSE 0 END AS d_res
  FROM snapshot_events WHERE run = $run AND {ranks}),
blocks_end AS (
  SELECT rank, source, device, CAST(coalesce(sum(size) FILTER (WHERE state <> 'inactive'), 0) AS BIGINT) AS allocated_end,
         max(size) FILTER (WHERE state = 'inactive') AS largest_free
  FROM snapshot_blocks WHERE run = $run AND {ranks} GROUP BY ALL),
segments_end AS (
  SELECT rank, source, device, CAST(sum(total_size) AS BIGINT) AS reserved_end, count(*) AS segments
  FROM snapshot_segments WHERE run = $run AND {ranks} GROUP BY ALL),
net AS (SELECT rank, source, device, sum(d_alloc) AS net_alloc, sum(d_res) AS net_res, count(*) AS events
        FROM ev GROUP BY ALL),
curve AS (
  SELECT ev.*, CAST(coalesce(b.allocated_end, 0) - n.net_alloc + sum(d_alloc) OVER w AS BIGINT) AS allocated,
         CAST(coalesce(s.reserved_end, 0) - n.net_res + sum(d_res) OVER w AS BIGINT) AS reserved
  FROM ev JOIN net n USING (rank, source, device)
  LEFT JOIN blocks_end b USING (rank, source, device) LEFT JOIN segments_end s USING (rank, source, device)
  WINDOW w AS (PARTITION BY rank, source, device ORDER BY seq ROWS UNBOUNDED PRECEDING))"""

_ALLOCS_CTE = """
paired AS (
  SELECT rank, source, device, seq, action, address, size, stack_id,
         lead(seq) OVER (PARTITION BY rank, source, device, address ORDER BY seq) AS next_seq
  FROM snapshot_events WHERE run = $run AND {ranks} AND action IN ('alloc', 'free_completed')),
allocs AS (SELECT rank, source, device, seq, address, size, stack_id, next_seq AS freed_seq
           FROM paired WHERE action = 'alloc')"""


@dataclass(frozen=True)
class SnapshotMemory:
    """One JSON-ready record per snapshot and device (see the module's doc)."""

    snapshots: tuple[dict[str, Any], ...]


def _cte(text: str, ranks_sql: str) -> str:
    return text.replace("{ranks}", ranks_sql)


def _snapshot_rows(store: SQLStore, ranks_sql: str, params: dict[str, object]) -> list[dict[str, Any]]:
    return store.sql(f"""
WITH {_cte(_EVENTS_CTE, ranks_sql)},
peaks AS (SELECT rank, source, device, max(allocated) AS peak FROM curve GROUP BY ALL),
at_peak AS (
  SELECT c.rank, c.source, c.device, min(c.seq) AS peak_seq
  FROM curve c JOIN peaks p USING (rank, source, device) WHERE c.allocated = p.peak GROUP BY ALL),
oom AS (SELECT rank, source, device, min(seq) AS oom_seq FROM ev WHERE action = 'oom' GROUP BY ALL)
SELECT s.rank, s.source, s.device, n.events, p.peak AS peak_allocated_bytes, a.peak_seq,
       c.ts_ns AS peak_ts_ns, c.reserved AS reserved_at_peak_bytes, s.reserved_end, s.segments,
       b.allocated_end, b.largest_free, o.oom_seq, oc.size AS oom_request, oc.address AS oom_device_free,
       oc.allocated AS oom_allocated, oc.reserved AS oom_reserved, oc.ts_ns AS oom_ts_ns,
       (SELECT count(*) FROM ev e WHERE e.rank = s.rank AND e.source = s.source AND e.device = s.device
                                     AND e.seq > o.oom_seq) AS events_after_oom,
       EXISTS (SELECT 1 FROM ev e JOIN snapshot_stacks k ON k.rank = e.rank AND k.source = e.source
                                                          AND k.stack_id = e.stack_id
               WHERE k.run = $run AND e.rank = s.rank AND e.source = s.source AND e.device = s.device
                 AND {BACKWARD_FRAME_SQL}) AS backward_seen
FROM segments_end s LEFT JOIN net n USING (rank, source, device) LEFT JOIN peaks p USING (rank, source, device)
LEFT JOIN at_peak a USING (rank, source, device) LEFT JOIN blocks_end b USING (rank, source, device)
LEFT JOIN curve c ON c.rank = s.rank AND c.source = s.source AND c.device = s.device AND c.seq = a.peak_seq
LEFT JOIN oom o USING (rank, source, device)
LEFT JOIN curve oc ON oc.rank = s.rank AND oc.source = s.source AND oc.device = s.device AND oc.seq = o.oom_seq
ORDER BY s.rank, s.source, s.device""", params).to_pylist()


def _curves(store: SQLStore, ranks_sql: str, params: dict[str, object]) -> dict[tuple, list[dict[str, Any]]]:
    rows = store.sql(f"""
WITH {_cte(_EVENTS_CTE, ranks_sql)},
b AS (SELECT *, (seq * {CURVE_BUCKETS}) // n.events AS bucket FROM curve JOIN net n USING (rank, source, device))
SELECT rank, source, device, bucket, min(seq) AS seq, min(ts_ns) AS ts_ns, min(allocated) AS allocated_min,
       max(allocated) AS allocated_max, max(reserved) AS reserved_max
FROM b GROUP BY ALL ORDER BY rank, source, device, bucket""", params).to_pylist()
    out: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        key = (r.pop("rank"), r.pop("source"), r.pop("device"))
        r.pop("bucket")
        r["ts_ns"] = _known(r["ts_ns"], NO_TIMES)
        out.setdefault(key, []).append(r)
    return out


def _user_frames(store: SQLStore, ranks_sql: str, params: dict[str, object]) -> dict[tuple, dict[str, Any]]:
    rows = store.sql(f"""
SELECT rank, source, stack_id, arg_min(file, depth) AS file, arg_min(line, depth) AS line,
       arg_min(function, depth) AS function
FROM snapshot_stacks WHERE run = $run AND {ranks_sql} AND {USER_FRAME_SQL} GROUP BY ALL""", params).to_pylist()
    return {(r["rank"], r["source"], r["stack_id"]): r for r in rows}


def _frame_label(frame: dict[str, Any] | None, stack_id: int | None) -> str:
    if stack_id is None:
        return NO_STACK
    if frame is None:
        return NO_USER_FRAME
    short = frame["file"].replace("\\", "/").rsplit("/", 1)[-1]
    return f"{short}:{frame['line']} ({frame['function']})"


def _live(store: SQLStore, ranks_sql: str, params: dict[str, object],
          cuts: list[tuple[int, str, int, int, str]]) -> list[dict[str, Any]]:
    """Allocations live at each cut ``(rank, source, device, seq, kind)``, by stack, with the
    memory role of their address where the collector recorded one, and whether each is an
    activation (made in the forward, freed in the backward)."""
    if not cuts:
        return []
    e_ranks_sql = rank_filter(list(params["ranks"]) if "ranks" in params else None, "e.rank")[0]  # type: ignore[call-overload]
    values = ", ".join(f"({int(r)}, '{str(s)}', {int(d)}, {int(q)}, '{k}')" for r, s, d, q, k in cuts
                       if str(s).isalnum() and k.isalnum())
    return store.sql(f"""
WITH {_cte(_ALLOCS_CTE, ranks_sql)},
cuts(rank, source, device, cut, kind) AS (VALUES {values}),
backward AS (SELECT rank, source, stack_id, bool_or({BACKWARD_FRAME_SQL}) AS backward
             FROM snapshot_stacks WHERE run = $run AND {ranks_sql} GROUP BY ALL),
phase AS (
  SELECT e.rank, e.source, e.device, e.seq,
         last_value(k.backward IGNORE NULLS)
           OVER (PARTITION BY e.rank, e.source, e.device ORDER BY e.seq ROWS UNBOUNDED PRECEDING) AS in_backward
  FROM snapshot_events e LEFT JOIN backward k USING (rank, source, stack_id)
  WHERE e.run = $run AND {e_ranks_sql}),
roles AS (SELECT rank, addr, any_value(role) AS role FROM memory_roles WHERE run = $run AND {ranks_sql} GROUP BY ALL)
SELECT c.kind, a.rank, a.source, a.device, a.stack_id, r.role,
       coalesce(NOT coalesce(k.backward, false) AND a.stack_id IS NOT NULL AND f.in_backward, false) AS activation,
       CAST(sum(a.size) AS BIGINT) AS bytes, count(*) AS allocations
FROM allocs a JOIN cuts c USING (rank, source, device)
LEFT JOIN backward k USING (rank, source, stack_id)
LEFT JOIN phase f ON f.rank = a.rank AND f.source = a.source AND f.device = a.device AND f.seq = a.freed_seq
LEFT JOIN roles r ON r.rank = a.rank AND r.addr = a.address
WHERE a.seq <= c.cut AND (a.freed_seq IS NULL OR a.freed_seq > c.cut)
GROUP BY ALL""", params).to_pylist()


def _groups(rows: list[dict[str, Any]], key: Any, total: int | None, top: int | None = TOP_FRAMES) -> list[dict[str, Any]]:
    """Rows summed by ``key(row)``, largest first, the first ``top`` and the rest as one (all
    when ``top`` is None); ``total`` (the allocated bytes at the cut) adds what no recorded
    allocation explains."""
    sums: dict[str, list[int]] = {}
    for r in rows:
        s = sums.setdefault(key(r), [0, 0])
        s[0] += r["bytes"]
        s[1] += r["allocations"]
    ordered = sorted(sums.items(), key=lambda kv: (-kv[1][0], kv[0]))
    out = [{"frame": k, "bytes": v[0], "allocations": v[1]} for k, v in ordered[:top]]
    rest = ordered[top:] if top is not None else []
    if rest:
        out.append({"frame": f"({len(rest)} other frames)", "bytes": sum(v[0] for _, v in rest),
                    "allocations": sum(v[1] for _, v in rest)})
    if total is not None:
        before = total - sum(v[0] for v in sums.values())
        if before:
            out.append({"frame": BEFORE_HISTORY, "bytes": before,
                        "allocations": Absent("allocated before the history began: not recorded")})
    return out


@section("snapshot", order=75, to_json=lambda result: {"snapshots": list(result.snapshots)})
def snapshot_section(store: SQLStore, run: str, ranks: Sequence[int] | None) -> Maybe[SnapshotMemory]:
    """What filled the memory, per ingested memory snapshot: the exact allocated curve, its peak
    and what was live at it by user frame (and role), reserved against allocated, the OOM."""
    return _snapshot_memory(store, run, ranks, TOP_FRAMES)


def every_frame_at_peak(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[SnapshotMemory]:
    """``snapshot_section``'s records with every user frame live at the peak and at the OOM
    listed, none summed as "other frames" (what comparing two snapshots needs)."""
    return _snapshot_memory(store, run, ranks, None)


def _snapshot_memory(store: SQLStore, run: str, ranks: Sequence[int] | None, top: int | None) -> Maybe[SnapshotMemory]:
    ranks_sql, rank_params = rank_filter(ranks)
    params = {"run": run, **rank_params}
    snapshots = _snapshot_rows(store, ranks_sql, params)
    if not snapshots:
        return Absent(NO_SNAPSHOT)
    curves = _curves(store, ranks_sql, params)
    frames = _user_frames(store, ranks_sql, params)
    cuts = [(s["rank"], s["source"], s["device"], s["peak_seq"], "peak") for s in snapshots if s["peak_seq"] is not None]
    cuts += [(s["rank"], s["source"], s["device"], s["oom_seq"], "oom") for s in snapshots if s["oom_seq"] is not None]
    live = _live(store, ranks_sql, params, cuts)
    roles_ranks = {r["rank"] for r in store.sql(
        f"SELECT DISTINCT rank FROM memory_roles WHERE run = $run AND {ranks_sql}", params).to_pylist()}
    return SnapshotMemory(tuple(_record(s, curves, frames, live, roles_ranks, top) for s in snapshots))


def _record(s: dict[str, Any], curves: dict, frames: dict, live: list[dict[str, Any]],
            roles_ranks: set[int], top: int | None) -> dict[str, Any]:
    key = (s["rank"], s["source"], s["device"])

    def label(r: dict[str, Any]) -> str:
        return _frame_label(frames.get((r["rank"], r["source"], r["stack_id"])), r["stack_id"])

    def at(kind: str) -> list[dict[str, Any]]:
        return [r for r in live if (r["rank"], r["source"], r["device"]) == key and r["kind"] == kind]

    peak_live = at("peak")
    reserved, allocated = s["reserved_end"], s["allocated_end"] or 0
    record: dict[str, Any] = {
        "rank": s["rank"], "source": s["source"], "device": s["device"], "events": s["events"] or 0,
        "basis": "allocator blocks (sizes as rounded by the allocator), exact at every history event",
        "peak_allocated_bytes": s["peak_allocated_bytes"], "peak_seq": s["peak_seq"], "peak_ts_ns": _known(s["peak_ts_ns"], NO_TIMES),
        "reserved_at_peak_bytes": s["reserved_at_peak_bytes"],
        "curve": curves.get(key, []),
        "live_at_peak": _groups(peak_live, label, s["peak_allocated_bytes"], top) if s["peak_seq"] is not None else None,
        "live_at_peak_by_role": (_groups(peak_live, lambda r: r["role"] or "other", None)
                                 if s["rank"] in roles_ranks and s["peak_seq"] is not None else None),
        "activations_at_peak": (_activations(peak_live, label) if s["peak_seq"] is not None and s["backward_seen"]
                                else None),
        "reserved": {"basis": "the snapshot's segments and blocks, when it was taken",
                     "reserved_bytes": reserved, "allocated_bytes": allocated,
                     "reserved_unallocated_bytes": reserved - allocated, "segments": s["segments"],
                     "largest_free_block_bytes": s["largest_free"],
                     "failed_request_bytes": s["oom_request"]},
        "oom": _oom(s, at("oom"), label) if s["oom_seq"] is not None else None,
    }
    reasons = {}
    if s["peak_seq"] is None:
        reasons.update(peak_allocated_bytes="the snapshot holds no history", peak_seq="the snapshot holds no history",
                       live_at_peak="the snapshot holds no history", activations_at_peak="the snapshot holds no history")
    elif not s["backward_seen"]:
        reasons["activations_at_peak"] = NO_BACKWARD
    if record["live_at_peak_by_role"] is None:
        reasons["live_at_peak_by_role"] = NO_ROLES
    if record["oom"] is None:
        reasons["oom"] = NO_OOM
        record["reserved"]["absent_reasons"] = {"failed_request_bytes": NO_OOM}
    if s["largest_free"] is None:
        record["reserved"].setdefault("absent_reasons", {})["largest_free_block_bytes"] = NO_FREE_BLOCK
    if reasons:
        record["absent_reasons"] = reasons
    return record


def _known(value: Any, reason: str) -> Any:
    """``value``, or ``Absent(reason)`` when the snapshot does not hold it (never a 0)."""
    return Absent(reason) if value is None else value


def _activations(peak_live: list[dict[str, Any]], label: Any) -> dict[str, Any]:
    held = [r for r in peak_live if r["activation"]]
    return {"bytes": sum(r["bytes"] for r in held), "by_frame": _groups(held, label, None)}


def _oom(s: dict[str, Any], oom_live: list[dict[str, Any]], label: Any) -> dict[str, Any]:
    request, device_free = s["oom_request"], s["oom_device_free"]
    cached_free = s["oom_reserved"] - s["oom_allocated"]
    cause = "fragmentation" if cached_free + (device_free or 0) >= request else "live data"  # no free bytes known: 0
    return {"seq": s["oom_seq"], "ts_ns": _known(s["oom_ts_ns"], NO_TIMES), "request_bytes": request,
            "device_free_bytes": _known(device_free, "the oom entry records no free bytes"),
            "allocated_bytes": s["oom_allocated"],
            "reserved_bytes": s["oom_reserved"], "reserved_unallocated_bytes": cached_free,
            "largest_free_block_bytes": _known(s["largest_free"], NO_FREE_BLOCK),
            "events_after_oom": s["events_after_oom"],
            "cause": cause, "live_by_frame": _groups(oom_live, label, s["oom_allocated"])}


def _bytes(value: Any) -> int | None:
    return None if isinstance(value, Absent) else value


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


def _holders(groups: list[dict[str, Any]], top: int = 3) -> str:
    return ", ".join(f"{g['frame']} {_gib(g['bytes'])}" for g in groups[:top])


def _snapshots(results: Results) -> Iterator[dict[str, Any]]:
    result = results["snapshot"]
    assert isinstance(result, SnapshotMemory)
    yield from result.snapshots


@rule("memory.oom", needs=("snapshot",))
def memory_oom(results: Results) -> Iterator[Finding]:
    """The history holds an ``oom``: the request, the free and reserved bytes then, what was live
    by user frame, and whether fragmentation or live data caused it."""
    for s in _snapshots(results):
        oom = s["oom"]
        if oom is None:
            continue
        why = (f"fragmentation: {_gib(oom['reserved_unallocated_bytes'])} reserved but unallocated and "
               f"{_gib(_bytes(oom['device_free_bytes']) or 0)} free on the device would have held it, not in one piece"
               if oom["cause"] == "fragmentation" else
               f"live data: {_gib(oom['allocated_bytes'])} allocated left {_gib(oom['reserved_unallocated_bytes'])} "
               f"reserved-unallocated and {_gib(_bytes(oom['device_free_bytes']) or 0)} free on the device")
        yield Finding(Severity.CRITICAL, "memory.oom",
                      f"rank {s['rank']} ran out of memory on device {s['device']}: a request of "
                      f"{_gib(oom['request_bytes'])} failed ({why}); live then: {_holders(oom['live_by_frame'])}",
                      {"device": s["device"], "request_bytes": oom["request_bytes"],
                       "device_free_bytes": _bytes(oom["device_free_bytes"]), "reserved_bytes": oom["reserved_bytes"],
                       "allocated_bytes": oom["allocated_bytes"], "cause": oom["cause"],
                       "largest_free_block_bytes": _bytes(oom["largest_free_block_bytes"]),
                       "frames": [g["frame"] for g in oom["live_by_frame"]],
                       "frame_bytes": [g["bytes"] for g in oom["live_by_frame"]]},
                      ranks=(s["rank"],), leads=True)


@rule("memory.fragmentation", needs=("snapshot",))
def memory_fragmentation(results: Results) -> Iterator[Finding]:
    """Reserved but unallocated bytes at the peak: a share of reserved the allocator could not use."""
    for s in _snapshots(results):
        reserved, peak = s["reserved_at_peak_bytes"], s["peak_allocated_bytes"]
        if reserved is None or peak is None:
            continue
        unused = reserved - peak
        if unused < FRAGMENTATION_MIN_BYTES or unused < FRAGMENTATION_SHARE * reserved:
            continue
        yield Finding(Severity.WARNING, "memory.fragmentation",
                      f"rank {s['rank']} device {s['device']}: at the peak {_gib(unused)} of {_gib(reserved)} "
                      f"reserved was not allocated ({100 * unused / reserved:.0f}%); live at the peak: "
                      f"{_holders(s['live_at_peak'])}",
                      {"device": s["device"], "bytes": unused, "reserved_bytes": reserved, "peak_allocated_bytes": peak,
                       "frames": [g["frame"] for g in s["live_at_peak"]]}, ranks=(s["rank"],))


@rule("memory.activations", needs=("snapshot",))
def memory_activations(results: Results) -> Iterator[Finding]:
    """Live memory at the peak that was allocated in the forward and freed in the backward."""
    for s in _snapshots(results):
        acts, peak = s["activations_at_peak"], s["peak_allocated_bytes"]
        if not acts or not peak or acts["bytes"] < ACTIVATIONS_SHARE * peak:
            continue
        yield Finding(Severity.INFO, "memory.activations",
                      f"rank {s['rank']} device {s['device']}: {_gib(acts['bytes'])} of the {_gib(peak)} peak "
                      f"({100 * acts['bytes'] / peak:.0f}%) are activations (allocated in the forward, freed in "
                      f"the backward): {_holders(acts['by_frame'])}; activation checkpointing trades them for "
                      "recomputation",
                      {"device": s["device"], "bytes": acts["bytes"], "peak_allocated_bytes": peak,
                       "frames": [g["frame"] for g in acts["by_frame"]],
                       "frame_bytes": [g["bytes"] for g in acts["by_frame"]]}, ranks=(s["rank"],))


def snapshot_segments(store: SQLStore, run: str, ranks: Sequence[int] | None = None) -> Maybe[Any]:
    """The allocator's segments when the snapshot was taken, one row each (largest first):
    reserved (``total_size``), allocated (blocks not ``inactive``), free, the largest free block,
    the blocks, and whether the segment is expandable. The Memory page draws them."""
    ranks_sql, rank_params = rank_filter(ranks)
    s_ranks_sql = rank_filter(ranks, "s.rank")[0]
    params = {"run": run, **rank_params}
    table = store.sql(f"""
WITH b AS (
  SELECT rank, source, device, segment_address,
         CAST(coalesce(sum(size) FILTER (WHERE state <> 'inactive'), 0) AS BIGINT) AS allocated_bytes,
         max(size) FILTER (WHERE state = 'inactive') AS largest_free_block_bytes, count(*) AS blocks
  FROM snapshot_blocks WHERE run = $run AND {ranks_sql} GROUP BY ALL)
SELECT s.rank, s.source, s.device, s.address, s.total_size AS reserved_bytes,
       coalesce(b.allocated_bytes, 0) AS allocated_bytes, s.total_size - coalesce(b.allocated_bytes, 0) AS free_bytes,
       b.largest_free_block_bytes, coalesce(b.blocks, 0) AS blocks, s.segment_type, s.is_expandable
FROM snapshot_segments s LEFT JOIN b ON b.rank = s.rank AND b.source = s.source AND b.device = s.device
                                     AND b.segment_address = s.address
WHERE s.run = $run AND {s_ranks_sql}
ORDER BY s.rank, s.source, s.device, s.total_size DESC, s.address""", params)
    return Absent(NO_SNAPSHOT) if table.num_rows == 0 else table
