"""A read snapshot as the store's four snapshot tables (docs/STORE.md, "Memory snapshots").

Segments and blocks come from the snapshot's state at the moment it was taken, the events from
its history (``reader.History``), and the stacks of all three are kept once each. Formats since
torch 2.0 differ in what they name and where: 2.0 blocks have no ``address`` (it is the
segment's address plus the sizes of the blocks before it, as pytorch.org/memory_viz computes
it) and keep their stack and requested size in ``history[-1]`` (``frames``, ``real_size``);
later ones have ``address``, ``requested_size`` and ``frames`` on the block. History entries
without ``time_us`` (2.0) have a null ``ts_ns``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from stepscope.store import schema
from stepscope.store.snapshot.reader import NO_STACK, History, SnapshotRead, Stacks

NS_PER_US = 1000


def snapshot_tables(read: SnapshotRead, source: str) -> dict[str, pa.Table]:
    """The four tables of one snapshot, each row under ``source``. Segments and blocks go
    first: their stacks join the same table of stacks as the history's."""
    segments, blocks = _segments_and_blocks(read.snapshot, read.stacks)
    read.stacks.release()
    tables = {
        "snapshot_segments": _table(schema.SNAPSHOT_SEGMENTS, segments, source),
        "snapshot_blocks": _table(schema.SNAPSHOT_BLOCKS, blocks, source),
        "snapshot_events": _events(read.history, source),
        "snapshot_stacks": _stacks(read.stacks, source),
    }
    return tables


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if type(value) is not list:
        raise TypeError(f"{what} is not a list")
    return value


def _dict(value: Any, what: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise TypeError(f"{what} is not an object")
    return value


def _int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int and type(value) is not bool:
        raise TypeError(f"{what} is not an integer")
    return int(value)


def _str(value: Any, what: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"{what} is not a string")


def _stack(stacks: Stacks, frames: Any) -> int | None:
    found = stacks.stack_id(frames)
    return None if found == NO_STACK else found


def _segments_and_blocks(snapshot: dict[str, Any], stacks: Stacks) -> tuple[list[dict], list[dict]]:
    segments: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    for seg in _list(snapshot.get("segments"), "segments"):
        seg = _dict(seg, "a segment")
        device, address = _int(seg.get("device"), "a segment's device"), _int(seg.get("address"), "a segment's address")
        pool = seg.get("segment_pool_id")
        segments.append({
            "device": device, "address": address,
            "total_size": _int(seg.get("total_size"), "a segment's total_size"),
            "allocated_size": _int(seg.get("allocated_size"), "a segment's allocated_size"),
            "active_size": _int(seg.get("active_size"), "a segment's active_size"),
            "requested_size": _int(seg.get("requested_size"), "a segment's requested_size"),
            "stream": _int(seg.get("stream"), "a segment's stream"),
            "segment_type": _str(seg.get("segment_type"), "a segment's segment_type"),
            "segment_pool": None if pool is None else ",".join(str(_int(p, "a segment pool id")) for p in pool),
            "is_expandable": None if seg.get("is_expandable") is None else bool(seg.get("is_expandable")),
            "stack_id": _stack(stacks, seg.get("frames")),
        })
        next_address = address
        for block in _list(seg.get("blocks"), "a segment's blocks"):
            block = _dict(block, "a block")
            size = _int(block.get("size"), "a block's size")
            history = _list(block.get("history"), "a block's history")  # torch 2.0
            last = _dict(history[-1], "a block's history entry") if history else {}
            block_address = _int(block.get("address"), "a block's address")
            if block_address is None:
                block_address = next_address
            requested = block.get("requested_size", last.get("real_size"))
            blocks.append({
                "device": device, "segment_address": address, "address": block_address, "size": size,
                "requested_size": _int(requested, "a block's requested_size"),
                "state": _str(block.get("state"), "a block's state"),
                "stack_id": _stack(stacks, block["frames"] if "frames" in block else last.get("frames")),
            })
            next_address = None if block_address is None or size is None else block_address + size
    return segments, blocks


def _table(spec: pa.Schema, rows: list[dict[str, Any]], source: str) -> pa.Table:
    columns = {f.name: [r[f.name] for r in rows] for f in spec if f.name != "source"}
    columns["source"] = [source] * len(rows)
    return pa.table({f.name: pa.array(columns[f.name], f.type.value_type if pa.types.is_dictionary(f.type)
                                      else f.type) for f in spec}).cast(spec)


def _events(history: History, source: str) -> pa.Table:
    n = len(history)
    devices = [pa.repeat(pa.scalar(device, pa.int64()), rows) for device, rows in enumerate(history.device_rows)]
    device = pa.concat_arrays(devices) if devices else pa.array([], pa.int64())
    seq = pa.concat_arrays([pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), rows)), 1)
                            for rows in history.device_rows if rows] or [pa.array([], pa.int64())])
    codes = history.column("action")
    action = pa.DictionaryArray.from_arrays(codes.cast(pa.int32()), pa.array(history.actions, pa.string()))
    stack = history.column("stack")
    stack = pc.if_else(pc.equal(stack, NO_STACK), pa.scalar(None, pa.int64()), stack)
    table = pa.table({
        "source": pa.repeat(pa.scalar(source, pa.string()), n),
        "device": device, "seq": seq, "action": action,
        "address": history.column("address"), "size": history.column("size"),
        "stream": history.column("stream"),
        "ts_ns": pc.multiply_checked(history.column("time_us"), NS_PER_US),
        "stack_id": stack,
    })
    return table.cast(schema.SNAPSHOT_EVENTS)


def _stacks(stacks: Stacks, source: str) -> pa.Table:
    rows = [{"stack_id": sid, "depth": depth, "file": f[0], "line": f[1], "function": f[2]}
            for sid, frames in enumerate(stacks.frames) for depth, f in enumerate(frames)]
    return _table(schema.SNAPSHOT_STACKS, rows, source)
