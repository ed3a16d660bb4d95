"""CUDA memory snapshots: recorded around the profiled window, read safely, stored as a table.

``torch.cuda.memory._snapshot()`` gives the caching allocator's segments and blocks (with the
stack that allocated each) and a ring buffer of alloc/free events. It is saved as a pickle, and a
pickle can run arbitrary code when loaded, so a snapshot file is only ever read with
``SnapshotUnpickler``, which refuses every global; it lives in the store
(``stepscope.store.snapshot.unpickle``, the one place snapshots are unpickled, also for
``stepscope ingest x.pickle``) and is re-exported here.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow as pa

from stepscope.errors import TraceFormatError
from stepscope.store.schema import MEMORY_SNAPSHOT
from stepscope.store.snapshot.unpickle import SnapshotUnpickler, load_snapshot

__all__ = ["HISTORY_MAX_ENTRIES", "SnapshotRecorder", "SnapshotUnpickler", "load_snapshot", "snapshot_table"]

log = logging.getLogger("stepscope.collector")

HISTORY_MAX_ENTRIES = 100_000
"""Ring-buffer size for alloc/free history: bounded, since each entry holds a stack."""


def _list_of_dicts(value: Any, what: str, origin: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise TraceFormatError(origin, f"not a memory snapshot ({what} is not a list of objects)")
    return value


def snapshot_table(snapshot: dict[str, Any], source: str, origin: str = "memory snapshot") -> pa.Table:
    """Segments, blocks and alloc/free history of ``snapshot`` as a ``memory_snapshot`` table.

    One row per segment (``record='segment'``), per block (``'block'``, ``state`` set) and per
    history entry (``'trace'``, ``action`` and ``ts_ns`` set). ``frames`` is the allocation stack
    as JSON ``[[filename, line, name], ...]``, innermost first, as recorded. A malformed snapshot
    (wrong shapes, values of the wrong type or out of range) raises ``TraceFormatError`` naming
    ``origin``, and only that.
    """
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        raise TraceFormatError(origin, "not a memory snapshot (no list of 'segments')")
    try:
        return _table(snapshot, source, origin)
    except (TypeError, ValueError, OverflowError, RecursionError, pa.ArrowException) as exc:
        raise TraceFormatError(origin, f"not a memory snapshot ({type(exc).__name__}: {exc})") from exc


def _table(snapshot: dict[str, Any], source: str, origin: str) -> pa.Table:
    cols: dict[str, list[Any]] = {name: [] for name in MEMORY_SNAPSHOT.names}

    def add(**row: Any) -> None:
        for name in cols:
            cols[name].append(row.get(name))

    for seg in _list_of_dicts(snapshot["segments"], "segments", origin):
        seg_addr = seg.get("address")
        add(record="segment", device=seg.get("device"), addr=seg_addr,
            bytes=seg.get("total_size"), requested_bytes=seg.get("requested_size"),
            stream=seg.get("stream"), segment_addr=seg_addr,
            segment_type=seg.get("segment_type"), frames=_frames(seg.get("frames"), origin))
        for block in _list_of_dicts(seg.get("blocks"), "a segment's blocks", origin):
            add(record="block", device=seg.get("device"), state=block.get("state"),
                addr=block.get("address"), bytes=block.get("size"),
                requested_bytes=block.get("requested_size"), stream=seg.get("stream"),
                segment_addr=seg_addr, segment_type=seg.get("segment_type"),
                frames=_frames(block.get("frames"), origin))
    traces = snapshot.get("device_traces") or []
    if not isinstance(traces, list):
        raise TraceFormatError(origin, "not a memory snapshot (device_traces is not a list)")
    for device, entries in enumerate(traces):
        for entry in _list_of_dicts(entries, "a device trace", origin):
            time_us = entry.get("time_us")
            add(record="trace", device=device, action=entry.get("action"),
                ts_ns=None if time_us is None else int(time_us) * 1000, addr=entry.get("addr"),
                bytes=entry.get("size"), stream=entry.get("stream"),
                frames=_frames(entry.get("frames"), origin))
    cols["source"] = [source] * len(cols["record"])
    arrays = [pa.array(cols[f.name], type=f.type.value_type if pa.types.is_dictionary(f.type)
                       else f.type) for f in MEMORY_SNAPSHOT]
    return pa.Table.from_arrays(arrays, names=MEMORY_SNAPSHOT.names).cast(MEMORY_SNAPSHOT)


def _frames(frames: Any, origin: str) -> str | None:
    if not frames:
        return None
    return json.dumps([[f.get("filename"), f.get("line"), f.get("name")]
                       for f in _list_of_dicts(frames, "frames", origin)], default=str)


class SnapshotRecorder:
    """Turns allocator history on for the profiled window and takes the snapshot at its end.

    Only on CUDA (the CPU build has no allocator history). ``take()`` runs on the training
    thread because it must see the allocator as it is now; turning the dict into a table is left
    to the background writer.
    """

    def __init__(self) -> None:
        import torch

        self._memory = torch.cuda.memory
        self.recording = False

    def start(self) -> None:
        if not self.recording:
            self._memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                max_entries=HISTORY_MAX_ENTRIES)
            self.recording = True

    def take(self) -> dict[str, Any]:
        """The snapshot now; recording stops until the next ``start()``."""
        try:
            return self._memory._snapshot()
        finally:
            self.stop()

    def stop(self) -> None:
        if self.recording:
            self._memory._record_memory_history(enabled=None)
            self.recording = False
